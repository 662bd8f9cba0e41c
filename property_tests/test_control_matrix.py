"""The control-flow matrix: every operator of ``tdtree.control`` x (eager, compiled with the eager and
aot_eager backends) x (node, tagged node, tensorclass), a sibling of ``test_matrix.py`` with its inputs
(nested, a non-contiguous leaf, a zero-size leaf) and its checks.

Each cell compares with torch's own operator run over the equivalent plain dict of tensors in the same
run, leaf by leaf; checks the input unchanged (values and ``tensor._version``); and checks that every
node of the result is untagged (the results are new tensors). Eager cells draw inputs with hypothesis;
a compiled cell calls every row in one ``fullgraph=True`` trace per (input, backend), on one fixed input.
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


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("kind", ["Untagged", "Locked", "TensorClass"])
def test_control_compiled(backend: str, kind: str) -> None:
    x, d, bs = _input(kind, M.FIXED_SPEC)
    before = M._snapshot(x)
    got = torch.compile(lambda x: tuple(row.node(x) for row in ROWS), backend=backend, fullgraph=True)(x)
    want = torch.compile(lambda d: tuple(row.plain(d, bs) for row in ROWS), backend=backend, fullgraph=True)(d)
    M._assert_unchanged(x, before)
    for row, g, w in zip(ROWS, got, want):
        _check(row, x, g, w)
