"""Nodes inside torch.func transforms and tdtree.vmap, checked against the same computation over a
plain dict of tensors with torch.func and optree.

* Operations whose eager path is a ``torch._foreach_*`` kernel (no batching rule) run leaf by leaf
  inside every transform: arithmetic, unary math, ``update_`` / ``copy_`` / ``zero_``, and the
  ``tdtree.optim`` steps (an ensemble trained with one step per member equals a loop over members).
* ``tdtree.vmap``: keyword arguments unmapped, named tuples and tensorclasses in and out,
  ``in_dims`` / ``out_dims`` as pytree prefixes, errors naming the argument, and the tag rule on
  what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import pytest
import torch

import tdtree as tt
from tdtree import optim

N = 5  # ensemble members / mapped size


def _dict(seed: int = 0, lead: tuple[int, ...] = (N,)) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.rand(*lead, 3, 2, generator=g) + 0.5,
        "n": {"b": torch.rand(*lead, 2, generator=g) + 0.5, "c": torch.rand(lead, generator=g) + 0.5},
    }


def _node(d: dict[str, Any], batch: tuple[int, ...] = ()) -> tt.TensorDict:
    return tt.TensorDict(d, batch_size=list(batch))


def _plain(tree: Any) -> Any:
    """``tree`` with each node replaced by its nested dict of tensors."""
    is_node = lambda x: isinstance(x, tt.TensorDict)  # noqa: E731
    return optree.tree_map(lambda x: x.to_dict() if is_node(x) else x, tree, is_leaf=is_node)


def _close(tree: Any, d: Any) -> None:
    """``tree`` (a node, or a tree holding nodes) holds the values of the dict tree ``d``."""
    plain = _plain(tree)
    assert optree.tree_structure(plain) == optree.tree_structure(d)
    optree.tree_map(lambda a, b: torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6), plain, d)


def _tree(fn: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    return lambda *ds: optree.tree_map(fn, *ds)


# name, on a node, on one leaf (the dict version maps it with optree over the leaves)
OPS: list[tuple[str, Callable[[Any], Any], Callable[[torch.Tensor], torch.Tensor]]] = [
    ("add_scalar", lambda q: q + 2, lambda x: x + 2),
    ("radd", lambda q: 2 + q, lambda x: 2 + x),
    ("sub_node", lambda q: q - 0.1 * q, lambda x: x - 0.1 * x),
    ("rsub", lambda q: 1 - q, lambda x: 1 - x),
    ("mul_node", lambda q: q * q, lambda x: x * x),
    ("rmul", lambda q: 3 * q, lambda x: 3 * x),
    ("div", lambda q: q / (q + 1), lambda x: x / (x + 1)),
    ("pow", lambda q: q**2, lambda x: x**2),
    ("neg", lambda q: -q, lambda x: -x),
    ("abs", lambda q: abs(q - 1), lambda x: abs(x - 1)),
    ("exp", lambda q: q.exp(), torch.exp),
    ("log", lambda q: q.log(), torch.log),
    ("sqrt", lambda q: q.sqrt(), torch.sqrt),
    ("sigmoid", lambda q: q.sigmoid(), torch.sigmoid),
    ("tanh", lambda q: q.tanh(), torch.tanh),
    ("sign", lambda q: (q - 1).sign(), lambda x: (x - 1).sign()),
    ("apply", lambda q: q.apply(torch.sin), torch.sin),
]
OP_IDS = [name for name, _, _ in OPS]
TAGS = {"untagged": lambda td: td, "locked": lambda td: td.lock()}


# -- per-leaf ops instead of foreach kernels inside transforms ---------------------------------


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize(("name", "on_node", "on_leaf"), OPS, ids=OP_IDS)
def test_ops_inside_torch_func_vmap(name: str, on_node: Any, on_leaf: Any, tag: str) -> None:
    d = _dict()
    out = torch.func.vmap(on_node)(TAGS[tag](_node(d)))
    _close(out, torch.func.vmap(_tree(on_leaf))(d))


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize(("name", "on_node", "on_leaf"), OPS, ids=OP_IDS)
def test_ops_inside_tdtree_vmap(name: str, on_node: Any, on_leaf: Any, tag: str) -> None:
    d = _dict()
    out = tt.vmap(on_node)(TAGS[tag](_node(d, (N,))))
    assert out.batch_size == (N,) and out["n"].batch_size == (N,)
    _close(out, torch.func.vmap(_tree(on_leaf))(d))


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize(("name", "on_node", "on_leaf"), OPS, ids=OP_IDS)
def test_ops_inside_grad_jvp_and_vmap_of_grad(name: str, on_node: Any, on_leaf: Any, tag: str) -> None:
    d = _dict(lead=())
    td = TAGS[tag](_node(d))

    def loss(q: tt.TensorDict) -> torch.Tensor:
        return sum(x.sum() for x in on_node(q).values(True, True))

    def dict_loss(p: dict[str, Any]) -> torch.Tensor:
        return sum(x.sum() for x in optree.tree_leaves(optree.tree_map(on_leaf, p)))

    _close(torch.func.grad(loss)(td), torch.func.grad(dict_loss)(d))
    tangent = optree.tree_map(torch.ones_like, d)
    value, dvalue = torch.func.jvp(loss, (td,), (TAGS[tag](_node(tangent)),))
    ref_value, ref_dvalue = torch.func.jvp(dict_loss, (d,), (tangent,))
    torch.testing.assert_close((value, dvalue), (ref_value, ref_dvalue))
    stacked = _dict()
    per_member = torch.func.vmap(torch.func.grad(loss))(TAGS[tag](_node(stacked)))
    _close(per_member, torch.func.vmap(torch.func.grad(dict_loss))(stacked))


@pytest.mark.parametrize("tag", TAGS)
def test_ops_inside_the_other_transforms(tag: str) -> None:
    """grad_and_value, vjp, jacrev, jacfwd, hessian and grad of a vmap, over foreach-backed ops."""
    d = _dict(lead=())
    td = TAGS[tag](_node(d))

    def loss(q: tt.TensorDict) -> torch.Tensor:
        out = (q * q).exp() - q.sqrt() * 2
        return out["w"].sum() + out["n"]["b"].sum() + out["n"]["c"]

    def dict_loss(p: dict[str, Any]) -> torch.Tensor:
        out = optree.tree_map(lambda x: (x * x).exp() - x.sqrt() * 2, p)
        return out["w"].sum() + out["n"]["b"].sum() + out["n"]["c"]

    grads, value = torch.func.grad_and_value(loss)(td)
    ref_grads, ref_value = torch.func.grad_and_value(dict_loss)(d)
    _close(grads, ref_grads)
    torch.testing.assert_close(value, ref_value)
    _close(torch.func.vjp(loss, td)[1](torch.tensor(1.0))[0], torch.func.vjp(dict_loss, d)[1](torch.tensor(1.0))[0])
    _close(torch.func.jacrev(loss)(td), torch.func.jacrev(dict_loss)(d))
    if tag != "untagged":
        # jacfwd and hessian build their tangents by unflattening the primals' structure: untagged
        # nodes (DESIGN 3.1), whose structure torch finds different from the tagged primals'
        for transform in (torch.func.jacfwd, torch.func.hessian):
            with pytest.raises(RuntimeError, match="same python structure"):
                transform(loss)(td)
        td = tt.TensorDict(td, td.batch_size)  # the same leaves, untagged: the documented way
    _close(torch.func.jacfwd(loss)(td), torch.func.jacfwd(dict_loss)(d))
    hessian = torch.func.hessian(loss)(td)
    ref_hessian = torch.func.hessian(dict_loss)(d)
    for key in ("w", ("n", "b")):
        path = key if isinstance(key, tuple) else (key,)
        ref_row = ref_hessian
        for k in path:
            ref_row = ref_row[k]
        _close(hessian[key], ref_row)
    stacked = _dict()
    _close(
        torch.func.grad(lambda q: torch.func.vmap(loss)(q).sum())(TAGS[tag](_node(stacked))),
        torch.func.grad(lambda p: torch.func.vmap(dict_loss)(p).sum())(stacked),
    )


def test_tensor_operand_aligned_with_batch_dims_inside_tdtree_vmap() -> None:
    d = _dict(lead=(N, 4))
    td = _node(d, (N, 4))
    s = torch.arange(4.0)
    out = tt.vmap(lambda q, t: q * t + t, in_dims=(0, None))(td, s)
    ref = optree.tree_map(lambda x: x * s.reshape(1, 4, *[1] * (x.ndim - 2)) + s.reshape(1, 4, *[1] * (x.ndim - 2)), d)
    _close(out, ref)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_ops_inside_vmap_compile_fullgraph(backend: str) -> None:
    d = _dict()

    def f(q: Any) -> Any:
        return (q - 0.1 * q).exp() * q + (-q).sigmoid()

    def g(x: torch.Tensor) -> torch.Tensor:
        return (x - 0.1 * x).exp() * x + (-x).sigmoid()

    torch._dynamo.reset()
    out = torch.compile(lambda td: torch.func.vmap(f)(td), fullgraph=True, backend=backend)(_node(d))
    _close(out, torch.func.vmap(_tree(g))(d))
    out = torch.compile(lambda td: tt.vmap(f)(td), fullgraph=True, backend=backend)(_node(d, (N,)).lock())
    _close(out, torch.func.vmap(_tree(g))(d))


# update_ / copy_ / zero_: in place through the transform into the caller's tensors


@pytest.mark.parametrize("tag", TAGS)
def test_inplace_writers_inside_vmap(tag: str) -> None:
    d = _dict()
    td = TAGS[tag](_node(optree.tree_map(torch.clone, d)))
    torch.func.vmap(lambda q: q.update_({"w": q["w"] * 2, ("n", "b"): q["n", "c"].unsqueeze(-1)}))(td)
    ref = optree.tree_map(torch.clone, d)
    ref["w"] = ref["w"] * 2
    ref["n"]["b"] = ref["n"]["c"].unsqueeze(-1).expand(N, 2).clone()
    _close(td, ref)
    torch.func.vmap(lambda q: q.copy_(q * 3))(td)
    _close(td, optree.tree_map(lambda x: x * 3, ref))
    tt.vmap(lambda q: q["n"].zero_())(TAGS[tag](_node(td.to_dict(), (N,))))
    _close(td, {"w": ref["w"] * 3, "n": {"b": torch.zeros(N, 2), "c": torch.zeros(N)}})


@pytest.mark.parametrize("tag", TAGS)
def test_inplace_writers_inside_grad(tag: str) -> None:
    d = _dict(lead=())

    def loss(q: tt.TensorDict) -> torch.Tensor:
        square = TAGS[tag](q.clone()).update_({"w": q["w"] ** 2})
        cube = TAGS[tag](q.clone()).copy_(square * q)
        cube["n"].zero_()
        return cube["w"].sum() + cube["n", "b"].sum()

    def dict_loss(p: dict[str, Any]) -> torch.Tensor:
        return (p["w"] ** 3).sum() + 0 * p["n"]["b"].sum() + 0 * p["n"]["c"].sum()

    _close(torch.func.grad(loss)(TAGS[tag](_node(d))), torch.func.grad(dict_loss)(d))


# -- optimiser steps inside vmap ----------------------------------------------------------------


def _loss(q: Any, x: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x @ q["w"])
    return ((h * q["n"]["b"]).sum(-1) - q["n"]["c"]).pow(2).mean()


def _train(q: Any, x: torch.Tensor, steps: int, opt: str) -> Any:
    state = optim.adam_init(q) if opt == "adam" else None
    for _ in range(steps):
        g = torch.func.grad(_loss)(q, x)
        if opt == "adam":
            q, state = optim.adam(q, g, state, lr=0.05)
        else:
            q, state = optim.sgd(q, g, lr=0.1, momentum=0.9, momentum_state=state)
    return q


@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_optim_steps_per_member_equal_a_loop(opt: str) -> None:
    d = _dict()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(1))
    # the loop: each member's own node, trained alone, eagerly (foreach kernels)
    members = [_train(_node(optree.tree_map(lambda t: t[i], d)), x, 3, opt) for i in range(N)]
    ref = optree.tree_map(lambda *xs: torch.stack(xs), *[m.to_dict() for m in members])
    _close(tt.vmap(lambda q: _train(q, x, 3, opt))(_node(d, (N,))), ref)
    _close(torch.func.vmap(lambda q: _train(q, x, 3, opt))(_node(d)), ref)


def test_optim_state_through_tdtree_vmap() -> None:
    """``adam_init`` and ``adam`` as vmapped functions themselves: the state is a named tuple of nodes."""
    d = _dict()
    td = _node(d, (N,))
    state = tt.vmap(optim.adam_init)(td)
    assert type(state) is optim.AdamState and state.step.shape == (N,)
    assert state.exp_avg.batch_size == (N,)
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(2))
    grads = tt.vmap(torch.func.grad(_loss), in_dims=(0, None))(td, x)
    new, state = tt.vmap(lambda q, g, s: optim.adam(q, g, s, lr=0.05))(td, grads, state)
    for i in range(N):
        member = _node(optree.tree_map(lambda t: t[i], d))
        ref, ref_state = optim.adam(member, torch.func.grad(_loss)(member, x), optim.adam_init(member), lr=0.05)
        _close(new[i], ref.to_dict())
        _close(state.exp_avg_sq[i], ref_state.exp_avg_sq.to_dict())
        torch.testing.assert_close(state.step[i], ref_state.step)


def test_optim_steps_inside_vmap_compile_fullgraph() -> None:
    d = _dict()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    out = torch.compile(lambda td: tt.vmap(lambda q: _train(q, x, 2, "adam"))(td), fullgraph=True, backend="eager")(
        _node(d, (N,))
    )
    _close(out, tt.vmap(lambda q: _train(q, x, 2, "adam"))(_node(d, (N,))).to_dict())


def test_optim_step_with_shared_params_and_per_sample_grads() -> None:
    """A vmap over samples with the parameters and state unmapped and the gradients mapped (MAML's
    inner step): the step's intermediates start unbatched and meet batched gradients."""
    d = _dict(lead=())
    params = _node(d)
    xs = torch.randn(4, 7, 3, generator=torch.Generator().manual_seed(3))
    state = optim.adam_init(params)

    def step(x: torch.Tensor) -> Any:
        return optim.adam(params, torch.func.grad(_loss)(params, x), state, lr=0.05)[0]

    def sgd_step(x: torch.Tensor) -> Any:
        g = torch.func.grad(_loss)(params, x)
        return optim.sgd(params, g, lr=0.1, momentum=0.9, momentum_state=params)[0]

    for fn in (step, sgd_step):
        out = torch.func.vmap(fn)(xs)
        ref = optree.tree_map(lambda *ts: torch.stack(ts), *[fn(x).to_dict() for x in xs])
        _close(out, ref)


# -- tdtree.vmap: arguments and outputs ---------------------------------------------------------


def test_keyword_arguments_are_passed_unmapped() -> None:
    d = _dict()
    td = _node(d, (N,))
    shift = _node({"w": torch.ones(3, 2), "n": {"b": torch.ones(2), "c": torch.ones(())}})
    out = tt.vmap(lambda q, scale, shift: q * scale + shift)(td, scale=torch.tensor(3.0), shift=shift)
    ref = torch.func.vmap(lambda p, scale, shift: optree.tree_map(lambda x, s: x * scale + s, p, shift))(
        d, scale=torch.tensor(3.0), shift=shift.to_dict()
    )
    _close(out, ref)


class Pair(NamedTuple):
    params: Any
    scale: torch.Tensor


def test_named_tuples_in_and_out() -> None:
    d = _dict()
    s = torch.arange(float(N))
    out = tt.vmap(lambda pair: Pair(pair.params * pair.scale, pair.scale + 1))(Pair(_node(d, (N,)), s))
    assert type(out) is Pair and out.params.batch_size == (N,)
    ref = torch.func.vmap(lambda pair: Pair(optree.tree_map(lambda x: x * pair.scale, pair.params), pair.scale + 1))(
        Pair(d, s)
    )
    _close(out.params, ref.params)
    torch.testing.assert_close(out.scale, ref.scale)


@tt.tensorclass
class Batch:
    obs: torch.Tensor
    extra: tt.TensorDict
    label: str = "train"


def test_tensorclass_in_and_out() -> None:
    g = torch.Generator().manual_seed(4)
    obs, z = torch.randn(N, 4, generator=g), torch.randn(N, 2, 3, generator=g)
    batch = Batch(obs=obs, extra=tt.TensorDict({"z": z}, [N, 2]), batch_size=[N])
    seen = []

    def f(b: Batch) -> Batch:
        seen.append((b.batch_size, b.extra.batch_size, b.obs.shape))
        return b.replace(obs=b.obs * 2 + b.extra["z"].sum())

    out = tt.vmap(f)(batch)
    assert seen == [((), (2,), (4,))]
    assert type(out) is Batch and out.label == "train"
    assert out.batch_size == (N,) and out.extra.batch_size == (N, 2)
    ref = torch.func.vmap(lambda o, zz: o * 2 + zz.sum())(obs, z)
    torch.testing.assert_close(out.obs, ref)
    torch.testing.assert_close(out.extra["z"], z)
    # out_dims places the mapped dim among the tensorclass's batch dims
    moved = tt.vmap(lambda b: b.extra, out_dims=1)(batch)
    assert moved.batch_size == (2, N) and torch.equal(moved["z"], z.transpose(0, 1))


def test_in_dims_as_pytree_prefixes() -> None:
    d = _dict()
    b = torch.randn(2)
    # a dict argument, one entry mapped and one not
    out = tt.vmap(lambda a: a["x"]["w"] * a["b"].sum(), in_dims=({"x": 0, "b": None},))({"x": _node(d, (N,)), "b": b})
    ref = torch.func.vmap(lambda a: a["x"]["w"] * a["b"].sum(), in_dims=({"x": 0, "b": None},))({"x": d, "b": b})
    torch.testing.assert_close(out, ref)
    # a node taking one in_dim inside a list, and a tensor mapped at dim 1
    t = torch.randn(2, N)
    out = tt.vmap(lambda xs, v: xs[0] * v.sum() + xs[1], in_dims=([0, None], 1))([_node(d, (N,)), 1.5], t)
    ref = torch.func.vmap(lambda p, v: optree.tree_map(lambda x: x * v.sum() + 1.5, p), in_dims=(0, 1))(d, t)
    _close(out, ref)


def test_out_dims_as_pytree_prefixes() -> None:
    d = _dict(lead=(N, 4))
    td = _node(d, (N, 4))
    out = tt.vmap(lambda q: {"node": q, "t": q["w"]}, out_dims={"node": 1, "t": -1})(td)
    assert out["node"].batch_size == (4, N) and torch.equal(out["node"]["w"], d["w"].movedim(0, 1))
    assert torch.equal(out["t"], d["w"].movedim(0, -1))
    a, b = tt.vmap(lambda q: (q, q["n"]), out_dims=(0, 1))(td)
    assert a.batch_size == (N, 4) and b.batch_size == (4, N)
    assert torch.equal(b["c"], d["n"]["c"].transpose(0, 1))


def test_sub_node_with_extra_batch_dims() -> None:
    td = tt.TensorDict({"s": tt.TensorDict({"c": torch.randn(N, 2, 6)}, [N, 2])}, [N])
    seen = []
    out = tt.vmap(lambda q: (seen.append(q["s"].batch_size), q)[1])(td)
    assert seen == [(2,)] and out["s"].batch_size == (N, 2)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda td: tt.vmap(lambda x: x, in_dims=1)(td),
            ValueError,
            r"in_dim 1 for argument 0, a node with batch_size \(5,\), is not one of its batch dims",
        ),
        (lambda td: tt.vmap(lambda x: x)(td[0]), ValueError, r"batch_size \(\).*use torch.func.vmap"),
        (lambda td: tt.vmap(lambda x: x, in_dims=(0, 0))(td), ValueError, "in_dims has 2 entries for 1 positional"),
        (lambda td: tt.vmap(lambda x: x, in_dims=[0])(td), ValueError, "in_dims must be an int, None or a tuple"),
        (
            lambda td: tt.vmap(lambda x: x, in_dims=({"w": 0},))(td),
            ValueError,
            r"gives \{'w': 0\} for argument 0, which is a node and takes one dim",
        ),
        (
            lambda td: tt.vmap(lambda x: x, in_dims=({"a": 0},))({"a": td, "b": td}),
            ValueError,
            r"argument 0, a dict with entries \['a', 'b'\]",
        ),
        (
            lambda td: tt.vmap(lambda x, lr: x * lr)(td, 0.1),
            ValueError,
            "in_dim 0 for argument 1, which is a float.*keyword argument",
        ),
        (
            lambda td: tt.vmap(lambda x, y: x)(td, torch.ones(4)),
            ValueError,
            "mapped dims differ in size: argument 0 has 5, argument 1 has 4",
        ),
        (lambda td: tt.vmap(lambda x: x, in_dims=(None,))(td), ValueError, "maps no node, tensorclass or tensor"),
        (lambda td: tt.vmap(lambda x: 1.0)(td), TypeError, "returned a float at the output"),
        (lambda td: tt.vmap(lambda x: {"r": "s"})(td), TypeError, r"returned a str at output\['r'\]"),
        (
            lambda td: tt.vmap(lambda x: x, out_dims=2)(td),
            ValueError,
            r"out_dim 2 for the output, a node with batch_size \(\) inside the function, is out of range",
        ),
        (
            lambda td: tt.vmap(lambda x: (x, x), out_dims=(0, 0, 0))(td),
            ValueError,
            "out_dims has 3 entries for 2 outputs",
        ),
        (
            lambda td: tt.vmap(lambda x: x["w"], out_dims=3)(td),
            ValueError,
            r"out_dim 3 for the output is out of range for a tensor of shape \(3, 2\)",
        ),
    ],
    ids=[
        "node-dim",
        "no-batch-dims",
        "in-dims-count",
        "in-dims-list",
        "node-prefix",
        "dict-entries",
        "float-mapped",
        "sizes",
        "nothing-mapped",
        "float-out",
        "str-out",
        "node-out-dim",
        "out-dims-count",
        "tensor-out-dim",
    ],
)
def test_errors_name_the_argument(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(_node(_dict(), (N,)))


def test_mapped_list_of_tensors_gives_a_node_output_its_size() -> None:
    out = tt.vmap(lambda xs: tt.TensorDict({"x": xs[0]}))([torch.ones(4, 2)])
    assert out.batch_size == (4,) and torch.equal(out["x"], torch.ones(4, 2))


# -- tags of what tdtree.vmap returns: the rule, with the arguments as inputs ------------------


@pytest.mark.parametrize("tag", ["locked", "shared"])
def test_tdtree_vmap_applies_the_tag_rule(tag: str) -> None:
    td = _node(_dict(), (N,))
    td = td.lock() if tag == "locked" else td.share_memory()
    tags = type(td)._tags
    assert type(tt.vmap(lambda q: q)(td))._tags == tags  # the input's own storage
    assert type(tt.vmap(lambda q: q["n"])(td))._tags == tags  # a view of it
    assert type(tt.vmap(lambda q: q[1:])(_node(_dict(lead=(N, 4)), (N, 4)).lock())) is tt.TensorDict[tt.Locked]
    assert type(tt.vmap(lambda q: q * 2)(td)) is tt.TensorDict  # new tensors
    assert type(tt.vmap(lambda q: q.clone())(td)) is tt.TensorDict
    kept, fresh = tt.vmap(lambda q: (q, q + 1))(td)
    assert type(kept)._tags == tags and type(fresh) is tt.TensorDict
    # an untagged input never gains tags, whatever the function does to its copy
    assert type(tt.vmap(lambda q: q)(_node(_dict(), (N,)))) is tt.TensorDict


def test_tdtree_vmap_hands_a_tagged_argument_over_with_its_tags() -> None:
    """The batched leaves wrap the argument's own storages, so by the rule the function gets the
    argument's tags: a Locked node refuses a functional edit inside as outside, and claims stay true."""
    td = tt.TensorDict({"a": torch.zeros(3, 2), "n": {"b": torch.ones(3)}}, [3]).share_memory()
    seen = []

    def f(q: tt.TensorDict) -> tt.TensorDict:
        seen.append((q.tags, q["n"].tags))
        with pytest.raises(tt.LockedError):
            q.set("a", q["a"] * 2)
        return q.unlock().set("a", q["a"] * 2)

    out = tt.vmap(f)(td)
    assert seen == [(frozenset({tt.Locked, tt.Shared}),) * 2]
    assert out.tags == frozenset()  # a new tensor at "a"
    torch.testing.assert_close(out["a"], torch.zeros(3, 2))
    plain = tt.TensorDict({"a": torch.zeros(3, 2)}, [3])
    tt.vmap(lambda q: seen.append(q.tags) or q)(plain)
    assert seen[-1] == frozenset()


def test_tdtree_vmap_rule_counts_nodes_in_containers_and_keywords_as_inputs() -> None:
    td = _node(_dict(), (N,)).lock()
    other = _node(_dict(lead=())).lock()
    # a view of a node inside a container argument keeps its tags
    kept = tt.vmap(lambda pair: pair[0], in_dims=((0, None),))((td, 1.0))
    assert type(kept) is tt.TensorDict[tt.Locked] and kept.batch_size == (N,)
    # a node passed as a keyword argument is an input too: returned unmapped, its leaves come back
    # expanded over the mapped dim, views of its storage
    out = tt.vmap(lambda q, other: other)(td, other=other)
    assert type(out) is tt.TensorDict[tt.Locked] and out.batch_size == (N,)
    assert out["n", "b"].untyped_storage().data_ptr() == other["n", "b"].untyped_storage().data_ptr()
    # an untagged input among them leaves no tags in common
    assert type(tt.vmap(lambda q, other: other)(td.unlock(), other=other)) is tt.TensorDict
