"""Laws for apply, operators, unary math, where and reductions.

For every op: the input is unchanged (tdtree.testing's purity law: structure,
leaf identity, ``_version``, values bit for bit), the result equals the torch op
applied leaf by leaf, and tags follow the storage rule on a locked input (the
tag law, plus: these ops make new storage, which drops ``Locked``; no data at
all keeps it). Reductions also satisfy the vmap and compile laws.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdtree as tt
from tdtree import Locked, TensorDict
from tdtree.testing import assert_equal, batch_sizes, check_compiles, check_vmap, tensordicts
from tdtree.testing.laws import assert_pure, assert_tags

from ._snapshot import assert_drops_tags

NUMERIC = (torch.float32, torch.int64)
nodes = tensordicts(extra_batch_dims=True, noncontiguous=True)
numeric_nodes = tensordicts(dtypes=NUMERIC, extra_batch_dims=True, noncontiguous=True)
float_nodes = tensordicts(dtypes=(torch.float32,), extra_batch_dims=True, noncontiguous=True)


def check(
    op: Callable[[TensorDict], Any], expected: Callable[[TensorDict], Any], td: TensorDict, tags: bool = True
) -> None:
    out = assert_pure(op, td)
    assert_equal(out, expected(td))
    if tags:
        assert_drops_tags(assert_tags(op, td.lock()))


SCALAR_OPS = {
    "add": operator.add,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "sub": operator.sub,
}


@given(numeric_nodes, st.sampled_from(sorted(SCALAR_OPS)), st.sampled_from([2, -3, 1.5]), st.booleans())
def test_scalar_ops(td, name, scalar, reflected):
    op = SCALAR_OPS[name]
    if reflected and name in ("truediv", "floordiv", "mod"):
        td = abs(td) + 1
    if reflected:
        check(lambda n: op(scalar, n), lambda n: tt.tree.map(lambda x: op(scalar, x), n), td)
    else:
        check(lambda n: op(n, scalar), lambda n: tt.tree.map(lambda x: op(x, scalar), n), td)


@given(nodes, st.sampled_from(["add", "mul", "eq", "ne", "lt", "ge"]), st.sampled_from([1, 2.5, True]))
def test_ops_on_bools_follow_torch_promotion(td, name, scalar):
    op = SCALAR_OPS[name]
    check(lambda n: op(n, scalar), lambda n: tt.tree.map(lambda x: op(x, scalar), n), td)


@given(numeric_nodes, st.sampled_from(sorted(SCALAR_OPS) + ["pow"]))
def test_node_with_node_pairs_by_key(td, name):
    op = SCALAR_OPS.get(name, operator.pow)
    other = abs(td) + 1
    out = assert_pure(op, td, other)
    assert_equal(out, tt.tree.map(op, td, other))
    assert assert_tags(op, td.lock(), other).tags == frozenset()  # no tag common to both inputs
    assert_drops_tags(assert_tags(op, td.lock(), other.lock()))


@given(st.data(), numeric_nodes, st.sampled_from(["add", "sub", "mul", "truediv", "lt"]), st.booleans())
def test_batch_tensor_acts_per_batch_element(data, td, name, reflected):
    op = SCALAR_OPS[name]
    n = td.ndim
    dropped = data.draw(st.integers(0, n))
    shape = [1 if data.draw(st.booleans()) else s for s in td.batch_size[dropped:]]
    t = torch.randn(shape) + 3

    def expected(node: TensorDict) -> TensorDict:
        def one(x: torch.Tensor) -> torch.Tensor:
            v = t.reshape((*shape, *[1] * (x.ndim - n)))
            return op(v, x) if reflected else op(x, v)

        return tt.tree.map(one, node)

    check((lambda node: op(t, node)) if reflected else (lambda node: op(node, t)), expected, td)


UNARY = ["abs", "exp", "log", "sqrt", "sigmoid", "tanh", "neg", "sign"]


@given(float_nodes, st.sampled_from(UNARY))
def test_unary_math(td, name):
    check(lambda n: getattr(n, name)(), lambda n: tt.tree.map(getattr(torch, name), n), td)


@given(numeric_nodes, st.sampled_from([(-1, 1), (0, None), (None, 2.5)]))
def test_clamp(td, bounds):
    lo, hi = bounds
    check(lambda n: n.clamp(lo, hi), lambda n: tt.tree.map(lambda x: torch.clamp(x, lo, hi), n), td)


@given(numeric_nodes, st.booleans())
def test_where(td, scalar_other):
    cond = td > 0
    other: Any = 0.5 if scalar_other else -td
    expected_other = (lambda x, y: 0.5) if scalar_other else (lambda x, y: y)
    check(
        lambda n: tt.where(cond, n, other),
        lambda n: tt.tree.map(lambda x, c, y: torch.where(c, x, expected_other(x, y)), n, cond, -td),
        td,
        tags=False,
    )
    locked_other = other if scalar_other else other.lock()
    assert_drops_tags(assert_tags(tt.where, cond.lock(), td.lock(), locked_other))


@given(numeric_nodes)
def test_apply_is_map_and_keeps_tags_for_identity(td):
    check(lambda n: n.apply(lambda x: x * 2), lambda n: tt.tree.map(lambda x: x * 2, n), td)
    locked = td.lock()
    same = assert_tags(lambda n: n.apply(lambda x: x), locked)
    assert same.tags == frozenset({Locked})
    for x, y in zip(tt.tree.leaves(same), tt.tree.leaves(td)):
        assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


@given(numeric_nodes)
def test_named_apply_sees_nested_keys(td):
    keys = list(td.keys(include_nested=True, leaves_only=True))
    seen: list[Any] = []

    def fn(key: Any, x: torch.Tensor) -> torch.Tensor:
        seen.append(key)
        return x + 1

    check(lambda n: n.named_apply(fn), lambda n: tt.tree.map(lambda x: x + 1, n), td)
    assert seen[: len(keys)] == keys


REDUCTIONS = {
    "sum": torch.sum,
    "mean": torch.mean,
    "amax": torch.amax,
    "amin": torch.amin,
    "all": torch.all,
    "any": torch.any,
}


@given(st.data(), st.sampled_from(sorted(REDUCTIONS)), st.booleans())
def test_reductions_over_batch_dims(data, name, keepdim):
    sizes = batch_sizes(min_dims=1, min_side=1)
    td = data.draw(tensordicts(sizes, dtypes=(torch.float32,), extra_batch_dims=True, noncontiguous=True))
    n = td.ndim
    dims = tuple(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))))
    dim: Any = dims[0] if len(dims) == 1 and data.draw(st.booleans()) else dims
    fn = REDUCTIONS[name]
    out = assert_pure(lambda n: getattr(n, name)(dim, keepdim=keepdim), td)
    expected = [fn(x, dim=dims, keepdim=keepdim) for x in tt.tree.leaves(td)]
    for got, want in zip(tt.tree.leaves(out), expected, strict=True):
        assert_equal(got, want)
    kept = [1 if i in dims else s for i, s in enumerate(td.batch_size)]
    assert out.batch_size == torch.Size(kept if keepdim else [s for i, s in enumerate(td.batch_size) if i not in dims])
    assert_drops_tags(assert_tags(lambda n: getattr(n, name)(dim, keepdim=keepdim), td.lock()))


REDUCED = tensordicts(
    batch_sizes(min_dims=2, max_dims=2, min_side=1),
    dtypes=(torch.float32,),
    min_keys=1,
    empty_nodes=False,
    extra_batch_dims=True,
)


@pytest.mark.parametrize("name", ["sum", "mean", "amax"])
def test_reductions_over_a_batch_dim_vmap_and_compile(name):
    # the reduction over batch dim 0 of each slice is the reduction over dim 1 of the node
    check_vmap(lambda n: getattr(n, name)(0), REDUCED)
    check_compiles(lambda n: getattr(n, name)(1), REDUCED, backend="eager", settings=settings(max_examples=2))


@given(tensordicts(batch_sizes(min_side=1), dtypes=(torch.float32, torch.int64), extra_batch_dims=True))
def test_sum_without_dim_reduces_every_root_batch_dim(td):
    out = assert_pure(lambda n: n.sum(), td)
    assert out.batch_size == torch.Size(())
    dims = tuple(range(td.ndim))
    for got, x in zip(tt.tree.leaves(out), tt.tree.leaves(td), strict=True):
        assert_equal(got, torch.sum(x, dim=dims) if dims else torch.sum(x.unsqueeze(0), dim=0))


@given(nodes)
def test_all_any_without_dim_look_at_every_element(td):
    leaves = tt.tree.leaves(td)
    assert bool(td.all()) == all(bool(x.all()) for x in leaves)
    assert bool(td.any()) == any(bool(x.any()) for x in leaves)
