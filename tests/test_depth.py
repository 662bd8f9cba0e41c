"""A node is as deep as a nested dict gets: the operations below work on a chain of 990 levels at
Python's default recursion limit, called from a test (tens of frames deep), and give the values
the same chain as nested dicts gives through plain torch."""

from __future__ import annotations

import copy
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import optree
import pytest
import torch

import tdtree as tt
from tdtree import TensorDict

DEPTH = 990


@pytest.fixture(autouse=True)
def _default_limit() -> Iterator[None]:
    # the claim is about Python's default limit, 1000: a test run at a higher one would prove nothing
    # (pytest-xdist's workers run tests at 2000, set by execnet)
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(before)


def chain(depth: int = DEPTH, batch: tuple[int, ...] = ()) -> dict[str, Any]:
    """Nested dicts, level i holding ``x`` (values told apart by level) and, but for the last, ``n``."""
    d: dict[str, Any] = {"x": torch.arange(2.0).expand(*batch, 2) + depth - 1}
    for i in range(depth - 2, -1, -1):
        d = {"n": d, "x": torch.arange(2.0).expand(*batch, 2) + i}
    return d


def paths(d: dict[str, Any]) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    """The leaves of nested dicts as (path, tensor), depth first in sorted key order, by a loop."""
    out = []
    todo: list[tuple[tuple[str, ...], Any]] = [((), d)]
    while todo:
        path, level = todo.pop()
        if isinstance(level, dict):
            todo.extend(((*path, k), level[k]) for k in sorted(level, reverse=True))
        else:
            out.append((path, level))
    return out


def same(node: Any, d: dict[str, Any]) -> None:
    """``node`` holds the leaves of ``d`` at the same keys (read back one key at a time)."""
    expected = paths(d)
    assert len(list(node.keys(include_nested=True, leaves_only=True))) == len(expected)
    for path, value in expected:
        got = node[path]
        assert got.shape == value.shape and torch.equal(got, value), path


def deep_key(depth: int = DEPTH) -> tuple[str, ...]:
    return ("n",) * (depth - 1) + ("x",)


def plus_one(d: dict[str, Any]) -> dict[str, Any]:
    return optree.tree_map(lambda t: t + 1, d)


def test_create() -> None:
    d = chain()
    same(TensorDict(d), d)


def test_create_batch() -> None:
    d = chain(batch=(3,))
    td = TensorDict(d, batch_size=[3])
    same(td, d)
    assert td[deep_key()[:-1]].batch_size == (3,)


def test_tensorclass_field() -> None:
    @tt.tensorclass
    class Holder:
        node: TensorDict

    d = chain()
    same(Holder(node=TensorDict(d)).node, d)


def test_flatten_unflatten_optree() -> None:
    d = chain()
    flat, spec = optree.tree_flatten(TensorDict(d), namespace="tdtree")
    assert [torch.equal(a, b) for a, b in zip(flat, optree.tree_leaves(d))] == [True] * DEPTH
    same(optree.tree_unflatten(spec, flat), d)


def test_tree_map_apply_clone() -> None:
    d = chain()
    td = TensorDict(d)
    same(tt.tree.map(lambda t: t + 1, td), plus_one(d))
    same(td.apply(lambda t: t + 1), plus_one(d))
    out = td.clone()
    same(out, d)
    assert out[deep_key()].data_ptr() != td[deep_key()].data_ptr()


def test_arithmetic_and_compare() -> None:
    d = chain()
    td = TensorDict(d)
    same(td + td, optree.tree_map(torch.add, d, d))
    assert (td == td).all()
    same(td == td.apply(lambda t: t + 1), optree.tree_map(lambda t: t == t + 1, d))


def test_select_exclude_keys() -> None:
    d = chain()
    td = TensorDict(d)
    selected = td.select(deep_key())
    assert list(selected.keys(include_nested=True, leaves_only=True)) == [deep_key()]
    assert torch.equal(selected[deep_key()], d_leaf(d))
    excluded = td.exclude(deep_key())
    assert deep_key() not in excluded.keys(include_nested=True, leaves_only=True)
    assert len(list(excluded.keys(include_nested=True, leaves_only=True))) == DEPTH - 1
    expected = [p if len(p) > 1 else p[0] for p, _ in paths(d)]
    assert list(td.keys(include_nested=True, leaves_only=True)) == expected
    assert [torch.equal(a, b) for a, (_, b) in zip(td.values(True, True), paths(d))] == [True] * DEPTH
    assert len(list(td.items(include_nested=True))) == DEPTH + DEPTH - 1


def d_leaf(d: dict[str, Any]) -> torch.Tensor:
    for _ in range(DEPTH - 1):
        d = d["n"]
    return d["x"]


def test_flatten_unflatten_keys() -> None:
    d = chain()
    td = TensorDict(d)
    flat = td.flatten_keys()
    assert torch.equal(flat[".".join(deep_key())], d_leaf(d))
    assert len(flat.keys()) == DEPTH
    same(flat.unflatten_keys(), d)


def test_to_dict_state_dict_repr() -> None:
    d = chain()
    td = TensorDict(d)
    assert paths(td.to_dict()) == paths(d)  # the same tensor objects, so == is identity here
    assert paths(td.state_dict()) == paths(d)
    assert repr(td).count("TensorDict(") == DEPTH


def test_lock_share_memory() -> None:
    d = chain()
    locked = TensorDict(d).lock()
    assert locked[deep_key()[:-1]].tags == locked.tags != frozenset()
    same(locked, d)
    shared = TensorDict(d).share_memory()
    assert shared[deep_key()].is_shared()
    same(shared, d)


def test_operations_on_a_locked_node_apply_the_rule() -> None:
    # the rule walks the inputs' and results' leaves: a view keeps Locked at every level, new storage drops it
    d = chain()
    locked = TensorDict(d).lock()
    sub = locked.select("n")
    assert sub["n"].tags == sub[deep_key()[:-1]].tags == locked.tags != frozenset()
    same(sub["n"], d["n"])
    out = locked + 1
    assert out.tags == out[deep_key()[:-1]].tags == frozenset()
    same(out, plus_one(d))


def test_pickle_deepcopy() -> None:
    d = chain()
    td = TensorDict(d)
    same(pickle.loads(pickle.dumps(td)), d)
    locked = pickle.loads(pickle.dumps(td.lock()))
    assert locked[deep_key()[:-1]].tags == td.lock().tags
    same(locked, d)
    out = copy.deepcopy(td)
    same(out, d)
    assert out[deep_key()].data_ptr() != td[deep_key()].data_ptr()


def test_index_stack_cat() -> None:
    d = chain(batch=(2,))
    td = TensorDict(d, batch_size=[2])
    same(td[0], optree.tree_map(lambda t: t[0], d))
    same(tt.stack([td, td]), optree.tree_map(lambda t: torch.stack([t, t]), d))
    same(tt.cat([td, td]), optree.tree_map(lambda t: torch.cat([t, t]), d))


def test_vmap() -> None:
    d = chain(batch=(2,))
    out = tt.vmap(lambda td: td.apply(lambda t: t * 2))(TensorDict(d, batch_size=[2]))
    same(out, optree.tree_map(lambda t: t * 2, d))


def merged(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``other`` merged in, nested dicts into nested dicts, by a loop (as dict update per level)."""
    out = dict(base)
    todo = [(out, other)]
    while todo:
        level, src = todo.pop()
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(level.get(k), dict):
                level[k] = dict(level[k])
                todo.append((level[k], v))
            else:
                level[k] = v
    return out


def test_update_from_dict_and_node() -> None:
    d = chain()
    # every level gets a replaced "x" and a new "y"
    other: dict[str, Any] = {"x": torch.full((2,), -1.0), "y": torch.full((2,), float(DEPTH))}
    for i in range(DEPTH - 2, -1, -1):
        other = {"n": other, "x": torch.full((2,), -1.0 - i), "y": torch.full((2,), float(i))}
    expected = merged(d, other)
    td = TensorDict(d)
    same(td.update(other), expected)
    same(td.update(TensorDict(other)), expected)
    same(td, d)  # the input is unchanged
    locked = TensorDict(d).lock()
    with pytest.raises(tt.errors.LockedError):
        locked.update(other)


def test_save_load(tmp_path: Any) -> None:
    d = chain()
    tt.save(TensorDict(d), tmp_path / "td.pt")
    same(tt.load(tmp_path / "td.pt"), d)


def test_memmap_load_memmap(tmp_path: Any) -> None:
    d = chain()
    mapped = TensorDict(d).memmap(tmp_path / "mm")
    same(mapped, d)
    loaded = tt.load_memmap(tmp_path / "mm")
    same(loaded, d)
    assert loaded[deep_key()[:-1]].is_memmap
