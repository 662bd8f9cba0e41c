"""Nodes against plain pytrees, after tensordict's benchmarks/common/pytree_benchmarks_test.py.

tensordict's file times each operation twice, ``test_<op>_pytree`` (optree's
``tree_map`` over nested dicts) and ``test_<op>_td``; here each is one case
whose ``pytree`` row is the former. The data is tensordict's:
{"a": {"b": (3, 4, 1), "c": {"d": (3, 4, 5, 6)}}, "c": (3, 4, 1)}, batch (3, 4).
"""

from __future__ import annotations

import pytest

from .impls import Impl, pytree_data

pytestmark = pytest.mark.pytree


def _d(out: object) -> object:
    return out["a"]["c"]["d"]  # type: ignore[index]


@pytest.mark.quick
def test_reshape(benchmark, impl: Impl) -> None:
    """Reshape the batch dims (3, 4) to (12,)."""
    impl.require("reshape")
    out = benchmark(impl.method(pytree_data(impl), "reshape", 12))
    assert _d(out).shape == (12, 5, 6)


def test_view(benchmark, impl: Impl) -> None:
    """View the batch dims (3, 4) as (12,)."""
    impl.require("view")
    out = benchmark(impl.method(pytree_data(impl), "view", 12))
    assert _d(out).shape == (12, 5, 6)


@pytest.mark.quick
def test_unbind(benchmark, impl: Impl) -> None:
    """Unbind along dim 0 (pytree: a dict of tuples)."""
    impl.require("unbind")
    out = benchmark(impl.method(pytree_data(impl), "unbind", 0))
    assert len(out) == (2 if impl.name == "pytree" else 3)


def test_split(benchmark, impl: Impl) -> None:
    """Split dim 0 in pieces of 1 and 2."""
    impl.require("split")
    out = benchmark(impl.method(pytree_data(impl), "split", [1, 2], 0))
    assert len(out) == 2


@pytest.mark.quick
def test_add(benchmark, impl: Impl) -> None:
    """``apply(lambda x: x + 1)`` (pytree: ``optree.tree_map``)."""
    impl.require("apply")
    out = benchmark(impl.method(pytree_data(impl), "apply", lambda x: x + 1))
    assert _d(out).shape == (3, 4, 5, 6)
