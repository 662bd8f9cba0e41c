"""Many-key editors against the floors that validate what they must, at 10 to 10,000 leaves.

Data: ``N`` flat leaves ``"k00000"``... of shape (3, 2) with batch (3,), or the same leaves in 10
sub-nodes ``"g0"``.. ``"g9"`` (nested). Each case's pytree row is its floor, in plain dicts:

- update: ``{**d, **other}`` after a loop checking each new value's batch prefix
  (``v.shape[:n] == batch``), what a node's update must check;
- select (half the keys, or one) and exclude (half the keys): a dict comprehension picking the keys;
- lock: a copy of the dict (of each level's dict, nested).

tensordict's rows: ``clone(False)`` then ``update`` / ``lock_()``; ``select`` / ``exclude`` as they are.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .impls import Impl

SIZES = (10, 100, 1_000, 10_000)
BATCH = torch.Size([3])


def _leaves(n: int, fill: float = 0.0) -> dict[str, torch.Tensor]:
    return {f"k{i:05d}": torch.full((3, 2), fill) for i in range(n)}


def _flat(n: int) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]:
    """The node's leaves, new values for every other key, and those keys."""
    data = _leaves(n)
    keys = tuple(data)[::2]
    return data, {k: torch.ones(3, 2) for k in keys}, keys


def _nested(n: int) -> tuple[dict[str, Any], dict[str, Any], tuple[tuple[str, str], ...]]:
    data = {f"g{j}": _leaves(max(1, n // 10)) for j in range(10)}
    keys = tuple((g, k) for g, sub in data.items() for k in tuple(sub)[::2])
    new: dict[str, Any] = {}
    for g, k in keys:
        new.setdefault(g, {})[k] = torch.ones(3, 2)
    return data, new, keys


def _checked_merge(d: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """The update floor: each new value's batch prefix checked, then the merge (nested dicts merged)."""
    out = {**d}
    for k, v in other.items():
        if type(v) is dict:
            out[k] = _checked_merge(d[k], v)
            continue
        if v.shape[: len(BATCH)] != BATCH:
            raise ValueError(k)
        out[k] = v
    return out


def _picked(d: dict[str, Any], keys: tuple[Any, ...]) -> dict[str, Any]:
    """The select floor: a dict comprehension picking the keys (nested keys: one level down)."""
    if type(keys[0]) is str:
        return {k: d[k] for k in keys}
    out: dict[str, Any] = {}
    for g, k in keys:
        out.setdefault(g, {})[k] = d[g][k]
    return out


def _dropped(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The exclude floor: a dict comprehension keeping the other keys."""
    drop = set(keys)
    return {k: v for k, v in d.items() if k not in drop}


def _copied(d: dict[str, Any]) -> dict[str, Any]:
    """The lock floor for the nested data: a copy of each group's dict (flat: ``dict.copy``)."""
    return {k: v.copy() for k, v in d.items()}


def _node(impl: Impl, data: dict[str, Any]) -> Any:
    return data if impl.name == "pytree" else impl.node(data, tuple(BATCH))


@pytest.mark.pytree
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("n", SIZES)
def test_update_from_dict(benchmark, impl: Impl, n: int, nested: bool) -> None:
    """Update half the leaves from a plain dict of new tensors."""
    data, new, _ = _nested(n) if nested else _flat(n)
    td = _node(impl, data)
    if impl.name == "pytree":
        out = benchmark(_checked_merge, data, new)
    else:
        out = benchmark(impl.update(td, new))
    first = next(iter(new))
    got = out[first] if not nested else out[first][next(iter(new[first]))]
    assert got is (new[first] if not nested else new[first][next(iter(new[first]))])


@pytest.mark.pytree
@pytest.mark.parametrize("n", SIZES)
def test_update_from_node(benchmark, impl: Impl, n: int) -> None:
    """Update half the leaves from a node of new tensors (pytree: the floor from a dict)."""
    data, new, _ = _flat(n)
    td = _node(impl, data)
    if impl.name == "pytree":
        out = benchmark(_checked_merge, data, new)
    else:
        out = benchmark(impl.update(td, impl.node(new, tuple(BATCH))))
    first = next(iter(new))
    assert out[first] is new[first]


@pytest.mark.pytree
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("n", SIZES)
def test_select_half(benchmark, impl: Impl, n: int, nested: bool) -> None:
    """Select every other leaf by key."""
    data, _, keys = _nested(n) if nested else _flat(n)
    td = _node(impl, data)
    if impl.name == "pytree":
        out = benchmark(_picked, data, keys)
    else:
        out = benchmark(impl.select(td, *keys))
    assert len(list(out.keys())) == (10 if nested else len(keys))


@pytest.mark.pytree
@pytest.mark.parametrize("locked", [False, True], ids=["plain", "locked"])
@pytest.mark.parametrize("n", SIZES)
def test_select_one(benchmark, impl: Impl, n: int, locked: bool) -> None:
    """Select one leaf of a flat node (locked: of the node locked first)."""
    data, _, keys = _flat(n)
    key = keys[len(keys) // 2]
    td = _node(impl, data)
    if locked and impl.name != "pytree":
        td = impl.lock(td)
    if impl.name == "pytree":
        out = benchmark(_picked, data, (key,))
    else:
        out = benchmark(impl.select(td, key))
    assert out[key] is data[key]


@pytest.mark.pytree
@pytest.mark.parametrize("n", SIZES)
def test_exclude_half(benchmark, impl: Impl, n: int) -> None:
    """Exclude every other leaf of a flat node by key."""
    data, _, keys = _flat(n)
    td = _node(impl, data)
    if impl.name == "pytree":
        out = benchmark(_dropped, data, keys)
    else:
        out = benchmark(impl.exclude(td, *keys))
    assert len(list(out.keys())) == n - len(keys)


@pytest.mark.pytree
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("n", SIZES)
def test_lock_many(benchmark, impl: Impl, n: int, nested: bool) -> None:
    """Lock a node (tensordict: ``clone(False)`` then ``lock_()``, as it flags in place)."""
    data = _nested(n)[0] if nested else _flat(n)[0]
    td = _node(impl, data)
    if impl.name == "pytree":
        out = benchmark(_copied, data) if nested else benchmark(data.copy)
        assert out.keys() == data.keys()
    elif impl.name == "tensordict":
        out = benchmark(lambda: td.clone(False).lock_())
        assert out.is_locked
    else:
        out = benchmark(impl.lock, td)
        assert out.is_locked


@pytest.mark.pytree
@pytest.mark.parametrize("n", SIZES)
def test_create_flat(benchmark, impl: Impl, n: int) -> None:
    """A node from a flat dict (pytree: the checked merge into an empty dict)."""
    data = _flat(n)[0]
    if impl.name == "pytree":
        out = benchmark(_checked_merge, {}, data)
    else:
        out = benchmark(impl.node, data, tuple(BATCH))
    assert len(list(out.keys())) == n
