"""Indexing, shape, combining, maps and devices: the DESIGN section 4 operations.

Names follow tensordict's benchmarks/common/common_ops_test.py where it has
the case; the others (arithmetic, ``*_like``, permute, squeeze, ``to``) are
tdtree's additions on the same data. Until an operation lands in tdtree its
row is skipped with "tdtree has no <op> yet"; the other rows still run.
"""

from __future__ import annotations

import pytest
import torch

from .impls import Impl, big_nested, big_td, nested_key, small_td

LAST_LEAF = (*nested_key(19), "t")
LAST_NODE = nested_key(19)

INDICES = {
    "int": 1,
    "slice_int": (slice(None), 1),
    "range": range(2),
    "tuple": (2, 1),
    "list": [0, 1],
    "tensor": torch.tensor([0, 2]),
    "mask": torch.tensor([True, False, True]),
    "ellipsis": (..., 1),
    "none": (None, slice(None), 1),
    "separated_tensors": (torch.tensor([0, 2]), None, torch.tensor([1, 0])),
}
# Per leaf, ``...`` would reach the feature dims; on the (3, 4) batch it means this.
PYTREE_INDICES = {"ellipsis": (slice(None), 1)}


def _a(out: object) -> torch.Tensor:
    """The leaf "a" of a ``small_td`` result, for every implementation."""
    return out["a"]  # type: ignore[index]


# -- indexing and functional scatter -------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.parametrize("index", list(INDICES))
def test_getitem(benchmark, impl: Impl, index: str) -> None:
    """``td[index]`` on the batch dims (pytree: ``x[index]`` on every leaf)."""
    impl.require("td[idx]")
    idx = INDICES[index]
    if impl.name == "pytree":
        idx = PYTREE_INDICES.get(index, idx)
    out = benchmark(impl.getitem(small_td(impl), idx))
    assert _a(out).shape == (*torch.zeros(3, 4)[INDICES[index]].shape, 5)


SET_INDICES = ("int", "slice_int", "range", "tuple")


@pytest.mark.pytree
@pytest.mark.parametrize("index", SET_INDICES)
def test_setitem_dim(benchmark, impl: Impl, index: str) -> None:
    """A node with zeros written at ``index``, the input unchanged.

    tdtree: ``td.at[index].set(value)``; tensordict: ``clone()`` then
    ``td[index] = value`` (its suite times the bare in-place write); pytree:
    clone and write every leaf.
    """
    impl.require("at")
    idx = INDICES[index]
    td = impl.node({"a": torch.ones(3, 4, 5), "b": {"b1": torch.ones(3, 4, 5)}}, (3, 4))
    value_source = {"a": torch.zeros(3, 4, 5)[idx], "b": {"b1": torch.zeros(3, 4, 5)[idx]}}
    value = impl.node(value_source, tuple(torch.zeros(3, 4)[idx].shape))
    out = benchmark(impl.scatter(td, idx, value))
    assert _a(out)[idx].sum() == 0 and _a(td).sum() == 60


# -- stacked nodes -----------------------------------------------------------------------------


def _stacked(impl: Impl) -> object:
    """The 19-level node of batch (3, 10), unbound along dim 1 and stacked back.

    tensordict's suite calls this a stacked node; tensordict's ``torch.stack``
    and ``tdtree.stack`` both return a dense node (tdtree has no lazy stack).
    """
    impl.require("unbind", "tdtree.stack")
    return impl.stack(list(big_nested(impl, (3, 10)).unbind(1)), 1)()


def test_stacked_getleaf(benchmark, impl: Impl) -> None:
    """Get the deepest leaf of a stacked node (tdtree: of ``tdtree.stack``'s dense result)."""
    assert benchmark(impl.get(_stacked(impl), LAST_LEAF)).shape == (3, 10)


def test_stacked_get(benchmark, impl: Impl) -> None:
    """Get the deepest sub-node of a stacked node (tdtree: of ``tdtree.stack``'s dense result)."""
    assert benchmark(impl.get(_stacked(impl), LAST_NODE)).batch_size == (3, 10)


def test_stacked_getitemleaf(benchmark, impl: Impl) -> None:
    """``td[key]`` for the deepest leaf of a stacked node."""
    assert benchmark(impl.getitem(_stacked(impl), LAST_LEAF)).shape == (3, 10)


def test_stacked_getitem(benchmark, impl: Impl) -> None:
    """``td[key]`` for the deepest sub-node of a stacked node."""
    assert benchmark(impl.getitem(_stacked(impl), LAST_NODE)).batch_size == (3, 10)


# -- unbind, split, chunk ----------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_unbind_speed(benchmark, impl: Impl) -> None:
    """Unbind the 19-level node along dim 0 (pytree: a dict of tuples, as tensordict's pytree file)."""
    impl.require("unbind")
    out = benchmark(impl.method(big_nested(impl), "unbind", 0))
    assert len(out) == (1 if impl.name == "pytree" else 3)


def test_unbind_speed_stack0(benchmark, impl: Impl) -> None:
    """Unbind a stacked node along dim 0."""
    td = _stacked(impl)
    assert len(benchmark(impl.method(td, "unbind", 0))) == 3


def test_unbind_speed_stack1(benchmark, impl: Impl) -> None:
    """Unbind a stacked node along its stack dim 1."""
    td = _stacked(impl)
    assert len(benchmark(impl.method(td, "unbind", 1))) == 10


@pytest.mark.pytree
@pytest.mark.quick
def test_split(benchmark, impl: Impl) -> None:
    """Split the 19-level node of batch (3, 20) in pieces of 2 along dim 1."""
    impl.require("split")
    out = benchmark(impl.method(big_nested(impl, (3, 20)), "split", 2, dim=1))
    assert len(out) == (1 if impl.name == "pytree" else 10)


@pytest.mark.pytree
def test_chunk(benchmark, impl: Impl) -> None:
    """Chunk the 19-level node of batch (3, 20) in 10 along dim 1."""
    impl.require("chunk")
    out = benchmark(impl.method(big_nested(impl, (3, 20)), "chunk", 10, dim=1))
    assert len(out) == (1 if impl.name == "pytree" else 10)


# -- stack, cat --------------------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_stack_nested(benchmark, impl: Impl) -> None:
    """Stack four 19-level nodes along a new dim 0 (tensordict: ``torch.stack``)."""
    impl.require("tdtree.stack")
    td = big_nested(impl)
    out = benchmark(impl.stack([td] * 4, 0))
    assert impl.get(out, LAST_LEAF)().shape == (4, 3, 4)


@pytest.mark.pytree
def test_cat_nested(benchmark, impl: Impl) -> None:
    """Concatenate four 19-level nodes along dim 0 (tensordict: ``torch.cat``)."""
    impl.require("tdtree.cat")
    td = big_nested(impl)
    out = benchmark(impl.cat([td] * 4, 0))
    assert impl.get(out, LAST_LEAF)().shape == (12, 4)


# -- maps and arithmetic ---------------------------------------------------------------------------


@pytest.mark.pytree
def test_apply_nested(benchmark, impl: Impl) -> None:
    """``apply`` of the identity over the 19-level node (pytree: ``optree.tree_map``)."""
    impl.require("apply")
    out = benchmark(impl.method(big_nested(impl), "apply", lambda x: x))
    assert impl.get(out, LAST_LEAF)().shape == (3, 4)


@pytest.mark.pytree
@pytest.mark.quick
def test_add_scalar(benchmark, impl: Impl) -> None:
    """``td + 1`` over the 100 flat leaves."""
    impl.require("__add__")
    out = benchmark(impl.add(big_td(impl), 1))
    assert out["99"][0, 0] == 100


@pytest.mark.pytree
def test_add_node(benchmark, impl: Impl) -> None:
    """``td + td`` over the 100 flat leaves, paired by key."""
    impl.require("__add__")
    td = big_td(impl)
    out = benchmark(impl.add(td, td))
    assert out["99"][0, 0] == 198


@pytest.mark.pytree
@pytest.mark.parametrize("fn", ["zeros_like", "ones_like", "full_like"])
def test_like(benchmark, impl: Impl, fn: str) -> None:
    """``torch.zeros_like(td)``, ``ones_like``, ``full_like(td, 2.0)`` (pytree: per leaf)."""
    impl.require(f"torch.{fn}(td)")
    args = (2.0,) if fn == "full_like" else ()
    out = benchmark(impl.like(getattr(torch, fn), small_td(impl), *args))
    assert _a(out).shape == (3, 4, 5)


# -- shape -----------------------------------------------------------------------------------------


@pytest.mark.pytree
def test_permute(benchmark, impl: Impl) -> None:
    """Swap the two batch dims of ``small_td``."""
    impl.require("permute")
    out = benchmark(impl.method(small_td(impl), "permute", 1, 0))
    assert _a(out).shape == (4, 3, 5)


@pytest.mark.pytree
def test_squeeze(benchmark, impl: Impl) -> None:
    """Squeeze the leading batch dim of size 1 of ``small_td`` with batch (1, 3, 4)."""
    impl.require("squeeze")
    out = benchmark(impl.method(small_td(impl, (1,)), "squeeze", 0))
    assert _a(out).shape == (3, 4, 5)


@pytest.mark.pytree
def test_unsqueeze(benchmark, impl: Impl) -> None:
    """Add a leading batch dim of size 1 to ``small_td``."""
    impl.require("unsqueeze")
    out = benchmark(impl.method(small_td(impl), "unsqueeze", 0))
    assert _a(out).shape == (1, 3, 4, 5)


# -- devices and memory ------------------------------------------------------------------------------


@pytest.mark.pytree
def test_to_cpu(benchmark, impl: Impl) -> None:
    """``td.to("cpu")`` of a node already on the CPU."""
    impl.require("to")
    out = benchmark(impl.method(small_td(impl), "to", "cpu"))
    assert _a(out).device.type == "cpu"


@pytest.mark.pytree
def test_set_shared(benchmark, impl: Impl) -> None:
    """A copy of ``small_td`` in shared memory, the input unchanged.

    tdtree: ``share_memory()`` (it copies); tensordict: ``clone().share_memory_()``
    as in its suite; pytree: the same on every leaf.
    """
    impl.require("share_memory")
    out = benchmark(impl.share(small_td(impl)))
    assert _a(out).is_shared()
