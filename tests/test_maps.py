"""Examples for apply/named_apply, operators, unary math, where and reductions, with their errors."""

from __future__ import annotations

import operator

import pytest
import torch

import tdtree as tt
from tdtree import Locked, TensorDict
from tdtree.errors import BatchSizeError, KeyMismatchError
from tdtree.testing import assert_close, assert_equal


def flat() -> TensorDict:
    return TensorDict({"a": torch.arange(12.0).reshape(4, 3), "i": torch.arange(4)}, [4])


def nested() -> TensorDict:
    return TensorDict(
        {"a": torch.arange(12.0).reshape(4, 3) - 5, "sub": {"c": torch.linspace(-1, 1, 40).reshape(4, 2, 5)}},
        [4],
    )


def extra() -> TensorDict:
    """A sub-node with one more batch dim than the root."""
    inner = TensorDict({"x": torch.arange(24.0).reshape(4, 2, 3)}, [4, 2])
    return TensorDict({"a": torch.ones(4, 3), "sub": inner}, [4])


def leafwise(fn, td: TensorDict) -> TensorDict:
    return tt.tree.map(fn, td)


# -- apply and named_apply ---------------------------------------------------------------


def test_apply_maps_every_leaf():
    td = nested()
    assert_equal(td.apply(lambda x: x * 2), leafwise(lambda x: x * 2, td))


def test_apply_pairs_others_by_key():
    td = nested()
    assert_equal(td.apply(lambda x, y: x - y, td), leafwise(torch.zeros_like, td))


def test_apply_pairs_other_with_different_tags():
    td = nested()
    out = td.apply(lambda x, y: x + y, td.lock())
    assert_equal(out, leafwise(lambda x: x * 2, td))


def test_apply_with_batch_size_sets_root_and_keeps_extra_dims():
    td = extra()
    out = td.apply(lambda x: x[0], batch_size=())
    assert out.batch_size == torch.Size(())
    assert out["sub"].batch_size == torch.Size([2])
    assert_equal(out["sub", "x"], td["sub", "x"][0])


def test_apply_identity_keeps_tags_and_leaves():
    td = nested().lock()
    out = td.apply(lambda x: x)
    assert out.tags == frozenset({Locked})
    assert out["a"] is td["a"]


def test_apply_key_mismatch_names_keys():
    with pytest.raises(KeyMismatchError, match=r"apply: .*only in the first: 'i'; only in the second: none\.$"):
        flat().apply(lambda x, y: x + y, flat().exclude("i"))


def test_apply_batch_mismatch_names_shapes():
    other = TensorDict({"a": torch.zeros(2, 3), "i": torch.zeros(2)}, [2])
    with pytest.raises(BatchSizeError, match=r"apply: batch_size \(4,\) at the root does not match \(2,\)"):
        flat().apply(lambda x, y: x + y, other)


def test_named_apply_keys_spelled_as_in_keys():
    td = nested()
    seen = []
    td.named_apply(lambda k, x: seen.append(k) or x)
    assert seen == list(td.keys(include_nested=True, leaves_only=True))
    assert seen == ["a", ("sub", "c")]


def test_named_apply_with_others():
    td = nested()
    out = td.named_apply(lambda k, x, y: x + y if k == "a" else x, td)
    assert_equal(out["a"], td["a"] * 2)
    assert_equal(out["sub", "c"], td["sub", "c"])


# -- binary operators ---------------------------------------------------------------------

OPS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}


@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
@pytest.mark.parametrize("scalar", [2, 1.5], ids=["int", "float"])
def test_scalar_both_sides(op, scalar):
    td = nested() + 6
    assert_equal(op(td, scalar), leafwise(lambda x: op(x, scalar), td))
    assert_equal(op(scalar, td), leafwise(lambda x: op(scalar, x), td))


@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_node_with_node(op):
    td, other = nested() + 6, nested() * 0.5 + 1
    assert_equal(op(td, other), tt.tree.map(op, td, other))


@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_batch_tensor_both_sides(op):
    td = nested() + 6
    t = torch.arange(1.0, 5.0)
    expected_l = tt.tree.map(lambda x: op(x, t.reshape(4, *[1] * (x.ndim - 1))), td)
    expected_r = tt.tree.map(lambda x: op(t.reshape(4, *[1] * (x.ndim - 1)), x), td)
    assert_equal(op(td, t), expected_l)
    assert_equal(op(t, td), expected_r)


def test_tensor_broadcasts_to_batch_size_aligned_right():
    td = TensorDict({"x": torch.ones(2, 3, 5)}, [2, 3])
    t = torch.tensor([1.0, 2.0, 3.0])
    assert_equal((td * t)["x"], torch.ones(2, 3, 5) * t.reshape(3, 1))


def test_zero_dim_tensor_acts_as_scalar_for_dtype():
    td = TensorDict({"x": torch.ones(3, dtype=torch.int8)}, [3])
    assert (td + torch.tensor(1))["x"].dtype == torch.int8


def test_tensor_extra_batch_dims_of_sub_node_treated_as_features():
    td = extra()
    t = torch.arange(4.0)
    assert_equal((td * t)["sub", "x"], td["sub", "x"] * t.reshape(4, 1, 1))


def test_eq_returns_node_of_bools():
    td = nested()
    out = td == td
    assert isinstance(out, TensorDict)
    assert out["sub", "c"].dtype == torch.bool
    assert bool(out.all())


def test_unary_operators():
    td = nested()
    assert_equal(-td, leafwise(operator.neg, td))
    assert_equal(abs(td), leafwise(abs, td))


def test_arithmetic_drops_tags():
    td = nested().lock()
    assert (td + 0).tags == frozenset()
    assert (td == td).tags == frozenset()


def test_nodes_pair_whatever_tags():
    td = nested()
    assert_equal(td + td.lock(), td * 2)


def test_key_mismatch_names_keys():
    with pytest.raises(KeyMismatchError, match=r"add: .*only in the first: 'i'; only in the second: none\.$"):
        flat() + flat().exclude("i")


def test_key_mismatch_leaf_against_empty_node():
    left = TensorDict({"a": torch.zeros(2)}, [2])
    right = TensorDict({"a": {}}, [2])
    with pytest.raises(KeyMismatchError, match=r"only in the first: 'a';"):
        left + right


def test_batch_size_mismatch_names_shapes():
    other = TensorDict({"a": torch.zeros(1, 3), "i": torch.zeros(1)}, [1])
    with pytest.raises(BatchSizeError, match=r"mul: batch_size \(4,\) at the root does not match \(1,\)"):
        flat() * other


def test_sub_node_batch_mismatch_names_key():
    other = TensorDict({"a": torch.ones(4, 3), "sub": TensorDict({"x": torch.ones(4, 3)}, [4])}, [4])
    with pytest.raises(BatchSizeError, match=r"at 'sub' does not match \(4,\)"):
        extra() + other


def test_tensor_that_does_not_fit_batch_names_shapes():
    with pytest.raises(
        BatchSizeError, match=r"tensor operand of shape \(3,\) does not broadcast to the batch_size \(4,\)"
    ):
        flat() + torch.ones(3)
    with pytest.raises(BatchSizeError, match=r"shape \(4, 3\) does not broadcast to the batch_size \(4,\)"):
        torch.ones(4, 3) - flat()


def test_unsupported_operand_is_type_error():
    with pytest.raises(TypeError, match="unsupported operand"):
        flat() + "x"
    assert (flat() == "x") is False


def test_torch_errors_pass_through():
    td = TensorDict({"b": torch.ones(2, dtype=torch.bool)}, [2])
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
        td - 1


def test_empty_node_ops():
    td = TensorDict({}, [3])
    assert (td + 1).keys() == td.keys()
    assert (td + td).batch_size == torch.Size([3])
    assert (-td).batch_size == torch.Size([3])


def test_nodes_hash_by_identity():
    td = flat()
    assert {td: 1}[td] == 1


# -- unary math -----------------------------------------------------------------------------

UNARY = ["abs", "exp", "log", "sqrt", "sigmoid", "tanh", "neg", "sign"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_math(name):
    td = nested()
    assert_equal(getattr(td, name)(), leafwise(getattr(torch, name), td))


def test_clamp_and_pow():
    td = nested()
    assert_equal(td.clamp(-1, 2), leafwise(lambda x: x.clamp(-1, 2), td))
    assert_equal(td.clamp(min=0), leafwise(lambda x: x.clamp(min=0), td))
    assert_equal(td.pow(2), leafwise(lambda x: x**2, td))


def test_pow_of_an_unsupported_exponent_raises_type_error():
    # the method, unlike the ``**`` operator it shares a body with, cannot hand back NotImplemented
    with pytest.raises(TypeError, match="pow takes a number, tensor or node as exponent, got str"):
        nested().pow("x")


def test_clamp_without_bounds_is_torch_error():
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max' must not be None"):
        nested().clamp()


# -- where ------------------------------------------------------------------------------------


def test_where_node_condition_and_scalar():
    td = nested()
    assert_equal(tt.where(td > 0, td, 0.0), leafwise(lambda x: torch.where(x > 0, x, 0.0), td))


def test_where_method_and_tensor_condition():
    td = nested()
    cond = torch.tensor([True, False, True, False])
    out = td.where(cond, -td)
    assert_equal(out["sub", "c"], torch.where(cond.reshape(4, 1, 1), td["sub", "c"], -td["sub", "c"]))


def test_where_scalars_take_structure_of_condition():
    td = nested()
    out = tt.where(td > 0, 1.0, 0.0)
    assert_equal(out, leafwise(lambda x: torch.where(x > 0, 1.0, 0.0), td))


def test_where_errors():
    with pytest.raises(TypeError, match="needs a node or tensorclass among its arguments"):
        tt.where(torch.tensor(True), 1.0, 0.0)
    with pytest.raises(TypeError, match="where takes nodes, tensors or numbers, got str"):
        tt.where(nested() > 0, nested(), "x")
    with pytest.raises(KeyMismatchError, match="where: "):
        tt.where(flat() > 0, nested(), 0.0)


# -- reductions ------------------------------------------------------------------------------

REDUCTIONS = ["sum", "mean", "amax", "amin"]


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduce_all_batch_dims(name):
    td = TensorDict({"x": torch.randn(2, 3, 4), "s": {"y": torch.randn(2, 3)}}, [2, 3])
    out = getattr(td, name)()
    assert out.batch_size == torch.Size(())
    assert_close(out["x"], getattr(torch, name)(td["x"], dim=(0, 1)))
    assert_close(out["s", "y"], getattr(torch, name)(td["s", "y"], dim=(0, 1)))


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("dim", [0, -1, (0, 1)], ids=["0", "-1", "both"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_dims(name, dim, keepdim):
    td = TensorDict({"x": torch.randn(2, 3, 4)}, [2, 3])
    out = getattr(td, name)(dim, keepdim=keepdim)
    leaf_dim = 1 if dim == -1 else dim  # -1 is the last batch dim, which is the leaf's dim 1
    expected = getattr(torch, name)(td["x"], dim=leaf_dim, keepdim=keepdim)
    assert_close(out["x"], expected)
    assert out.batch_size == expected.shape[: expected.ndim - 1]


def test_reduce_keeps_extra_dims_of_sub_node():
    out = extra().sum()
    assert out["sub"].batch_size == torch.Size([2])
    assert_equal(out["sub", "x"], extra()["sub", "x"].sum(0))


def test_reduce_over_empty_batch_is_identity_in_value_and_torch_in_dtype():
    td = TensorDict({"b": torch.tensor([True, False])}, [])
    out = td.sum()
    assert_equal(out["b"], torch.tensor([1, 0]))
    with pytest.raises(RuntimeError, match="mean"):
        TensorDict({"i": torch.arange(3)}, []).mean()


def test_all_any_without_dim_give_one_bool_tensor():
    td = TensorDict({"a": torch.tensor([True, True]), "s": {"b": torch.tensor([[True], [False]])}}, [2])
    assert isinstance(td.all(), torch.Tensor) and td.all().ndim == 0
    assert not td.all()
    assert td.any()
    assert bool(TensorDict({}, [2]).all()) and not bool(TensorDict({}, [2]).any())


def test_all_any_with_dim_give_nodes():
    td = TensorDict({"a": torch.tensor([[True, False], [True, True]])}, [2, 2])
    assert_equal(td.all(1)["a"], torch.tensor([False, True]))
    assert_equal(td.any(0, keepdim=True)["a"], torch.tensor([[True, True]]))


def test_reduce_bad_dims():
    td = TensorDict({"x": torch.randn(2, 3, 4)}, [2, 3])
    with pytest.raises(
        IndexError, match=r"sum: dim 2 is out of range for the batch_size \(2, 3\) \(batch dims are -2..1"
    ):
        td.sum(2)
    with pytest.raises(IndexError, match=r"mean: dim \(0, -2\) names a batch dim twice"):
        td.mean((0, -2))
    with pytest.raises(IndexError, match=r"amax: dim 0 given, but the batch_size is \(\)"):
        TensorDict({"x": torch.ones(3)}, []).amax(0)
    with pytest.raises(IndexError, match=r"any: dim 'a' is out of range"):
        td.any("a")


def test_reductions_drop_tags():
    td = nested().lock()
    assert td.sum().tags == frozenset()
    assert td.amax(0).tags == frozenset()


def test_bool_of_node_still_raises():
    with pytest.raises(RuntimeError, match="truth value of a TensorDict is ambiguous"):
        bool(flat() == flat())


def test_detach_shares_storage_drops_autograd_and_keeps_tags():
    w = torch.randn(4, 3, requires_grad=True)
    td = TensorDict({"w": w * 2, "s": {"p": torch.nn.Parameter(torch.ones(4))}}, [4])
    out = td.detach()
    for key in (("w",), ("s", "p")):
        expected = td[key].detach()
        assert_equal(out[key], expected)
        assert type(out[key]) is torch.Tensor and not out[key].requires_grad
        assert out[key].data_ptr() == td[key].data_ptr()
    assert out.batch_size == td.batch_size and out["s"].batch_size == td["s"].batch_size
    locked = td.lock()
    assert locked.detach().tags == locked.tags and locked.detach()["s"].tags == locked.tags
    assert td["w"].requires_grad  # the input is unchanged


def _batched() -> TensorDict:
    return TensorDict({"x": torch.randn(2, 3, 4), "s": TensorDict({"y": torch.randn(2, 3, 5)}, [2, 3, 5])}, [2, 3])


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_with_dim_give_values_and_indices_as_torch(name, dim, keepdim):
    td = _batched().lock()
    before = {k: v.clone() for k, v in td.items(True, True)}
    out = getattr(td, name)(dim, keepdim=keepdim)
    assert type(out) is getattr(torch.return_types, name)
    d = dim % 2
    for k, v in before.items():
        want = getattr(torch, name)(v, d, keepdim)
        assert_equal(out.values[k], want.values)
        assert_equal(out.indices[k], want.indices)
        assert_equal(td[k], v)
    assert out.values.batch_size == out.indices.batch_size == want.values.shape[: 2 - (not keepdim)]
    assert out.values.tags == out.indices.tags == frozenset()


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_without_dim_are_amax_amin_over_batch_dims(name):
    td = _batched()
    out = getattr(td, name)()
    for k, v in td.items(True, True):
        assert_equal(out[k], getattr(torch, "a" + name)(v, dim=(0, 1)))
    with pytest.raises(TypeError, match=rf"{name}: dim is one batch dim \(an int\), got \(0, 1\)"):
        getattr(td, name)((0, 1))
    with pytest.raises(IndexError, match=rf"{name}: dim 2 is out of range"):
        getattr(td, name)(2)


def test_max_inside_vmap():
    x = torch.randn(4, 2, 3)
    out = tt.vmap(lambda n: n.max(0))(TensorDict({"x": x}, [4, 2]))
    assert_equal(out.values["x"], x.max(1).values)
    assert_equal(out.indices["x"], x.max(1).indices)
    got = torch.func.vmap(lambda a: TensorDict({"x": a}, [2]).min(0).indices["x"])(x)
    assert_equal(got, x.min(1).indices)


@pytest.mark.parametrize("name", REDUCTIONS + ["max", "min"])
def test_reduce_without_batch_dims_gives_a_new_node_of_the_same_values(name):
    td = TensorDict({"x": torch.randn(3), "s": {"y": torch.randn(2, 2)}}, []).lock()
    out = getattr(td, name)()
    for k, v in td.items(True, True):
        assert_equal(out[k], v)
        assert out[k].data_ptr() != v.data_ptr()
    assert out.tags == frozenset()


def test_norm_is_each_leafs_vector_norm():
    td = _batched().lock()
    for p in (2.0, 1.0, float("inf")):
        out = td.norm(p)
        assert out.batch_size == out["s"].batch_size == torch.Size(())
        for k, v in td.items(True, True):
            assert_equal(out[k], torch.linalg.vector_norm(v, p))
    assert td.norm().tags == frozenset()
    x = torch.randn(4, 2, 3)
    got = tt.vmap(lambda n: n.norm())(TensorDict({"x": x}, [4, 2]))
    assert_close(got["x"], torch.linalg.vector_norm(x, dim=(1, 2)))
    with pytest.raises(TypeError, match=r"norm: the leaf \('s', 'i'\) has dtype torch.int64"):
        TensorDict({"s": {"i": torch.arange(3)}}, []).norm()
