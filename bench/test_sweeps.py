"""Size sweeps: how the cost of each operation grows with the node, for tdtree, tensordict and the floor.

Four families, each one parametrized case over the operations and the sizes:

* ``width``: flat nodes of 1 to 10,000 leaves of shape (4,), batch (4,); cost per leaf.
* ``depth``: chains 1 to 256 levels deep, a leaf "x" of shape (4,) and the next level "n" at each
  level, batch (4,); cost per level. tensordict 0.15 cannot build a chain much past 200 levels
  inside pytest at Python's default recursion limit (its creation recurses, 4 frames a level), so
  its deepest row is 192 and 256 has no tensordict row (``no_tensordict`` on the size, see
  bench/conftest.py): deeper chains go on ``DEPTHS`` the same way.
* ``batch``: {"obs": (rows, 4), "reward": (rows,), "next": {"obs": (rows, 4)}} of 1 to 262,144
  rows; ``td[perm]`` (every row, permuted), ``td[::2]``, ``td[::2]`` of a locked node (views: the
  result keeps the tags) and ``stack([td, td])``; cost per row.
* ``bytes``: 8 flat float32 leaves of 1 KiB to 64 MiB in all; clone, memmap write and read,
  one-file save and load; cost per byte.

The operations on width and depth: ``create`` (the node from a nested dict), ``clone``, ``apply``
(``x + 1``), ``select`` of every other leaf key, ``clone_locked``, ``apply_locked`` and
``select_locked`` (the same on a locked node: an operation on a tagged node, whose cost the tag rule
adds to), ``update`` from a nested dict of new tensors for every leaf, ``flatten``
(``tree_flatten``), ``keys`` (``keys(include_nested=True)``) and ``lock`` (a locked node, the input
unchanged). The floor's rows are plain nested dicts (bench/plain.py, optree): a dict has no lock, so
the ``*_locked`` rows are held to the plain operation and ``lock`` to a copy of the dicts; ``memmap``
writes and reads a file per leaf; ``save`` / ``load`` are ``torch.save`` / ``torch.load``
(``weights_only=True``). tensordict's rows are spelled by :mod:`bench.impls`.

Every result carries ``extra_info`` ``sweep`` (the family), ``op``, ``size`` and ``unit``;
``python -m bench.report`` fits each (family, op, implementation) to a growth exponent and a cost
per unit (bench/growth.py). Under ``--benchmark-disable`` (``make test``) the sizes marked
``bench_only`` are deselected: each family runs its smallest size and one larger there, once;
``make bench`` runs every size. ``make bench-quick`` runs none (no case here is ``quick``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from . import plain
from .impls import Impl, Thunk

pytestmark = [pytest.mark.sweep, pytest.mark.pytree]

KIB, MIB = 1024, 1024**2
LEAF = (4,)  # the batch of the width and depth nodes, and each leaf's shape


def _bench_only(size: int, id: str | None = None) -> Any:
    return pytest.param(size, id=id, marks=pytest.mark.bench_only)


# Under --benchmark-disable each family runs its smallest size and one larger (the sizes not marked
# bench_only): the code is the same at every size, and the largest are the costly part.
WIDTHS = (1, _bench_only(10), _bench_only(100), 1_000, _bench_only(10_000))
DEPTHS = (1, _bench_only(4), _bench_only(16), _bench_only(64), 192, pytest.param(256, marks=pytest.mark.no_tensordict))
ROWS = (1, *map(_bench_only, (8, 64, 512)), 4_096, _bench_only(32_768), _bench_only(262_144))
BYTES = (
    pytest.param(KIB, id="1KiB"),
    _bench_only(16 * KIB, "16KiB"),
    pytest.param(256 * KIB, id="256KiB"),
    _bench_only(4 * MIB, "4MiB"),
    _bench_only(64 * MIB, "64MiB"),
)
BYTES_LEAVES = 8


def _label(benchmark: Any, family: str, op: str, size: int, unit: str) -> None:
    benchmark.extra_info.update(sweep=family, op=op, size=size, unit=unit)


# -- width and depth -------------------------------------------------------------------------------


def flat_source(n: int, fill: float = 0.0) -> dict[str, Any]:
    """``n`` leaves "k0", "k1", ... of shape (4,)."""
    return {f"k{i}": torch.full(LEAF, fill + i) for i in range(n)}


def chain_source(depth: int, fill: float = 0.0) -> dict[str, Any]:
    """``depth`` levels, each a leaf "x" of shape (4,) and (but the last) the next level "n"; built
    without recursion, so any depth can be asked for."""
    root: dict[str, Any] = {}
    level = root
    for i in range(depth):
        level["x"] = torch.full(LEAF, fill + i)
        if i + 1 < depth:
            level["n"] = {}
            level = level["n"]
    return root


def _plus_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _every_other_leaf(impl: Impl, td: Any) -> list[Any]:
    return impl.keys(td, True, True)()[::2]


# op -> (what tdtree must have, the thunk for (impl, node, source, a source of new tensors))
SHAPE_OPS: dict[str, tuple[str, Callable[[Impl, Any, dict[str, Any], dict[str, Any]], Thunk]]] = {
    "create": ("__init__", lambda impl, td, source, new: functools.partial(impl.node, source, LEAF)),
    "clone": ("clone", lambda impl, td, source, new: impl.clone(td)),
    "clone_locked": ("lock", lambda impl, td, source, new: impl.clone(impl.lock(td))),
    "apply": ("apply", lambda impl, td, source, new: impl.method(td, "apply", _plus_one)),
    "apply_locked": ("lock", lambda impl, td, source, new: impl.method(impl.lock(td), "apply", _plus_one)),
    "select": ("select", lambda impl, td, source, new: impl.select(td, *_every_other_leaf(impl, td))),
    "select_locked": (
        "lock",
        lambda impl, td, source, new: impl.select(impl.lock(td), *_every_other_leaf(impl, td)),
    ),
    "update": ("update", lambda impl, td, source, new: impl.update(td, new)),
    "flatten": ("tdtree.tree", lambda impl, td, source, new: impl.tree_flatten(td)),
    "keys": ("keys", lambda impl, td, source, new: impl.keys(td, True)),
    "lock": ("lock", lambda impl, td, source, new: impl.locked(td)),
}


def _shape_case(benchmark: Any, impl: Impl, family: str, op: str, size: int, unit: str, build: Any) -> None:
    """Time ``op`` on the node of ``build(size)`` and check the result against the source's leaves."""
    _label(benchmark, family, op, size, unit)
    needs, thunk_of = SHAPE_OPS[op]
    impl.require(needs)
    source, new = build(size), build(size, fill=0.5)
    td = impl.node(source, LEAF)
    out = benchmark(thunk_of(impl, td, source, new))
    leaves = plain.nested_entries(source, True)[1]
    if op == "keys":
        assert len(out) == len(plain.nested_entries(source, False)[0])
        return
    if op == "flatten":
        assert sorted(float(x[0]) for x in out[0]) == sorted(float(x[0]) for x in leaves)
        return
    keys = impl.keys(out, True, True)()
    assert len(keys) == (math.ceil(len(leaves) / 2) if op.startswith("select") else len(leaves))
    for key in keys[:: max(1, len(keys) // 8)]:
        expected = plain.get_path(new if op == "update" else source, key)
        assert torch.equal(impl.get(out, key)(), expected + 1 if op.startswith("apply") else expected)


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("op", list(SHAPE_OPS))
def test_sweep_width(benchmark, impl: Impl, op: str, n: int) -> None:
    """``op`` on a flat node of ``n`` leaves (see the module doc); the unit is a leaf."""
    _shape_case(benchmark, impl, "width", op, n, "leaf", flat_source)


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("op", list(SHAPE_OPS))
def test_sweep_depth(benchmark, impl: Impl, op: str, depth: int) -> None:
    """``op`` on a chain ``depth`` levels deep (see the module doc); the unit is a level."""
    _shape_case(benchmark, impl, "depth", op, depth, "level", chain_source)


# -- batch -----------------------------------------------------------------------------------------


def rows_source(rows: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(rows)
    return {
        "obs": torch.rand(rows, 4, generator=gen),
        "reward": torch.rand(rows, generator=gen),
        "next": {"obs": torch.rand(rows, 4, generator=gen)},
    }


def _take(x: torch.Tensor, index: Any) -> torch.Tensor:
    return x[index]


BATCH_OPS = ("index", "slice", "slice_locked", "stack")


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("op", BATCH_OPS)
def test_sweep_batch(benchmark, impl: Impl, op: str, rows: int) -> None:
    """``td[perm]`` (every row, in a random order), ``td[::2]`` (of a locked node for
    ``slice_locked``) or ``stack([td, td])`` of ``rows`` rows; the unit is a row."""
    _label(benchmark, "batch", op, rows, "row")
    source = rows_source(rows)
    td = impl.node(source, (rows,))
    if op == "slice_locked":
        impl.require("lock")
        td = impl.lock(td)
    if op == "stack":
        impl.require("tdtree.stack")
        out = benchmark(impl.stack([td, td], 0))
        expected = torch.stack([source["next"]["obs"]] * 2)
    else:
        impl.require("td[idx]")
        index = (
            torch.randperm(rows, generator=torch.Generator().manual_seed(0)) if op == "index" else slice(None, None, 2)
        )
        out = benchmark(impl.getitem(td, index))
        expected = _take(source["next"]["obs"], index)
    assert torch.equal(impl.get(out, ("next", "obs"))(), expected)


# -- bytes -----------------------------------------------------------------------------------------


def bytes_source(nbytes: int) -> dict[str, Any]:
    """``BYTES_LEAVES`` float32 leaves "w0", "w1", ... of ``nbytes`` in all."""
    numel = nbytes // (4 * BYTES_LEAVES)
    return {f"w{i}": torch.full((numel,), float(i)) for i in range(BYTES_LEAVES)}


BYTES_OPS = ("clone", "memmap_write", "memmap_read", "save", "load")


@pytest.mark.parametrize("nbytes", BYTES)
@pytest.mark.parametrize("op", BYTES_OPS)
def test_sweep_bytes(benchmark, impl: Impl, op: str, nbytes: int, tmp_path: Path) -> None:
    """``op`` on a node of ``nbytes`` (see the module doc; ``memmap_read`` maps the directory and
    clones it into memory, so that the bytes are read); the unit is a byte."""
    _label(benchmark, "bytes", op, nbytes, "byte")
    source = bytes_source(nbytes)
    td = impl.node(source, ())
    directory, file = tmp_path / "node", tmp_path / "node.pt"
    if op == "clone":
        out = benchmark(impl.clone(td))
    elif op.startswith("memmap"):
        impl.require("memmap", "tdtree.load_memmap")
        write, read = impl.memmap_write(td, directory), impl.memmap_read(directory, td)
        if op == "memmap_read":
            write()
        out = benchmark(read if op == "memmap_read" else write)
        out = read()
    else:
        impl.require("tdtree.save", "tdtree.load")
        save, load = impl.save(td, file), impl.load(file)
        if op == "load":
            save()
        benchmark(load if op == "load" else save)
        out = load()
    for key, leaf in source.items():
        assert torch.equal(out[key], leaf) and out[key].data_ptr() != leaf.data_ptr()
