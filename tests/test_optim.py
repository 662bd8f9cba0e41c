"""tdtree.optim: pure sgd, adam, adamw and clip_grad_norm agree with torch.optim / torch.nn.utils step for step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import tdtree as tt
from tdtree.nn import from_module, functional_call
from tdtree.optim import AdamState, adam, adam_init, adamw, clip_grad_norm, sgd
from tdtree.testing import assert_close, assert_equal


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def detached(module: nn.Module) -> tt.TensorDict:
    return tt.tree.map(lambda p: p.detach().clone(), from_module(module))


def run(
    make_opt: Callable[[Any], torch.optim.Optimizer],
    step: Callable[[tt.TensorDict, tt.TensorDict, Any], tuple[tt.TensorDict, Any]],
    state: Callable[[tt.TensorDict], Any],
) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(32, 6), torch.randn(32, 2)
    model = Net()
    params = detached(model)
    opt_state = state(params)
    opt = make_opt(model.parameters())

    def loss(p: tt.TensorDict) -> torch.Tensor:
        return ((functional_call(model, p, x) - y) ** 2).mean()

    for _ in range(20):
        grads = torch.func.grad(loss)(params)
        params, opt_state = step(params, grads, opt_state)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        assert_close(params, detached(model))


def test_sgd_matches_torch() -> None:
    run(lambda ps: torch.optim.SGD(ps, lr=0.1), lambda p, g, s: sgd(p, g, 0.1), lambda p: None)


def test_sgd_momentum_matches_torch() -> None:
    run(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        lambda p, g, s: sgd(p, g, 0.05, momentum=0.9, momentum_state=s),
        lambda p: None,
    )


def test_adam_matches_torch() -> None:
    run(lambda ps: torch.optim.Adam(ps, lr=1e-2), lambda p, g, s: adam(p, g, s, lr=1e-2), adam_init)


def test_adam_matches_torch_other_hyperparameters() -> None:
    run(
        lambda ps: torch.optim.Adam(ps, lr=3e-3, betas=(0.8, 0.99), eps=1e-6),
        lambda p, g, s: adam(p, g, s, lr=3e-3, betas=(0.8, 0.99), eps=1e-6),
        adam_init,
    )


def params_and_grads() -> tuple[tt.TensorDict, tt.TensorDict]:
    torch.manual_seed(2)
    p = tt.TensorDict({"w": torch.randn(3, 2), "sub": {"b": torch.randn(2)}})
    g = tt.TensorDict({"w": torch.randn(3, 2), "sub": {"b": torch.randn(2)}})
    return p, g


def test_sgd_values_and_state() -> None:
    p, g = params_and_grads()
    new, state = sgd(p, g, 0.5)
    assert state is None
    assert_equal(new, tt.TensorDict({"w": p["w"] - 0.5 * g["w"], "sub": {"b": p["sub", "b"] - 0.5 * g["sub", "b"]}}))
    new, buf = sgd(p, g, 0.5, momentum=0.9)
    assert_equal(buf, g)
    new2, buf2 = sgd(new, g, 0.5, momentum=0.9, momentum_state=buf)
    assert_close(buf2["w"], 1.9 * g["w"])
    assert_close(new2["w"], p["w"] - 0.5 * g["w"] - 0.5 * 1.9 * g["w"])


def test_adam_init_and_first_step() -> None:
    p, g = params_and_grads()
    state = adam_init(p)
    assert isinstance(state, AdamState)
    assert state.step.shape == () and state.step.dtype == torch.float32 and state.step.item() == 0
    assert_equal(state.exp_avg, tt.tree.map(torch.zeros_like, p))
    assert_equal(state.exp_avg_sq, tt.tree.map(torch.zeros_like, p))
    new, state = adam(p, g, state, lr=0.1)
    assert state.step.item() == 1
    # the first Adam step moves every entry by lr against the sign of its gradient
    assert_close(new["w"], p["w"] - 0.1 * torch.sign(g["w"]), atol=1e-6, rtol=0)
    assert_close(state.exp_avg["sub", "b"], 0.1 * g["sub", "b"])


@pytest.mark.parametrize("which", ["sgd", "momentum", "adam"])
def test_inputs_unchanged(which: str) -> None:
    p, g = params_and_grads()
    leaves = tt.tree.leaves(p) + tt.tree.leaves(g)
    versions = [t._version for t in leaves]
    copies = [t.clone() for t in leaves]
    if which == "sgd":
        new, _ = sgd(p, g, 0.1)
    elif which == "momentum":
        _, buf = sgd(p, g, 0.1, momentum=0.9)
        new, _ = sgd(p, g, 0.1, momentum=0.9, momentum_state=buf)
    else:
        state = adam_init(p)
        new, _ = adam(p, g, state)
        assert state.step.item() == 0
    after = tt.tree.leaves(p) + tt.tree.leaves(g)
    assert all(a is b for a, b in zip(after, leaves))
    assert [t._version for t in after] == versions
    assert all(torch.equal(a, c) for a, c in zip(after, copies))
    assert tt.tree.structure(new) == tt.tree.structure(p)


def test_parameters_in_give_results_without_autograd_history() -> None:
    model = Net()
    p = from_module(model)
    g = tt.tree.map(torch.ones_like, p)
    new, state = adam(p, g, adam_init(p))
    assert not any(t.requires_grad for t in tt.tree.leaves(new) + tt.tree.leaves(state.exp_avg))
    new, _ = sgd(p, g, 0.1, momentum=0.9)
    assert not any(t.requires_grad or t.grad_fn is not None for t in tt.tree.leaves(new))


def test_locked_params_give_untagged_results() -> None:
    p, g = params_and_grads()
    locked = p.lock()
    new, _ = sgd(locked, g, 0.1)
    assert new.tags == frozenset() and new["sub"].tags == frozenset()
    new, state = adam(locked, g, adam_init(locked))
    assert new.tags == frozenset() and state.exp_avg.tags == frozenset()
    assert adam_init(locked).exp_avg.tags == frozenset()


def test_structure_mismatch_errors() -> None:
    p, g = params_and_grads()
    with pytest.raises(ValueError, match=r"grads has 1 leaves for 2 parameters"):
        sgd(p, g.exclude("sub"), 0.1)
    with pytest.raises(ValueError, match=r"exp_avg has 1 leaves for 2 parameters"):
        adam(p, g, AdamState(torch.zeros(()), g.exclude("w"), g))
    with pytest.raises(ValueError, match=r"momentum_state has 3 leaves for 2 parameters"):
        sgd(p, g, 0.1, momentum=0.9, momentum_state=g.set("extra", torch.zeros(())))


def test_sgd_first_momentum_buffer_is_a_copy_of_the_gradients() -> None:
    p = tt.TensorDict({"w": torch.ones(3), "n": {"b": torch.zeros(2)}})
    g = tt.TensorDict({"w": torch.full((3,), 2.0), "n": {"b": torch.ones(2)}})
    _, buf = sgd(p, g, 0.1, momentum=0.9)
    torch.testing.assert_close(buf.to_dict(), g.to_dict())
    for key in (("w",), ("n", "b")):
        assert buf[key].data_ptr() != g[key].data_ptr()
    g.update_({"w": torch.zeros(3)})  # the caller reuses its gradient buffer
    torch.testing.assert_close(buf["w"], torch.full((3,), 2.0))


@pytest.mark.parametrize("which", ["sgd", "adam"])
def test_steps_over_dicts_and_mixed_trees_equal_the_steps_over_nodes(which: str) -> None:
    """Nodes are walked directly and other trees through optree: the same leaves in the same order."""
    p, g = params_and_grads()
    pd, gd = p.to_dict(), g.to_dict()

    def step(params: Any, grads: Any) -> tuple[Any, Any]:
        if which == "sgd":
            first = sgd(params, grads, 0.1, momentum=0.9)
            return sgd(params, grads, 0.1, momentum=0.9, momentum_state=first[1])
        return adam(params, grads, adam_init(params), lr=0.1)

    on_nodes, node_state = step(p, g)
    on_dicts, dict_state = step(pd, gd)
    assert type(on_dicts) is dict and type(on_dicts["sub"]) is dict
    assert_close(tt.TensorDict(on_dicts), on_nodes)
    mixed, _ = step(p, gd)  # node parameters, gradients as a dict of the same keys
    assert type(mixed) is tt.TensorDict
    assert_close(mixed, on_nodes)
    # by hand: the second SGD step's buffer is 0.9 g + g; Adam's first step moves each weight by lr * sign(g)
    expected = p["w"] - 0.1 * (0.9 * g["w"] + g["w"]) if which == "sgd" else p["w"] - 0.1 * g["w"].sign()
    torch.testing.assert_close(on_dicts["w"], expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(tt.tree.leaves(dict_state), tt.tree.leaves(node_state), strict=True):
        torch.testing.assert_close(a, b)


# -- bitwise against torch.optim over 100 steps -------------------------------------------------


def mlp(dtype: torch.dtype, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2)).to(dtype)


TORCH_OPTIMS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "adam": (torch.optim.Adam, adam, {"lr": 1e-2}),
    "adam_l2": (torch.optim.Adam, adam, {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    "adamw": (torch.optim.AdamW, adamw, {"lr": 1e-2, "weight_decay": 0.1}),
    "adamw_default_decay": (torch.optim.AdamW, adamw, {"lr": 3e-3}),
}


def side_by_side(
    name: str, dtype: torch.dtype, context: str, members: int = 1, steps: int = 100
) -> list[tuple[tt.TensorDict, nn.Module, nn.Module]]:
    """``steps`` steps of tdtree's optimiser ``name`` (eager, in a vmap over ``members`` models, or
    compiled) beside torch.optim's with foreach=True and foreach=False on copies of the same models;
    per member: (tdtree's parameters, torch's foreach model, torch's for-loop model)."""
    torch_cls, step_fn, kwargs = TORCH_OPTIMS[name]
    torch.manual_seed(1)
    x, y = torch.randn(32, 6, dtype=dtype), torch.randn(32, 2, dtype=dtype)
    pairs = [(mlp(dtype, i), mlp(dtype, i)) for i in range(members)]
    trained = [
        (m, torch_cls(m.parameters(), foreach=f, **kwargs)) for pair in pairs for m, f in zip(pair, (True, False))
    ]
    base = mlp(dtype, 0)

    def loss(p: tt.TensorDict) -> torch.Tensor:
        return ((functional_call(base, p, x) - y) ** 2).mean()

    def step(p: tt.TensorDict, s: AdamState) -> tuple[tt.TensorDict, AdamState]:
        return step_fn(p, torch.func.grad(loss)(p), s, **kwargs)

    f: Any = step
    if context == "vmap":
        params = tt.stack([detached(m) for m, _ in pairs])
        state = tt.vmap(adam_init)(params)
        f = tt.vmap(step)
    else:
        params = detached(pairs[0][0])
        state = adam_init(params)
        if context == "compile":
            f = torch.compile(step, fullgraph=True, backend="aot_eager")
    for _ in range(steps):
        params, state = f(params, state)
        for model, opt in trained:
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    assert (state.step == steps).all()
    per_member = [params[i] for i in range(members)] if context == "vmap" else [params]
    return [(p, a, b) for p, (a, b) in zip(per_member, pairs)]


def max_abs_diff(params: tt.TensorDict, model: nn.Module) -> float:
    return max((a - b).abs().max().item() for a, b in zip(tt.tree.leaves(params), tt.tree.leaves(detached(model))))


@pytest.fixture
def one_thread() -> Any:
    # 100 steps of three small models: torch's thread pool only adds contention at this size
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(TORCH_OPTIMS))
def test_adam_and_adamw_equal_torch_bitwise_over_100_steps(name: str, dtype: torch.dtype, one_thread: Any) -> None:
    for params, with_foreach, with_loop in side_by_side(name, dtype, "eager"):
        assert max_abs_diff(params, with_foreach) == 0.0
        assert max_abs_diff(params, with_loop) == 0.0


@pytest.mark.parametrize("context", ["vmap", "compile"])
@pytest.mark.parametrize("name", ["adam_l2", "adamw"])
def test_adam_and_adamw_in_an_ensemble_vmap_and_compiled_agree_with_torch(
    name: str, context: str, one_thread: Any
) -> None:
    """Inside vmap and compiled the bias corrections are float64 tensors: torch's compiled-vs-eager
    tolerance (torch.testing's float32 defaults) over 100 float32 steps, for each ensemble member."""
    members = 3 if context == "vmap" else 1
    for params, with_foreach, with_loop in side_by_side(name, torch.float32, context, members):
        assert_close(params, detached(with_foreach))
        assert_close(params, detached(with_loop))


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_with_weight_decay_dampening_nesterov_equals_torch_bitwise(nesterov: bool, one_thread: Any) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(32, 6), torch.randn(32, 2)
    kwargs: dict[str, Any] = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "nesterov": nesterov}
    if not nesterov:
        kwargs["dampening"] = 0.1  # torch refuses dampening with nesterov
    models = [mlp(torch.float32, 0), mlp(torch.float32, 0)]
    opts = [torch.optim.SGD(m.parameters(), foreach=f, **kwargs) for m, f in zip(models, (True, False))]
    params, buf = detached(models[0]), None
    base = mlp(torch.float32, 0)
    extra = {k: v for k, v in kwargs.items() if k not in ("lr", "momentum")}
    for _ in range(100):
        grads = torch.func.grad(lambda p: ((functional_call(base, p, x) - y) ** 2).mean())(params)
        params, buf = sgd(params, grads, kwargs["lr"], kwargs["momentum"], buf, **extra)
        for model, opt in zip(models, opts):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    for model in models:
        assert max_abs_diff(params, model) == 0.0


def test_adamw_decays_the_parameters_not_the_gradient() -> None:
    p, g = params_and_grads()
    zero = tt.tree.map(torch.zeros_like, g)
    decayed, _ = adamw(p, zero, adam_init(p), lr=0.1, weight_decay=0.5)
    # a zero gradient leaves Adam's update at zero: what remains is the decay, p * (1 - lr * wd)
    assert_equal(decayed, p * (1 - 0.1 * 0.5))
    l2, _ = adam(p, zero, adam_init(p), lr=0.1, weight_decay=0.5)
    # L2 turns the zero gradient into 0.5 p: the first Adam step moves by lr against its sign
    assert_close(l2, p - 0.1 * p.sign(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.1, 1e3])
def test_clip_grad_norm_equals_torch_bitwise(norm_type: float, max_norm: float) -> None:
    model = Net()
    torch.manual_seed(3)
    ((model(torch.randn(8, 6)) - 1) ** 2).mean().backward()
    grads = tt.tree.map(lambda p: p.grad.clone(), from_module(model))
    before = [t.clone() for t in tt.tree.leaves(grads)]
    named = dict(model.named_parameters())
    # torch's norm of norms depends on the order of the parameters: give them in the node's key order
    ordered = [named[".".join(k)] for k in grads.keys(include_nested=True, leaves_only=True)]
    clipped, total = clip_grad_norm(grads, max_norm, norm_type)
    expected_total = nn.utils.clip_grad_norm_(ordered, max_norm, norm_type)
    assert torch.equal(total, expected_total)
    for t, p in zip(tt.tree.leaves(clipped), ordered):
        assert torch.equal(t, p.grad)
    assert all(torch.equal(a, b) for a, b in zip(tt.tree.leaves(grads), before))  # the input is unchanged
    assert clipped.tags == frozenset() and clipped.batch_size == grads.batch_size


def test_clip_grad_norm_in_vmap_per_member_and_over_dicts() -> None:
    torch.manual_seed(4)
    g = tt.TensorDict({"w": torch.randn(3, 4, 2), "n": {"b": torch.randn(3, 5)}}, batch_size=[3])
    clipped, total = tt.vmap(lambda q: clip_grad_norm(q, 0.5))(g)
    for i in range(3):
        ws = [g["n", "b"][i].clone(), g["w"][i].clone()]
        for w in ws:
            w.grad = w.clone()
        expected = nn.utils.clip_grad_norm_(ws, 0.5)
        torch.testing.assert_close(total[i], expected)
        torch.testing.assert_close(clipped["n", "b"][i], ws[0].grad)
        torch.testing.assert_close(clipped["w"][i], ws[1].grad)
    as_dict, dict_total = clip_grad_norm(g.to_dict(), 0.5)
    assert type(as_dict) is dict
    assert torch.equal(dict_total, clip_grad_norm(g, 0.5)[1])
    empty, zero = clip_grad_norm(tt.TensorDict({}), 1.0)
    assert len(empty) == 0 and zero.item() == 0.0
