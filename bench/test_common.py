"""Key operations, case by case and by name after tensordict's benchmarks/common/common_ops_test.py.

Data: ``big_td`` (100 flat keys of shape (3, 4)), ``big_nested`` (19 levels,
one leaf per level), ``small_td`` ({"a", ("b", "b1")} of shape (3, 4, 5),
batch (3, 4)). Each case runs on every implementation in one session (see
``bench/conftest.py``); where tensordict mutates, the docstring says what its
row times.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from .impls import Impl, big_nested, big_td, nested_key, small_td

DEEP_NEW_KEY = tuple(str(j) for j in range(20, 0, -1))
LAST_LEAF = (*nested_key(19), "t")
LAST_NODE = nested_key(19)


def _nkeys(node: object) -> int:
    """The number of top-level keys (``len`` of a tensordict is its first batch dim)."""
    return len(list(node.keys()))  # type: ignore[attr-defined]


# -- set ---------------------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_plain_set_nested(benchmark, impl: Impl) -> None:
    """Set a leaf 20 levels down on a new path ("20", "19", ..., "1").

    tdtree returns a new node (20 new sub-nodes); tensordict's row is its own
    in-place ``set`` on one node, as in its suite (the path exists after the
    first call).
    """
    td = big_nested(impl)
    tensor = torch.zeros(3, 4)
    if impl.name == "tensordict":
        out = benchmark(td.set, DEEP_NEW_KEY, tensor)
    else:
        out = benchmark(impl.set(td, DEEP_NEW_KEY, tensor))
    assert impl.get(out, DEEP_NEW_KEY)() is tensor


@pytest.mark.pytree
@pytest.mark.quick
def test_set(benchmark, impl: Impl) -> None:
    """A node with a new key "c"; tensordict: ``clone(False)`` then ``set``."""
    td = small_td(impl)
    c = torch.zeros(3, 4, 5)
    out = benchmark(impl.set(td, "c", c))
    assert out["c"] is c and "c" not in td.keys()


@pytest.mark.pytree
def test_set_nested(benchmark, impl: Impl) -> None:
    """Replace the existing ("b", "b1"); tensordict: ``clone(False)`` then ``set``."""
    td = small_td(impl)
    b = torch.ones(3, 4, 5)
    out = benchmark(impl.set(td, ("b", "b1"), b))
    assert impl.get(out, ("b", "b1"))() is b and impl.get(td, ("b", "b1"))() is not b


@pytest.mark.pytree
def test_set_nested_new(benchmark, impl: Impl) -> None:
    """A node with the new nested key ("c", "c", "c"); tensordict: ``clone(False)`` then ``set``."""
    td = small_td(impl)
    c = torch.zeros(3, 4, 5)
    out = benchmark(impl.set(td, ("c", "c", "c"), c))
    assert impl.get(out, ("c", "c", "c"))() is c


# -- keys, values, items --------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_items(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.items(big_td(impl)))) == 100


@pytest.mark.pytree
def test_items_nested(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.items(big_nested(impl), True))) == 19 + 19


def test_items_nested_locked(benchmark, impl: Impl) -> None:
    td = impl.lock(big_nested(impl))
    impl.items(td, True)()
    assert len(benchmark(impl.items(td, True))) == 19 + 19


@pytest.mark.pytree
def test_items_nested_leaf(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.items(big_nested(impl), True, True))) == 19


@pytest.mark.pytree
def test_keys(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.keys(big_td(impl)))) == 100


@pytest.mark.pytree
@pytest.mark.quick
def test_keys_nested(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.keys(big_nested(impl), True))) == 19 + 19


def test_keys_nested_locked(benchmark, impl: Impl) -> None:
    td = impl.lock(big_nested(impl))
    impl.keys(td, True)()
    assert len(benchmark(impl.keys(td, True))) == 19 + 19


@pytest.mark.pytree
def test_keys_nested_leaf(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.keys(big_nested(impl), True, True))) == 19


@pytest.mark.pytree
def test_keys_nested_leaf_loop(benchmark, impl: Impl) -> None:
    """Iterate over the nested leaf keys with a Python loop (pytree: over the walk's leaf paths)."""
    td = big_nested(impl)
    keys = impl.keys(td, True, True) if impl.name == "pytree" else lambda: td.keys(True, True)
    out = benchmark(lambda: [key for key in keys()])  # noqa: C416
    assert len(out) == 19


@pytest.mark.pytree
def test_values(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.values(big_td(impl)))) == 100


@pytest.mark.pytree
def test_values_nested(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.values(big_nested(impl), True))) == 19 + 19


def test_values_nested_locked(benchmark, impl: Impl) -> None:
    td = impl.lock(big_nested(impl))
    impl.values(td, True)()
    assert len(benchmark(impl.values(td, True))) == 19 + 19


@pytest.mark.pytree
def test_values_nested_leaf(benchmark, impl: Impl) -> None:
    assert len(benchmark(impl.values(big_nested(impl), True, True))) == 19


# -- membership -------------------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_membership(benchmark, impl: Impl) -> None:
    assert benchmark(impl.contains(big_td(impl), "a")) is False


@pytest.mark.pytree
def test_membership_nested(benchmark, impl: Impl) -> None:
    assert benchmark(impl.contains(big_nested(impl), ("a",), True)) is False


@pytest.mark.pytree
def test_membership_nested_leaf(benchmark, impl: Impl) -> None:
    assert benchmark(impl.contains(big_nested(impl), ("a",), True, True)) is False


@pytest.mark.pytree
def test_membership_nested_last(benchmark, impl: Impl) -> None:
    """The deepest sub-node's key, found at the end of the nested keys."""
    assert benchmark(impl.contains(big_nested(impl), LAST_NODE, True)) is True


@pytest.mark.pytree
def test_membership_nested_leaf_last(benchmark, impl: Impl) -> None:
    """The deepest leaf's key among the nested leaf keys."""
    assert benchmark(impl.contains(big_nested(impl), LAST_LEAF, True, True)) is True


# -- get ----------------------------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_nested_getleaf(benchmark, impl: Impl) -> None:
    assert benchmark(impl.get(big_nested(impl), LAST_LEAF)).shape == (3, 4)


@pytest.mark.pytree
def test_nested_get(benchmark, impl: Impl) -> None:
    assert benchmark(impl.get(big_nested(impl), LAST_NODE)) is not None


@pytest.mark.pytree
def test_nested_getitemleaf(benchmark, impl: Impl) -> None:
    assert benchmark(impl.getitem(big_nested(impl), LAST_LEAF)).shape == (3, 4)


@pytest.mark.pytree
def test_nested_getitem(benchmark, impl: Impl) -> None:
    assert benchmark(impl.getitem(big_nested(impl), LAST_NODE)) is not None


# -- lock, unlock ----------------------------------------------------------------------------------


def test_lock_nested(benchmark, impl: Impl) -> None:
    """Lock the 19-level node, a fresh one each round (setup is not timed).

    tdtree's ``lock()`` returns a new tagged node; tensordict's ``lock_()``
    flags it in place. tensordict's suite times ``list(td.lock_())``, which for
    tensordict also unbinds the first batch dim; here lock alone is timed.
    """
    out = benchmark.pedantic(
        impl.lock, setup=lambda: ((big_nested(impl),), {}), warmup_rounds=5, rounds=200, iterations=1
    )
    assert out.is_locked


def test_unlock_nested(benchmark, impl: Impl) -> None:
    """Unlock a locked 19-level node, a fresh one each round; as ``test_lock_nested``."""
    out = benchmark.pedantic(
        impl.unlock,
        setup=lambda: ((impl.lock(big_nested(impl)),), {}),
        warmup_rounds=5,
        rounds=200,
        iterations=1,
    )
    assert not out.is_locked


# -- flatten, unflatten -------------------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_flatten_speed(benchmark, impl: Impl) -> None:
    assert _nkeys(benchmark(impl.flatten_keys(big_nested(impl)))) == 19


@pytest.mark.pytree
def test_unflatten_speed(benchmark, impl: Impl) -> None:
    flat = impl.flatten_keys(big_nested(impl))()
    assert _nkeys(benchmark(impl.unflatten_keys(flat))) == 1


# -- creation ------------------------------------------------------------------------------------


def _node_type(impl: Impl) -> type:
    return type(impl.node({}, ()))


@pytest.mark.quick
def test_creation(benchmark, impl: Impl) -> None:
    """An empty node with batch (3, 4)."""
    cls = _node_type(impl)
    assert benchmark(cls, {}, [3, 4]).batch_size == (3, 4)


def test_creation_empty(benchmark, impl: Impl) -> None:
    """Two flat keys (tensordict's name for this case)."""
    cls = _node_type(impl)
    a, b = torch.zeros(3, 4, 5), torch.zeros(3, 4, 5)
    assert _nkeys(benchmark(cls, {"a": a, "b": b}, [3, 4])) == 2


def test_creation_nested_1(benchmark, impl: Impl) -> None:
    """A nested key given as a tuple."""
    cls = _node_type(impl)
    a, b = torch.zeros(3, 4, 5), torch.zeros(3, 4, 5)
    assert benchmark(cls, {"a": a, ("b", "b1"): b}, [3, 4])["b", "b1"] is b


def test_creation_nested_2(benchmark, impl: Impl) -> None:
    """A nested key given as a nested dict."""
    cls = _node_type(impl)
    a, b = torch.zeros(3, 4, 5), torch.zeros(3, 4, 5)
    assert benchmark(cls, {"a": a, "b": {"b1": b}}, [3, 4])["b", "b1"] is b


@pytest.mark.parametrize("num_keys", [10, 50, 100])
def test_creation_many_keys(benchmark, impl: Impl, num_keys: int) -> None:
    cls = _node_type(impl)
    tensors = {str(i): torch.zeros(3, 4, 5) for i in range(num_keys)}
    assert _nkeys(benchmark(cls, tensors, [3, 4])) == num_keys


def _chain(depth: int) -> dict[str, Any]:
    """Nested dicts ``depth`` levels deep, each holding a leaf ``x`` and, but for the last, ``n``."""
    d: dict[str, Any] = {"x": torch.zeros(3)}
    for _ in range(depth - 1):
        d = {"n": d, "x": torch.zeros(3)}
    return d


@pytest.mark.pytree
@pytest.mark.parametrize("shape", ["deep", "wide"])
def test_creation_from_dicts(benchmark, impl: Impl, shape: str) -> None:
    """A node from nested dicts 1,024 levels deep (a leaf a level) or 1,024 keys wide (pytree: a
    recursive copy of the dicts, the floor creation per level is held to). Run under a recursion limit
    a 1,024-level recursion fits in, which tensordict and the floor need and tdtree does not."""
    source = _chain(1024) if shape == "deep" else {f"k{i:04d}": torch.zeros(3) for i in range(1024)}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        out = benchmark(impl.node, source, ())
    finally:
        sys.setrecursionlimit(limit)
    assert _nkeys(out) == (2 if shape == "deep" else 1024)


@pytest.mark.parametrize("num_keys", [10, 50])
def test_creation_nested_many_keys(benchmark, impl: Impl, num_keys: int) -> None:
    cls = _node_type(impl)
    tensors: dict = {str(i): torch.zeros(3, 4, 5) for i in range(num_keys)}
    tensors["nested"] = {str(i): torch.zeros(3, 4, 5) for i in range(num_keys)}
    assert _nkeys(benchmark(cls, tensors, [3, 4])) == num_keys + 1


# -- clone, update, select, exclude, empty ------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_clone(benchmark, impl: Impl) -> None:
    """A copy with new storage for every leaf (pytree: ``tree_map(torch.clone)``)."""
    td = small_td(impl)
    out = benchmark(impl.clone(td))
    assert out["a"].data_ptr() != td["a"].data_ptr()


@pytest.mark.pytree
def test_update(benchmark, impl: Impl) -> None:
    """Update a flat node from another; tensordict: ``clone(False)`` then ``update``; pytree: ``d | d2``."""
    td = impl.node({"a": torch.zeros(3, 4, 5), "b": torch.zeros(3, 4, 5)}, (3, 4))
    td2 = impl.clone(td)()
    out = benchmark(impl.update(td, td2))
    assert out["a"] is td2["a"]


@pytest.mark.pytree
@pytest.mark.quick
def test_update_nested(benchmark, impl: Impl) -> None:
    """Update a nested node from a copy; tensordict: ``clone(False)`` then ``update``."""
    td = small_td(impl)
    td2 = impl.clone(td)()
    out = benchmark(impl.update(td, td2))
    assert impl.get(out, ("b", "b1"))() is impl.get(td2, ("b", "b1"))()


@pytest.mark.pytree
def test_select(benchmark, impl: Impl) -> None:
    """Set ("c", "c", "c") then select "a", "z" (missing) and it with ``strict=False``.

    tensordict: ``clone(False)``, ``set``, ``select``.
    """
    td = small_td(impl)
    c = torch.zeros(3, 4, 5)
    out = benchmark(impl.set_select(td, ("c", "c", "c"), c, "a", "z", ("c", "c", "c")))
    assert impl.get(out, ("c", "c", "c"))() is c and "b" not in out.keys()


@pytest.mark.pytree
@pytest.mark.quick
def test_select_nested(benchmark, impl: Impl) -> None:
    """Select the deepest leaf of the 19-level node."""
    td = big_nested(impl)
    out = benchmark(impl.select(td, LAST_LEAF))
    assert len(impl.keys(out, True, True)()) == 1


@pytest.mark.pytree
@pytest.mark.quick
def test_exclude_nested(benchmark, impl: Impl) -> None:
    """Exclude the deepest leaf of the 19-level node."""
    td = big_nested(impl)
    out = benchmark(impl.exclude(td, LAST_LEAF))
    assert len(impl.keys(out, True, True)()) == 18


@pytest.mark.pytree
def test_rename_nested(benchmark, impl: Impl) -> None:
    """Move the deepest leaf of the 19-level node to a new name beside it; tensordict: ``clone(False)``
    then ``rename_key_``."""
    td = big_nested(impl)
    new = (*LAST_NODE, "u")
    out = benchmark(impl.rename(td, LAST_LEAF, new))
    assert impl.get(out, new)() is impl.get(td, LAST_LEAF)() and LAST_LEAF not in impl.keys(out, True, True)()


@pytest.mark.parametrize("recurse", [True, False])
def test_empty(benchmark, impl: Impl, recurse: bool) -> None:
    """A node with the same batch size and no leaves (recurse: the empty sub-nodes kept).

    tdtree has no ``empty``: its row times ``select()`` (recurse=False) and
    ``exclude`` of every leaf key, listed beforehand (recurse=True).
    """
    td = big_nested(impl)
    out = benchmark(impl.empty(td, recurse))
    assert list(out.keys(True, True)) == []
