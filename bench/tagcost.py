"""What the tag rule adds to an operation, against the least it could: ``python -m bench.tagcost``.

Usage: ``python -m bench.tagcost [--rounds 40] [--number 100]``

For each case (an operation on a node of N leaves, flat or with half of them in a sub-node, and on
a memmapped dataset's node) it times three things in interleaved rounds, one torch thread, gc off,
and keeps the minimum of each:

* ``untagged``: the operation on an untagged node;
* ``tagged``: the same operation on the same leaves in a tagged node (``lock()``; the dataset's
  node is ``Memmap``), the tag rule included;
* ``floor``: the untagged operation plus the least the contract asks of the rule, written inline
  for the kind of result: a memo lookup of what the rule knows of the input, then for a result of
  the input's own entries (select, exclude) an identity test per entry and one tagged root; for a
  result of new tensors (clone, +) one storage lookup; for a result of views (an index, a
  reshape) a storage lookup per leaf and one new tagged node per level.

It prints ``tagged / untagged`` and ``floor / untagged`` per case: the first is what a user pays for
the tags, the second the least any implementation of the rule that keeps DESIGN 3.1 (operations
build untagged nodes; the rule alone writes tags) could make it. Both are ratios measured side by
side in one process; on a shared machine compare them, not the times.
``bench/test_tagcost.py`` runs it in ``make test`` with one round and checks that each floor gives
the tags the rule gives.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import timeit
from collections.abc import Callable
from operator import countOf, is_
from typing import Any

import torch

import tdtree as tt
from tdtree import _base, _known, _tags

__all__ = ["Case", "cases", "floor", "measure", "table", "main"]

_storage = torch.Tensor.untyped_storage

# (name, untagged node, tagged node with the same leaves, the operation, the kind of its result)
Case = tuple[str, Any, Any, Callable[[Any], Any], str]

_OPS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "select 1": (lambda td: td.select("k0"), "own"),
    "exclude 1": (lambda td: td.exclude("k0"), "own"),
    "clone": (lambda td: td.clone(), "new"),
    "+ 1": (lambda td: td + 1, "new"),
    "td[0]": (lambda td: td[0], "view"),
    "td[:2]": (lambda td: td[:2], "view"),
    "reshape": (lambda td: td.reshape(2, 2), "view"),
}


def _node(n: int, nested: bool) -> tt.TensorDict:
    leaves = {f"k{i}": torch.zeros(4, 3) for i in range(n)}
    if nested:
        names = sorted(leaves, key=lambda k: int(k[1:]))
        half = len(names) // 2
        leaves = {**{k: leaves[k] for k in names[:half]}, "sub": {k: leaves[k] for k in names[half:]}}
    return tt.TensorDict(leaves, batch_size=[4])


def _dataset(prefix: str) -> tt.TensorDict:
    rows = 1000
    return tt.TensorDict(
        {
            "obs": torch.randn(rows, 8),
            "action": torch.randn(rows, 2),
            "reward": torch.randn(rows),
            "next": {
                "obs": torch.randn(rows, 8),
                "reward": torch.randn(rows),
                "done": torch.zeros(rows, dtype=torch.bool),
            },
        },
        batch_size=[rows],
    ).memmap(os.path.join(prefix, "dataset"))


def cases(prefix: str) -> list[Case]:
    """Every case, the dataset's node memmapped under ``prefix``."""
    out: list[Case] = []
    for n, nested in ((1, False), (10, False), (100, False), (10, True), (100, True)):
        td = _node(n, nested)
        locked = td.lock()
        for name, (op, kind) in _OPS.items():
            out.append((f"{'nested' if nested else 'flat'} N={n} {name}", td, locked, op, kind))
    mapped = _dataset(prefix)
    plain = tt.TensorDict(mapped.to_dict(), batch_size=mapped.batch_size)  # the same leaves, untagged
    rows = torch.randperm(1000)[:32]
    for name, op, kind in (
        ("td[0:32]", lambda td: td[0:32], "view"),
        ("td[5]", lambda td: td[5], "view"),
        ("td[idx]", lambda td: td[rows], "new"),
        ("clone", lambda td: td.clone(), "new"),
        ("select obs, next", lambda td: td.select("obs", "next"), "own"),
    ):
        out.append((f"memmapped dataset {name}", plain, mapped, op, kind))
    return out


def floor(case: Case) -> Any:
    """One call of ``case``'s floor: the untagged operation and the least work of the rule."""
    _, plain, tagged, op, kind = case
    out = op(plain)
    known = _base.memo(tagged, _known.Known)
    cls, tags = type(tagged), type(tagged)._tags
    if kind == "new":
        first = next(iter(out._data.values()))
        storage = first.untyped_storage()
        if storage not in known.storages and storage.nbytes():
            return out
        raise AssertionError(f"{case[0]}: the first leaf is on one of the input's storages")
    if kind == "own":
        data = out._data
        if not all(map(is_, data.values(), map(plain._data.get, data))):
            raise AssertionError(f"{case[0]}: the result holds entries that are not the input's")
        return _base._tagged_copy(out, data, cls, tags, _tags.variant)
    return _tagged_views(out, known.storages, cls, tags, case[0])


def _tagged_views(node: Any, seen: set, cls: type, tags: frozenset, name: str) -> Any:
    """``node``, a result of views, as the rule keeps it: every level's storages looked up (in C), and
    a tagged copy of every node, each parent holding its children's copies."""
    data = node._data
    values = data.values()
    if countOf(map(type, values), torch.Tensor) == len(data):  # a level of plain tensors
        if not seen.issuperset(map(_storage, values)):
            raise AssertionError(f"{name}: a leaf of the result is on a new storage")
        return _base._tagged_copy(node, data, cls, tags, _tags.variant)
    tensors = []
    for k, v in data.items():
        if type(v) is torch.Tensor:
            tensors.append(v)
        else:
            if data is node._data:
                data = data.copy()
            data[k] = _tagged_views(v, seen, cls, tags, name)
    if not seen.issuperset(map(_storage, tensors)):
        raise AssertionError(f"{name}: a leaf of the result is on a new storage")
    return _base._tagged_copy(node, data, cls, tags, _tags.variant)


def measure(rounds: int = 40, number: int = 100) -> dict[str, tuple[float, float, float]]:
    """Each case's best time in µs (untagged, tagged, floor) over ``rounds`` interleaved rounds of
    ``number`` calls."""
    torch.set_num_threads(1)
    best: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as prefix:
        every = cases(prefix)
        enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(rounds):
                for case in every:
                    name, plain, tagged, op, _ = case
                    calls = (lambda: op(plain), lambda: op(tagged), lambda: floor(case))
                    times = [timeit.timeit(call, number=number) / number * 1e6 for call in calls]
                    best[name] = [min(pair) for pair in zip(best.get(name, times), times)]
        finally:
            if enabled:
                gc.enable()
    return {name: (u, t, f) for name, (u, t, f) in best.items()}


def table(results: dict[str, tuple[float, float, float]]) -> str:
    lines = [
        "| case | untagged (µs) | tagged / untagged | floor / untagged |",
        "|---|---|---|---|",
    ]
    for name, (untagged, tagged, least) in results.items():
        lines.append(f"| {name} | {untagged:.2f} | {tagged / untagged:.2f} | {least / untagged:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tagcost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds (the minimum is kept)")
    parser.add_argument("--number", type=int, default=100, help="calls per round and case")
    args = parser.parse_args(argv)
    print(table(measure(args.rounds, args.number)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
