"""tdtree.nn: from_module, functional_call, torch.func over parameter nodes, TDModule, TDSequential."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import tdtree as tt
from tdtree._tags import storage_key
from tdtree.errors import KeyNotFoundError, LockedError, OutKeysError
from tdtree.nn import TDModule, TDSequential, from_module, functional_call
from tdtree.testing import assert_close, assert_equal


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.embed = nn.Linear(4, 4, bias=False)
        self.mid = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(self.embed(x))))


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()}


# -- from_module ------------------------------------------------------------------


def test_from_module_mlp_layout() -> None:
    m = mlp()
    p = from_module(m)
    assert type(p) is tt.TensorDict
    assert p.batch_size == torch.Size(()) and p.tags == frozenset()
    assert list(p.keys(include_nested=True, leaves_only=True)) == [
        ("0", "bias"),
        ("0", "weight"),
        ("2", "bias"),
        ("2", "weight"),
        ("4", "bias"),
        ("4", "weight"),
    ]
    assert p["0", "weight"] is m[0].weight
    assert isinstance(p["4", "bias"], nn.Parameter)
    assert "1" not in p  # Tanh holds no tensors


def test_from_module_conv_batchnorm_tells_params_from_buffers() -> None:
    m = ConvNet()
    both = from_module(m)
    params, buffers = from_module(m, split=True)
    bn = ("features", "1")
    assert list(params[bn].keys()) == ["bias", "weight"]
    assert list(buffers[bn].keys()) == ["num_batches_tracked", "running_mean", "running_var"]
    assert list(buffers.keys()) == ["features"]
    assert list(both[bn].keys()) == ["bias", "num_batches_tracked", "running_mean", "running_var", "weight"]
    assert both[(*bn, "running_mean")] is m.features[1].running_mean
    kinds = {k: isinstance(v, nn.Parameter) for k, v in both.items(include_nested=True, leaves_only=True)}
    assert kinds[(*bn, "weight")] and not kinds[(*bn, "running_var")]
    assert sum(kinds.values()) == len(list(m.parameters()))


def test_from_module_without_buffers_gives_empty_buffer_node() -> None:
    params, buffers = from_module(mlp(), split=True)
    assert len(buffers) == 0 and buffers.batch_size == torch.Size(())
    assert len(list(params.keys(include_nested=True, leaves_only=True))) == 6


def test_from_module_equals_the_validating_constructor_devices_included() -> None:
    m = nn.ModuleDict({"host": nn.Linear(2, 3), "lazy": nn.Linear(2, 3, device="meta"), "act": nn.ReLU()})
    m.register_buffer("step", torch.zeros((), dtype=torch.int64))
    m["both"] = nn.Linear(2, 3)  # leaves of one module on two devices
    m["both"].register_buffer("scale", torch.ones(3, device="meta"))
    p = from_module(m)
    expected = tt.TensorDict(
        {
            "both": dict(m["both"].named_parameters()) | {"scale": m["both"].scale},
            "host": dict(m["host"].named_parameters()),
            "lazy": tt.TensorDict(dict(m["lazy"].named_parameters()), []),
            "step": m.step,
        },
        [],
    )
    assert p.device is None and p["host"].device == torch.device("cpu") and p["lazy"].device == torch.device("meta")
    assert p["both"].device is None and expected["both"].device is None
    assert tt.tree.structure(p) == tt.tree.structure(expected)
    assert all(a is b for a, b in zip(tt.tree.leaves(p), tt.tree.leaves(expected)))
    assert list(p.keys()) == ["both", "host", "lazy", "step"]


def test_from_module_tied_weights_once_per_path_same_storage() -> None:
    m = Tied()
    p = from_module(m)
    assert p["embed", "weight"] is p["out", "weight"]
    leaves = tt.tree.leaves(p)
    assert len(leaves) == 4  # embed.weight, mid.weight, mid.bias, out.weight
    assert len({storage_key(t) for t in leaves}) == 3


def test_from_module_shared_submodule_appears_at_both_paths() -> None:
    lin = nn.Linear(2, 2)
    m = nn.Sequential(lin, nn.ReLU(), lin)
    p = from_module(m)
    assert p["0"]["weight"] is p["2"]["weight"]
    assert list(p.keys()) == ["0", "2"]


# -- functional_call --------------------------------------------------------------


def test_functional_call_equals_module_call() -> None:
    m = mlp()
    x = torch.randn(5, 3)
    assert torch.equal(functional_call(m, from_module(m), x), m(x))


def test_functional_call_uses_node_tensors_and_leaves_module_unchanged() -> None:
    m = mlp()
    before = state(m)
    zeros = tt.tree.map(torch.zeros_like, from_module(m))
    out = functional_call(m, zeros, torch.randn(4, 3))
    assert torch.equal(out, torch.zeros(4, 2))
    after = state(m)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert isinstance(m[0].weight, nn.Parameter)


def test_functional_call_missing_entries_fall_back_to_module() -> None:
    m = mlp()
    x = torch.randn(4, 3)
    partial = from_module(m).select("0")
    assert torch.equal(functional_call(m, partial, x), m(x))
    other = mlp(seed=5)
    swapped = from_module(other).select("4")
    expected = m[:4](x) @ other[4].weight.T + other[4].bias
    assert_close(functional_call(m, swapped, x), expected)


def test_functional_call_kwargs_and_tuple_of_nodes() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x: torch.Tensor, *, shift: float = 0.0) -> torch.Tensor:
            return self.lin(x) * self.scale + shift

    m = Scaled()
    x = torch.randn(2, 3)
    params, buffers = from_module(m, split=True)
    buffers = buffers.set("scale", torch.tensor(3.0))
    out = functional_call(m, (params, buffers), x, shift=1.0)
    assert_close(out, m.lin(x) * 3.0 + 1.0)
    assert m.scale.item() == 2.0


def test_functional_call_entry_that_is_no_parameter_or_buffer_is_set_for_the_call() -> None:
    """An entry naming a plain tensor attribute is set for the call and put back, as by
    torch.func.functional_call, also when entries before it were parameters."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.scale = torch.tensor(2.0)  # a plain attribute, neither parameter nor buffer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale

    m = Scaled()
    weight, scale = m.lin.weight, m.scale
    x = torch.randn(3, 2)
    w, b = torch.randn(2, 2), torch.randn(2)
    p = tt.TensorDict({"lin": {"weight": w, "bias": b}, "scale": torch.tensor(3.0)})
    assert_close(functional_call(m, p, x), (x @ w.T + b) * 3.0)
    assert m.scale is scale and m.lin.weight is weight and "scale" not in m._buffers


def test_functional_call_puts_the_module_tensors_back_when_forward_raises() -> None:
    class Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert self.lin.weight is not weight and self.count is not count
            raise RuntimeError("forward failed")

    m = Failing()
    weight, count = m.lin.weight, m.count
    zeros = tt.tree.map(torch.zeros_like, from_module(m))
    with pytest.raises(RuntimeError, match="forward failed"):
        functional_call(m, zeros, torch.randn(1, 2))
    assert m.lin.weight is weight and m.count is count
    assert m.lin._parameters["weight"] is weight and isinstance(m.lin.weight, nn.Parameter)


def test_functional_call_batchnorm_eval_uses_node_buffers() -> None:
    m = ConvNet().eval()
    x = torch.randn(2, 1, 6, 6)
    params, buffers = from_module(m, split=True)
    moved = buffers.set(("features", "1", "running_mean"), torch.full((4,), 0.5))
    expected = ConvNet().eval()
    expected.features[1].running_mean.fill_(0.5)
    assert_close(functional_call(m, (params, moved), x), expected(x))


def test_grad_through_functional_call_equals_autograd() -> None:
    m = ConvNet()
    x, y = torch.randn(6, 1, 6, 6), torch.randn(6, 3)
    params, buffers = from_module(m, split=True)

    # Train-mode BatchNorm updates its running stats in place: torch.func
    # accepts that only for tensors passed in as arguments.
    def loss(p: tt.TensorDict, b: tt.TensorDict) -> torch.Tensor:
        return ((functional_call(m, (p, b), x) - y) ** 2).mean()

    grads = torch.func.grad(loss)(params, buffers)
    assert type(grads) is tt.TensorDict
    assert tt.tree.structure(grads) == tt.tree.structure(params)
    ref = ConvNet()
    ((ref(x) - y) ** 2).mean().backward()
    expected = tt.TensorDict({k: p.grad for k, p in ref.named_parameters()}).unflatten_keys()
    assert_close(grads, expected)
    assert_close(buffers["features", "1", "running_mean"], ref.features[1].running_mean)


def test_grad_with_tied_weights_keeps_them_tied() -> None:
    m = Tied()
    x = torch.randn(3, 4)
    p = from_module(m)
    grads = torch.func.grad(lambda p: functional_call(m, p, x).pow(2).sum())(p)
    ref = Tied()
    ref(x).pow(2).sum().backward()
    assert_close(grads["embed", "weight"], ref.embed.weight.grad)
    assert torch.count_nonzero(grads["out", "weight"]) == 0
    stepped = tt.tree.map(lambda w, g: w - 0.1 * g, p, grads)
    with torch.no_grad():
        ref.embed.weight -= 0.1 * ref.embed.weight.grad
        ref.mid.weight -= 0.1 * ref.mid.weight.grad
        ref.mid.bias -= 0.1 * ref.mid.bias.grad
    assert_close(functional_call(m, stepped, x), ref(x))


def test_functional_call_shared_submodule_and_buffer_take_the_first_path() -> None:
    class Scale(nn.Module):
        def __init__(self, s: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("s", s)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.s

    torch.manual_seed(4)
    lin = nn.Linear(2, 2)
    shared = torch.tensor(2.0)
    m = nn.Sequential(lin, Scale(shared), lin, Scale(shared))
    x = torch.randn(3, 2)
    w0, b0 = torch.randn(2, 2), torch.randn(2)
    p = tt.TensorDict(
        {
            "0": {"weight": w0, "bias": b0},
            "1": {"s": torch.tensor(3.0)},
            "2": {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)},
            "3": {"s": torch.tensor(5.0)},
        }
    )
    # the shared Linear and the shared buffer take their first path's values at both paths
    expected = ((x @ w0.T + b0) * 3.0 @ w0.T + b0) * 3.0
    assert_close(functional_call(m, p, x), expected)
    assert shared.item() == 2.0 and m[0].weight is lin.weight


def test_vmap_ensemble_of_five_equals_five_calls() -> None:
    models = [mlp(seed=s) for s in range(5)]
    nodes = [from_module(mod) for mod in models]
    stacked = tt.tree.map(lambda *xs: torch.stack(xs), *nodes)
    assert stacked.batch_size == torch.Size(()) and stacked["0", "weight"].shape == (5, 8, 3)
    x = torch.randn(7, 3)
    out = torch.func.vmap(lambda p: functional_call(models[0], p, x))(stacked)
    assert out.shape == (5, 7, 2)
    for i, mod in enumerate(models):
        assert_close(out[i], mod(x))


def test_vmap_ensemble_grads_per_member() -> None:
    models = [mlp(seed=s) for s in range(3)]
    stacked = tt.tree.map(lambda *xs: torch.stack(xs), *(from_module(mod) for mod in models))
    x = torch.randn(4, 3)
    loss = lambda p: functional_call(models[0], p, x).sum()  # noqa: E731
    grads = torch.func.vmap(torch.func.grad(loss))(stacked)
    for i, mod in enumerate(models):
        mod(x).sum().backward()
        assert_close(grads["2", "weight"][i], mod[2].weight.grad)


# -- TDModule ------------------------------------------------------------------------


def batch() -> tt.TensorDict:
    torch.manual_seed(3)
    return tt.TensorDict({"x": torch.randn(5, 3), "meta": {"id": torch.arange(5)}}, batch_size=[5])


def test_tdmodule_writes_output_and_keeps_input() -> None:
    lin = nn.Linear(3, 4)
    mod = TDModule(lin, in_keys=["x"], out_keys=["h"])
    td = batch()
    out = mod(td)
    assert list(out.keys()) == ["h", "meta", "x"]
    assert_equal(out["h"], lin(td["x"]))
    assert out["x"] is td["x"] and out["meta"] is td["meta"]
    assert "h" not in td
    assert mod.in_keys == ["x"] and mod.out_keys == ["h"]


def test_tdmodule_nested_keys_and_single_key_spelling() -> None:
    mod = TDModule(nn.Linear(3, 2), "x", ("out", "y"))
    assert mod.in_keys == ["x"] and mod.out_keys == [("out", "y")]
    out = mod(batch())
    assert out["out", "y"].shape == (5, 2) and out["out"].batch_size == torch.Size([5])
    twice = TDModule(nn.Linear(2, 1), [("out", "y")], [("out", "z")])(out)
    assert list(twice["out"].keys()) == ["y", "z"]


def test_tdmodule_several_inputs_and_tuple_outputs() -> None:
    class Split(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a + b, a * b

    td = tt.TensorDict({"a": torch.ones(2, 3), "b": torch.full((2, 3), 2.0)}, batch_size=[2])
    out = TDModule(Split(), ["a", "b"], ["sum", ("nested", "prod")])(td)
    assert_equal(out["sum"], torch.full((2, 3), 3.0))
    assert_equal(out["nested", "prod"], torch.full((2, 3), 2.0))


def test_tdmodule_output_count_mismatch_errors() -> None:
    class Two(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    with pytest.raises(OutKeysError, match=r"tuple of 2 outputs for the one out key 'y'"):
        TDModule(Two(), "x", "y")(batch())
    with pytest.raises(OutKeysError, match=r"returned one Tensor for the 3 out keys \['a', 'b', 'c'\]"):
        TDModule(nn.Identity(), "x", ["a", "b", "c"])(batch())
    with pytest.raises(OutKeysError, match=r"returned 2 outputs for the 3 out keys"):
        TDModule(Two(), "x", ["a", "b", "c"])(batch())


def test_tdmodule_missing_key_and_bad_construction() -> None:
    mod = TDModule(nn.Linear(3, 3), ["obs"], ["h"])
    with pytest.raises(KeyNotFoundError, match=r"key 'obs' not found; the keys here are: 'meta', 'x'"):
        mod(batch())
    with pytest.raises(ValueError, match="at least one out key"):
        TDModule(nn.Identity(), "x", [])
    with pytest.raises(ValueError, match=r"out_keys \['y', 'y'\] name a key twice"):
        TDModule(nn.Identity(), "x", ["y", ("y",)])
    with pytest.raises(TypeError, match="keys are str or tuples of str"):
        TDModule(nn.Identity(), [3], "y")


def test_tdmodule_batch_mismatch_and_locked_node() -> None:
    mod = TDModule(nn.Linear(3, 3), "x", "h")
    bad = TDModule(nn.Identity(), "x", "h")
    td = batch()
    with pytest.raises(LockedError, match=r"set\(\) on a locked node"):
        mod(td.lock())
    summed = TDModule(_Sum(), "x", "s")
    with pytest.raises(tt.errors.BatchSizeError, match=r"entry 's' has shape \(\), which does not start"):
        summed(td)
    assert bad(td)["h"] is td["x"]


class _Sum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


def test_tdmodule_parameters_and_functional_call() -> None:
    mod = TDModule(nn.Linear(3, 4), "x", "h")
    p = from_module(mod)
    assert list(p.keys(include_nested=True)) == ["module", ("module", "bias"), ("module", "weight")]
    zeros = tt.tree.map(torch.zeros_like, p)
    out = functional_call(mod, zeros, batch())
    assert_equal(out["h"], torch.zeros(5, 4))


# -- TDSequential ------------------------------------------------------------------------


def chain() -> TDSequential:
    torch.manual_seed(4)
    return TDSequential(
        TDModule(nn.Linear(3, 8), "x", "h"),
        TDModule(nn.Tanh(), "h", "h"),
        TDModule(nn.Linear(8, 2), "h", ("out", "y")),
        TDModule(nn.Linear(3, 1), ["x"], "aux"),
    )


def test_tdsequential_keys_and_output() -> None:
    seq = chain()
    assert seq.in_keys == ["x"]
    assert seq.out_keys == ["h", ("out", "y"), "aux"]
    td = batch()
    out = seq(td)
    lin0, _, lin2, lin3 = (seq[i].module for i in range(4))
    assert len(seq) == 4
    h = torch.tanh(lin0(td["x"]))
    assert_equal(out["h"], h)
    assert_equal(out["out", "y"], lin2(h))
    assert_equal(out["aux"], lin3(td["x"]))
    assert list(out.keys()) == ["aux", "h", "meta", "out", "x"]


def test_tdsequential_in_keys_read_under_a_written_key() -> None:
    seq = TDSequential(
        TDModule(nn.Identity(), "x", ("a", "b")),
        TDModule(nn.Identity(), [("a", "b"), "z"], "c"),
    )
    assert seq.in_keys == ["x", "z"]
    assert seq.out_keys == [("a", "b"), "c"]


def test_tdsequential_select_out_keys() -> None:
    seq = chain()
    td = batch().set("h", torch.zeros(5, 1))
    kept = seq.select_out_keys(("out", "y"))
    assert kept.selected_out_keys == [("out", "y")] and seq.selected_out_keys is None
    out = kept(td)
    assert list(out.keys(include_nested=True)) == ["h", "meta", ("meta", "id"), "out", ("out", "y"), "x"]
    assert out["h"].shape == (5, 8)  # an input key stays, with the chain's value
    out2 = kept(batch())
    assert list(out2.keys()) == ["meta", "out", "x"]
    assert_equal(out2["out", "y"], seq(batch())["out", "y"])
    for a, b in zip(kept.parameters(), seq.parameters()):
        assert a is b


def test_tdsequential_select_unknown_key_errors() -> None:
    with pytest.raises(KeyNotFoundError, match=r"key 'nope' not found; the keys here are: 'h', \('out', 'y'\), 'aux'"):
        chain().select_out_keys("nope")
    with pytest.raises(TypeError, match=r"member 1 is a Linear; members are TDModule or TDSequential"):
        TDSequential(TDModule(nn.Identity(), "x", "y"), nn.Linear(2, 2))


def test_tdsequential_nested_uses_selected_keys() -> None:
    inner = chain().select_out_keys("aux")
    outer = TDSequential(inner, TDModule(nn.Linear(1, 1), "aux", "final"))
    assert outer.in_keys == ["x"] and outer.out_keys == ["aux", "final"]
    out = outer(batch())
    assert list(out.keys()) == ["aux", "final", "meta", "x"]


def test_td_modules_nest_in_ordinary_models() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = chain()
            self.scale = nn.Parameter(torch.tensor(2.0))

        def forward(self, td: tt.TensorDict) -> torch.Tensor:
            return self.body(td)["out", "y"] * self.scale

    model = Model()
    td = batch()
    p = from_module(model)
    assert ("body", "0", "module", "weight") in [k for k in p.keys(include_nested=True)]
    assert_equal(functional_call(model, p, td), model(td))
    grads = torch.func.grad(lambda p: functional_call(model, p, td).sum())(p)
    model(td).sum().backward()
    assert_close(grads["scale"], model.scale.grad)
    assert_close(grads["body", "2", "module", "weight"], model.body[2].module.weight.grad)
    assert len(model.state_dict()) == 7  # three Linear layers and scale


def test_select_out_keys_keeps_a_sub_node_with_a_kept_key() -> None:
    seq = TDSequential(
        TDModule(nn.Identity(), "x", ("out", "a", "b")),
        TDModule(nn.Identity(), "x", ("out", "c")),
    )
    out = seq.select_out_keys(("out", "c"))(batch())
    assert list(out.keys(include_nested=True)) == ["meta", ("meta", "id"), "out", ("out", "c"), "x"]


def test_select_out_keys_drops_only_what_the_chain_created_below_input_keys() -> None:
    seq = TDSequential(
        TDModule(nn.Identity(), "x", ("out", "a", "b")),
        TDModule(nn.Identity(), "x", ("out", "c")),
    ).select_out_keys(("out", "c"))
    z = torch.ones(5)
    had_out = seq(batch().set(("out", "z"), z))
    assert list(had_out.keys(include_nested=True)) == ["meta", ("meta", "id"), "out", ("out", "c"), ("out", "z"), "x"]
    assert had_out["out", "z"] is z
    had_a = seq(batch().set(("out", "a", "k"), z))
    assert list(had_a["out"].keys(include_nested=True)) == ["a", ("a", "k"), "c"]
    had_b = seq(batch().set(("out", "a", "b"), z))
    assert had_b["out", "a", "b"] is had_b["x"]  # the input had it: the chain's value stays


def test_td_modules_follow_the_tag_rule() -> None:
    td = batch().share_memory().unlock()
    assert td.tags == frozenset({tt.Shared})
    ident = TDModule(nn.Identity(), "x", "y")
    assert ident(td).tags == frozenset({tt.Shared})  # no new storage
    assert TDModule(nn.Linear(3, 3), "x", "y")(td).tags == frozenset()
    seq = TDSequential(ident, TDModule(nn.Identity(), "y", ("out", "z"))).select_out_keys(("out", "z"))
    out = seq(td)
    assert out.tags == frozenset({tt.Shared}) and out["out"].tags == frozenset({tt.Shared})
    assert list(out.keys()) == ["meta", "out", "x"]


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x.sum()


def test_tdmodule_outputs_equal_one_set_per_key_in_order() -> None:
    class Three(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x + 1, x * 2, x - 1

    three = Three()
    cpu = batch()
    mixed = tt.TensorDict({"x": torch.ones(5, 3), "m": torch.zeros(5, device="meta")}, [5])
    assert cpu.device == torch.device("cpu") and mixed.device is None
    for td in (cpu, mixed):
        for out_keys in (["z", "a", "n"], ["n", ("meta", "k"), "b"], ["x", "c", "a"]):
            out = TDModule(three, "x", out_keys)(td)
            want = td
            for key, value in zip(out_keys, three(td["x"])):
                want = want.set(key, value)
            assert list(out.keys(include_nested=True)) == list(want.keys(include_nested=True))
            assert out._meta[0] == tuple(want.keys()) and out.device == want.device
            assert_equal(out, want)
    with pytest.raises(tt.errors.BatchSizeError, match=r"entry 'b' has shape \(\)"):
        TDModule(_Pair(), "x", ["a", "b"])(cpu)
    with pytest.raises(LockedError):
        TDModule(three, "x", ["a", "b", "c"])(cpu.lock())


def test_td_modules_run_the_hooks_of_the_modules_they_call() -> None:
    # TDModule and TDSequential call their members' forward directly when nothing else would run:
    # every kind of hook must still run, in torch's order, and change the result as it does in torch
    calls: list[str] = []
    inner = nn.Linear(3, 2)
    member = TDModule(inner, "x", "y")
    seq = TDSequential(member)
    td = tt.TensorDict({"x": torch.ones(4, 3)}, [4])
    plain = seq(td)["y"]
    handles = [
        inner.register_forward_pre_hook(lambda m, args: calls.append("pre") or (args[0] * 2,)),
        inner.register_forward_hook(lambda m, args, out: calls.append("post") or out + 1),
        member.register_forward_pre_hook(lambda m, args: calls.append("member pre")),
        member.register_forward_hook(lambda m, args, out: calls.append("member post")),
    ]
    out = seq(td)["y"]
    assert calls == ["member pre", "pre", "post", "member post"]
    assert torch.equal(out, nn.functional.linear(torch.ones(4, 3) * 2, inner.weight, inner.bias) + 1)
    for handle in handles:
        handle.remove()
    calls.clear()
    assert torch.equal(seq(td)["y"], plain) and calls == []

    seen: list[type] = []
    handle = nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(type(m)))
    try:
        seq(td)
    finally:
        handle.remove()
    assert seen == [nn.Linear, TDModule, TDSequential]


def test_td_modules_call_a_module_through_its_own_call() -> None:
    class Doubled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return super().__call__(x) * 2

    td = tt.TensorDict({"x": torch.ones(3)}, [3])
    assert torch.equal(TDModule(Doubled(), "x", "y")(td)["y"], torch.full((3,), 2.0))

    class Half(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / 2

    # module.compile() routes the module's calls through torch.compile: the backend sees the graph
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm.forward

    compiled = Half()
    compiled.compile(backend=backend)
    assert torch.equal(TDModule(compiled, "x", "y")(td)["y"], torch.full((3,), 0.5)) and len(graphs) == 1
