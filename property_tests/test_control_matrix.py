"""The control-flow matrix: every operator of ``tdtree.control`` x (eager, compiled with the eager and
aot_eager backends) x (node, tagged node, tensorclass), a sibling of ``test_matrix.py`` with its inputs
(nested, a non-contiguous leaf, a zero-size leaf) and its checks.

Each cell compares with torch's own operator run over the equivalent plain dict of tensors in the same
run, leaf by leaf; checks the input unchanged (values and ``tensor._version``); and checks that every
node of the result is untagged (the results are new tensors). Eager cells draw inputs with hypothesis;
a compiled cell calls every row in one ``fullgraph=True`` trace per input, on one fixed input, whose
graph each backend compiles and runs (``test_matrix.compiled_by_each``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optree
import pytest
import torch
from hypothesis import given, settings

import tdtree as tt
from tdtree import _torch_private as P

from . import test_matrix as M

NO_TAGS: frozenset = frozenset()


def _b(x: Any) -> torch.Tensor:
    return x.b if isinstance(x, tt.TensorClass) else x["b"]


def _tmap(fn: Callable[[torch.Tensor], torch.Tensor], d: Any) -> Any:
    return optree.tree_map(fn, d)


@dataclass(frozen=True)
class Row:
    name: str
    node: Callable[[Any], Any]
    plain: Callable[[Any, torch.Size], Any]


ROWS = [
    Row(
        "cond",
        lambda x: tt.control.cond(_b(x).sum() > 0, lambda y: y * 2, lambda y: y + 1, (x,)),
        lambda d, bs: torch.cond(
            d["b"].sum() > 0, lambda e: _tmap(lambda t: t * 2, e), lambda e: _tmap(lambda t: t + 1, e), (d,)
        ),
    ),
    Row(
        "while_loop",
        lambda x: tt.control.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, y * 0.5 + 1), (torch.tensor(0), x)),
        lambda d, bs: torch.while_loop(
            lambda i, e: i < 2, lambda i, e: (i + 1, _tmap(lambda t: t * 0.5 + 1, e)), (torch.tensor(0), d)
        ),
    ),
    Row(
        "scan_reverse",
        lambda x: tt.control.scan(lambda c, s: (c + _b(s), s * 2), torch.zeros(x.batch_size[1:]), x, reverse=True),
        lambda d, bs: P.scan(
            lambda c, s: (c + s["b"], _tmap(lambda t: t * 2, s)), torch.zeros(bs[1:]), d, reverse=True
        ),
    ),
    Row(
        "associative_scan",
        lambda x: tt.control.associative_scan(lambda u, v: u + v, x, 0, combine_mode="generic"),
        lambda d, bs: P.associative_scan(lambda u, v: optree.tree_map(torch.add, u, v), d, 0, combine_mode="generic"),
    ),
    Row(
        "map",
        lambda x: tt.control.map(lambda s: s * 2 + 1, x),
        lambda d, bs: P.hop_map(lambda e: _tmap(lambda t: t * 2 + 1, e), d),
    ),
]
KINDS = ("Untagged", "Locked", "Shared", "TensorClass")


def _input(kind: str, spec: tuple[int, ...]) -> tuple[Any, dict[str, Any], torch.Size]:
    data = M._data(spec)
    bs = torch.Size(spec[:3])
    return M._node(kind, data, tuple(bs), lambda: ""), M._data(spec), bs


def _check(row: Row, x: Any, got: Any, want: Any) -> None:
    M.assert_same_values(M.plain(got), M.plain(want))
    M.check_tags(got, [x], frozenset(x.tags), lambda common: NO_TAGS, row.name)
    if isinstance(x, tt.TensorClass):
        assert all(isinstance(n, tt.TensorClass) for n in M._nodes_in(got) if n.batch_size[-3:] == x.batch_size[-3:])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_control_eager(row: Row, kind: str) -> None:
    @settings(max_examples=2, deadline=None)
    @given(M.SPECS)
    def cell(spec: tuple[int, ...]) -> None:
        x, d, bs = _input(kind, spec)
        before = M._snapshot(x)
        got = row.node(x)
        M._assert_unchanged(x, before)
        _check(row, x, got, row.plain(d, bs))

    cell()


BACKENDS = ("eager", "aot_eager")
# (kind, backend) -> the input, its snapshot and the compiled rows' results; "dict" -> the plain
# dict's, which every kind is compared with. One dynamo trace per input serves both backends.
_TRACED: dict[Any, Any] = {}


def _traced(kind: str, backend: str) -> tuple[Any, Any, Any, Any]:
    """The input of ``kind``, its snapshot, and ``backend``'s compiled results over it and over the
    equivalent dict (each a tuple, one per row, or the exception its compilation or run raised)."""
    if (kind, backend) not in _TRACED:
        x, d, bs = _input(kind, M.FIXED_SPEC)
        if "dict" not in _TRACED:
            _TRACED["dict"] = d, M.compiled_by_each(lambda d: tuple(row.plain(d, bs) for row in ROWS), d, BACKENDS)
        d0, want = _TRACED["dict"]
        M.assert_same_values(d, d0)  # every kind's input holds the values of the one dict compiled
        before = M._snapshot(x)
        got = M.compiled_by_each(lambda x: tuple(row.node(x) for row in ROWS), x, BACKENDS)
        for b in BACKENDS:
            _TRACED[kind, b] = x, before, got[b], want[b]
    return _TRACED[kind, backend]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["Untagged", "Locked", "TensorClass"])
def test_control_compiled(backend: str, kind: str) -> None:
    x, before, got, want = _traced(kind, backend)
    for out in (got, want):
        if isinstance(out, Exception):
            raise out
    M._assert_unchanged(x, before)
    for row, g, w in zip(ROWS, got, want):
        _check(row, x, g, w)
