"""``tdtree.func.grad`` / ``grad_and_value``: torch.func's over a node's leaves, flattened once.

Checked against ``torch.func.grad`` / ``grad_and_value`` of the same function over the same node and
over plain dicts of tensors (values and gradients bitwise equal), with argnums as an int, a
negative int and a tuple, auxiliary outputs, keyword arguments, inside ``torch.func.vmap``; the
inputs unchanged; tags as torch.func gives them (the function and the gradients get untagged nodes).
"""

from __future__ import annotations

from typing import Any

import optree
import pytest
import torch

import tdtree as tt
import tdtree.func


def _params() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "layer": {"weight": torch.randn(4, 3, generator=g), "bias": torch.randn(4, generator=g)},
        "head": {"w": torch.randn(2, 4, generator=g), "deep": {"s": torch.randn((), generator=g)}},
    }


def _batch() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(5, 3, generator=g), "y": {"target": torch.randn(5, 2, generator=g)}}


def _loss(p: Any, b: Any, scale: float = 1.0) -> torch.Tensor:
    h = torch.tanh(b["x"] @ p["layer"]["weight"].T + p["layer"]["bias"])
    out = h @ p["head"]["w"].T * p["head"]["deep"]["s"]
    return scale * ((out - b["y"]["target"]) ** 2).mean()


def _leaves(tree: Any) -> list[torch.Tensor]:
    return tt.tree.leaves(tree)


def _assert_bitwise(got: Any, want: Any) -> None:
    g, w = _leaves(got), _leaves(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _snapshot(tree: Any) -> list[tuple[torch.Tensor, int]]:
    return [(x.clone(), x._version) for x in _leaves(tree)]


def _assert_unchanged(tree: Any, before: list[tuple[torch.Tensor, int]]) -> None:
    for x, (value, version) in zip(_leaves(tree), before):
        assert torch.equal(x, value) and x._version == version


def test_grad_equals_torch_func_over_dicts_and_over_the_node() -> None:
    params, batch = tt.TensorDict(_params()), tt.TensorDict(_batch(), [5])
    before = _snapshot(params) + _snapshot(batch)
    got = tdtree.func.grad(_loss)(params, batch)
    assert type(got) is tt.TensorDict and got.keys(True, True) == params.keys(True, True)
    assert got.batch_size == params.batch_size
    _assert_bitwise(got, torch.func.grad(_loss)(_params(), _batch()))
    _assert_bitwise(got, torch.func.grad(_loss)(params, batch))
    _assert_unchanged(params, before[: len(_leaves(params))])
    _assert_unchanged(batch, before[len(_leaves(params)) :])


def test_grad_and_value_returns_torch_funcs_value() -> None:
    params, batch = tt.TensorDict(_params()), tt.TensorDict(_batch(), [5])
    grads, value = tdtree.func.grad_and_value(_loss)(params, batch, scale=3.0)
    want_grads, want_value = torch.func.grad_and_value(_loss)(_params(), _batch(), scale=3.0)
    _assert_bitwise(grads, want_grads)
    assert torch.equal(value, want_value) and not value.requires_grad


@pytest.mark.parametrize("argnums", [(0, 1), (1, 0), (-1, 0)])
def test_argnums_tuple_gives_a_tuple_of_gradients(argnums: tuple[int, ...]) -> None:
    params, batch = tt.TensorDict(_params()), tt.TensorDict(_batch(), [5])
    got = tdtree.func.grad(_loss, argnums=argnums)(params, batch)
    want = torch.func.grad(_loss, argnums=argnums)(_params(), _batch())
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        _assert_bitwise(g, w)
    which = [n % 2 for n in argnums].index(1)  # the batch's gradient
    assert got[which].batch_size == torch.Size([5]) and got[1 - which].batch_size == torch.Size([])


def test_negative_argnum_and_a_tensor_argument() -> None:
    params, x = tt.TensorDict(_params()), torch.randn(5, 3)
    batch = {"x": x, "y": {"target": torch.zeros(5, 2)}}

    def f(p: Any, x: torch.Tensor) -> torch.Tensor:
        return _loss(p, {**batch, "x": x})

    got = tdtree.func.grad(f, argnums=-1)(params, x)
    assert torch.equal(got, torch.func.grad(f, argnums=-1)(_params(), x))


def test_a_tree_of_nodes_and_tensors_as_the_argument() -> None:
    params = tt.TensorDict(_params())
    tree = {"net": params, "extra": (torch.tensor(2.0), None)}

    def f(t: Any, b: Any) -> torch.Tensor:
        return _loss(t["net"], b) * t["extra"][0]

    got = tdtree.func.grad(f)(tree, _batch())
    want = torch.func.grad(f)({"net": _params(), "extra": (torch.tensor(2.0),)}, _batch())
    assert type(got["net"]) is tt.TensorDict and got["extra"][1] is None  # an empty subtree, as in tdtree.tree
    with pytest.raises(ValueError, match="must be Tensor"):  # torch's pytree reads None as a leaf
        torch.func.grad(f)({"net": _params(), "extra": (torch.tensor(2.0), None)}, _batch())
    _assert_bitwise(got["net"], want["net"])
    assert torch.equal(got["extra"][0], want["extra"][0])


def test_has_aux_returns_the_aux_as_torch_func_does() -> None:
    params, batch = tt.TensorDict(_params()), tt.TensorDict(_batch(), [5])

    def f(p: Any, b: Any) -> tuple[torch.Tensor, Any]:
        loss = _loss(p, b)
        return loss, {"loss": loss, "scaled": b["x"] * 2}

    (grads, aux), (want_grads, want_aux) = (
        tdtree.func.grad(f, has_aux=True)(params, batch),
        torch.func.grad(f, has_aux=True)(_params(), _batch()),
    )
    _assert_bitwise(grads, want_grads)
    assert torch.equal(aux["loss"], want_aux["loss"]) and torch.equal(aux["scaled"], want_aux["scaled"])
    (_, (value, aux2)) = tdtree.func.grad_and_value(f, has_aux=True)(params, batch)
    assert torch.equal(value, want_aux["loss"]) and torch.equal(aux2["scaled"], want_aux["scaled"])


def test_inside_vmap_per_sample_gradients() -> None:
    params, batch = tt.TensorDict(_params()), _batch()

    def one(p: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _loss(p, {"x": x[None], "y": {"target": y[None]}})

    got = torch.func.vmap(tdtree.func.grad(one), in_dims=(None, 0, 0))(params, batch["x"], batch["y"]["target"])
    want = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(_params(), batch["x"], batch["y"]["target"])
    _assert_bitwise(got, want)


def test_tags_as_torch_func_gives_them() -> None:
    """The function is handed untagged nodes (rebuilt from leaves) and the gradients are untagged,
    as with torch.func.grad; the tagged input keeps its tags."""
    params = tt.TensorDict(_params()).lock()
    seen = []

    def f(p: Any) -> torch.Tensor:
        seen.append(type(p))
        return _loss(p, _batch())

    got = tdtree.func.grad(f)(params)
    torch.func.grad(f)(params)
    assert seen == [tt.TensorDict, tt.TensorDict]
    assert type(got) is tt.TensorDict and type(got["head"]) is tt.TensorDict
    assert params.tags == frozenset({tt.Locked})
    _assert_bitwise(got, torch.func.grad(_loss)(_params(), _batch()))


def test_batched_node_keeps_its_batch_size() -> None:
    params = tt.TensorDict({"w": torch.randn(3, 2), "n": {"v": torch.randn(3)}}, [3])

    def f(p: Any) -> torch.Tensor:
        return (p["w"].sum(-1) * p["n"]["v"]).sum()

    got = tdtree.func.grad(f)(params)
    assert got.batch_size == torch.Size([3]) and got["n"].batch_size == torch.Size([3])
    _assert_bitwise(got, torch.func.grad(f)({"n": {"v": params["n", "v"]}, "w": params["w"]}))


@pytest.mark.parametrize("argnums", [2, -3, (0, 0), ()])
def test_bad_argnums_raise_runtime_error_as_torch_func(argnums: Any) -> None:
    params = tt.TensorDict(_params())
    with pytest.raises(RuntimeError):
        torch.func.grad(_loss, argnums=argnums)(_params(), _batch())
    with pytest.raises(RuntimeError, match="argnum"):
        tdtree.func.grad(_loss, argnums=argnums)(params, _batch())


def _same_grads_and_flags(got: Any, want: Any) -> None:
    _assert_bitwise(got, want)
    assert [x.requires_grad for x in _leaves(got)] == [x.requires_grad for x in _leaves(want)]


def test_inputs_requiring_grad_give_gradients_differentiable_as_torch_funcs() -> None:
    """from_module's parameters require grad: torch.func's gradients are then differentiable with
    respect to them, and so are these (second derivatives equal)."""
    source = optree.tree_map(lambda x: x.requires_grad_(), _params())
    params = tt.TensorDict(source)
    got = tdtree.func.grad(_loss)(params, _batch())
    want = torch.func.grad(_loss)(source, _batch())
    _same_grads_and_flags(got, want)
    w = source["layer"]["weight"]
    (a,) = torch.autograd.grad(got["head", "w"].sum(), w)
    (b,) = torch.autograd.grad(want["head"]["w"].sum(), w)
    assert torch.equal(a, b)


def test_a_closure_requiring_grad_keeps_the_gradients_differentiable() -> None:
    scale = torch.tensor(1.5, requires_grad=True)
    params, batch = tt.TensorDict(_params()), _batch()

    def f(p: Any) -> torch.Tensor:
        return _loss(p, batch) * scale

    grads, value = tdtree.func.grad_and_value(f)(params)
    want_grads, want_value = torch.func.grad_and_value(f)(_params())
    _same_grads_and_flags(grads, want_grads)
    assert torch.equal(value, want_value) and value.requires_grad == want_value.requires_grad
    (a,) = torch.autograd.grad(grads["layer", "bias"].sum(), scale)
    (b,) = torch.autograd.grad(want_grads["layer"]["bias"].sum(), scale)
    assert torch.equal(a, b)
    with torch.no_grad():  # no graph outside: plain gradients, as torch.func gives them
        _same_grads_and_flags(tdtree.func.grad(f)(params), torch.func.grad(f)(_params()))


def test_unused_inputs_and_constant_values_give_zeros() -> None:
    params = tt.TensorDict(_params())
    got = tdtree.func.grad(lambda p: p["head"]["w"].sum())(params)
    _same_grads_and_flags(got, torch.func.grad(lambda p: p["head"]["w"].sum())(_params()))
    got = tdtree.func.grad(lambda p: torch.tensor(3.0))(params)
    _same_grads_and_flags(got, torch.func.grad(lambda p: torch.tensor(3.0))(_params()))


def test_grad_of_grad_equals_torch_funcs() -> None:
    params = tt.TensorDict({"w": torch.randn(3), "n": {"v": torch.randn(3)}})

    def f(p: Any) -> torch.Tensor:
        return (p["w"].sin() * p["n"]["v"]).sum()

    def outer(g: Any) -> Any:
        return lambda p: g(f)(p)["w"].sum()

    got = tdtree.func.grad(outer(tdtree.func.grad))(params)
    want = torch.func.grad(outer(torch.func.grad))({"n": {"v": params["n"]["v"]}, "w": params["w"]})
    _same_grads_and_flags(got, want)


@pytest.mark.parametrize(
    ("f", "has_aux"),
    [(lambda p: p["head"]["w"], False), (lambda p: 1.0, False), (lambda p: p["head"]["w"].sum(), True)],
    ids=["not a scalar", "not a tensor", "aux without a pair"],
)
def test_bad_outputs_raise_as_torch_func(f: Any, has_aux: bool) -> None:
    with pytest.raises(RuntimeError) as want:
        torch.func.grad(f, has_aux=has_aux)(_params())
    with pytest.raises(RuntimeError) as got:
        tdtree.func.grad(f, has_aux=has_aux)(tt.TensorDict(_params()))
    assert str(got.value) == str(want.value)


def test_under_torch_compile_equals_eager() -> None:
    torch._dynamo.reset()
    params, batch = tt.TensorDict(_params()), tt.TensorDict(_batch(), [5])
    compiled = torch.compile(tdtree.func.grad(_loss), fullgraph=True, backend="aot_eager")
    got = compiled(params, batch)
    assert type(got) is tt.TensorDict
    torch.testing.assert_close(_leaves(got), _leaves(tdtree.func.grad(_loss)(params, batch)))
