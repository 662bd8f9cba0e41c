"""The matrix: every operation of ``_optable.ROWS`` x every context x every input.

A cell runs one operation in one context on one kind of input, and runs the same
computation over the equivalent plain dict of tensors (``optree.tree_map`` and torch
only). It checks:

* no crash where the dict version runs;
* the same values as the dict version, leaf by leaf;
* the inputs unchanged (values and ``tensor._version``);
* the tags of every node of the result equal to the rule computed here from the
  ``data_ptr`` of the storages (under functorch wrappers, of the tensors they wrap):
  the common tags of the inputs when every leaf with data uses an input's storage,
  else none; nodes built by pytree unflatten (what ``torch.func`` returns) carry none
  (DESIGN 3.1), and a functional editor on a Locked node raises LockedError;
* every claim true: each leaf with data of a Shared node ``is_shared()``, of a Memmap
  node has a file behind its storage.

Compiled cells run one function per input that calls every row: one dynamo trace,
whose graph each backend (eager, aot_eager) compiles and runs, as ``torch.compile``
with that backend does; when a backend's run fails, the rows are compiled in smaller
groups to name the failing ones. They use one fixed input; the other contexts draw a
few inputs with hypothesis.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from torch._C import _functorch

import tdtree as tt
from tdtree._base import Node
from tdtree.errors import LockedError

from ._optable import ROWS, Row

# -- inputs ----------------------------------------------------------------------------------------


class Rec(tt.TensorClass):
    a: torch.Tensor
    b: torch.Tensor
    n: tt.TensorDict


KINDS = ("Untagged", "Locked", "Shared", "Memmap", "TensorClass", "TensorClassShared")
TAGS = {
    "Untagged": frozenset(),
    "Locked": frozenset({tt.Locked}),
    "Shared": frozenset({tt.Shared, tt.Locked}),
    "Memmap": frozenset({tt.Memmap, tt.Locked}),
    "TensorClass": frozenset(),
    "TensorClassShared": frozenset({tt.Shared, tt.Locked}),
}
# (A, B, C, size of the feature dim of n.x (0: a second zero-size leaf), seed); batch_size (A, B, C)
SPECS = st.tuples(st.integers(2, 3), st.integers(1, 2), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2**16))
FIXED_SPEC = (2, 2, 3, 1, 0)


def _data(spec: tuple[int, ...]) -> dict[str, Any]:
    a, b, c, f, seed = spec
    g = torch.Generator().manual_seed(seed)
    bs = (a, b, c)
    return {
        "a": torch.randn(*bs, 2, 3, generator=g).transpose(-1, -2),  # not contiguous
        "b": torch.randn(*bs, generator=g),
        "n": {"x": torch.randn(*bs, f, generator=g), "z": torch.zeros(*bs, 0)},
    }


def _node(kind: str, data: dict[str, Any], batch_size: tuple[int, ...], newdir: Callable[[], str]) -> Any:
    """The input of ``kind`` holding ``data`` (a nested dict), tagged as ``kind`` says."""
    if kind.startswith("TensorClass"):
        x: Any = Rec(a=data["a"], b=data["b"], n=tt.TensorDict(data["n"], batch_size), batch_size=batch_size)
    else:
        x = tt.TensorDict(data, batch_size)
    if tt.Memmap in TAGS[kind]:
        return x.memmap(newdir())
    if tt.Shared in TAGS[kind]:
        return x.share_memory()
    return x.lock() if TAGS[kind] else x


def plain(obj: Any) -> Any:
    """A result as plain containers: nodes and tensorclasses as dicts, tuples as tuples."""
    if isinstance(obj, tt.TensorClass):
        return plain(obj._td)
    if isinstance(obj, Node):
        return {k: plain(v) for k, v in obj._data.items()}
    if isinstance(obj, (tuple, list)):
        return tuple(plain(v) for v in obj)
    return obj


def _snapshot(obj: Any) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    return [(t, t._version, t.clone()) for t in optree.tree_leaves(plain(obj))]


def _assert_unchanged(obj: Any, before: list[tuple[torch.Tensor, int, torch.Tensor]]) -> None:
    after = optree.tree_leaves(plain(obj))
    assert len(after) == len(before)
    for t, (orig, version, values) in zip(after, before):
        assert t is orig, "an input's leaf was replaced"
        assert t._version == version, "an input's leaf was written in place"
        torch.testing.assert_close(t, values, rtol=0, atol=0, equal_nan=True)


# -- the rule, computed here -----------------------------------------------------------------------


def _unwrapped(t: torch.Tensor) -> torch.Tensor:
    while _functorch.is_functorch_wrapped_tensor(t):
        t = _functorch.get_unwrapped(t)
    return t


def _storages(obj: Any) -> set[tuple[torch.device, int]]:
    """(device, data_ptr) of every storage with data under ``obj``'s tensors, seen through wrappers."""
    out = set()
    for t in optree.tree_leaves(plain(obj)):
        if isinstance(t, torch.Tensor):
            s = _unwrapped(t).untyped_storage()
            if s.nbytes():
                out.add((s.device, s.data_ptr()))
    return out


def _nodes_in(obj: Any) -> list[Any]:
    """The nodes and tensorclass instances a result is made of (each decided alone by the rule)."""
    if isinstance(obj, (Node, tt.TensorClass)):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [n for v in obj for n in _nodes_in(v)]
    return []


def _sub_nodes(node: Any) -> list[Node]:
    node = node._td if isinstance(node, tt.TensorClass) else node
    return [node, *(s for v in node._data.values() if isinstance(v, Node) for s in _sub_nodes(v))]


def _names(tags: frozenset) -> list[str]:
    return sorted(t.name for t in tags)


def _check_claims(node: Any, tags: frozenset, where: str) -> None:
    for t in optree.tree_leaves(plain(node)):
        s = _unwrapped(t).untyped_storage()
        if not s.nbytes():
            continue
        if tt.Shared in tags:
            assert s.is_shared(), f"{where}: a Shared node holds a leaf outside shared memory"
        if tt.Memmap in tags:
            assert s.filename is not None, f"{where}: a Memmap node holds a leaf with no file behind it"


def check_tags(
    out: Any, inputs: list[Any], common: frozenset, made: Callable[[frozenset], frozenset] | None, where: str
) -> None:
    """Every node of ``out`` carries the tags the rule gives (or ``made(common)`` for a tag-making op)."""
    known = set().union(*map(_storages, inputs))
    for node in _nodes_in(out):
        want = made(common) if made else common if _storages(node) <= known else frozenset()
        got = {frozenset(sub.tags) for sub in _sub_nodes(node)}
        assert got == {want}, f"{where}: tags {sorted(map(_names, got))}, the rule gives {_names(want)}"
        _check_claims(node, want, where)


# -- calling a row ---------------------------------------------------------------------------------


def _fn(row: Row, x: Any) -> Callable[[Any], Any]:
    return row.tc if isinstance(x, tt.TensorClass) and callable(row.tc) else row.node  # type: ignore[return-value]


def _editable(row: Row, x: Any, tags: frozenset) -> Any:
    return x.unlock() if row.editor and tt.Locked in tags else x


def checked_call(row: Row, x: Any, tags: frozenset, where: str) -> Any:
    """``row`` on ``x`` (whose tags must be ``tags``), with its LockedError and the rule checked."""
    assert frozenset(x.tags) == tags, f"{where}: the node the operation gets has tags {_names(x.tags)}"
    fn = _fn(row, x)
    if row.editor and tt.Locked in tags:
        with pytest.raises(LockedError):
            fn(x)
    y = _editable(row, x, tags)
    out = fn(y)
    check_tags(out, [y], frozenset(y.tags), row.tags, where + " (inside)")
    return out


def scalar(out: Any) -> torch.Tensor:
    """A scalar of the float leaves of a result, to differentiate."""
    leaves = [t for t in optree.tree_leaves(plain(out)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(((t * t).sum() for t in leaves), torch.zeros(()))


def assert_same_values(got: Any, want: Any, path: str = "") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), f"at {path or 'the root'}: {type(got).__name__} where the dict has a dict"
        assert sorted(got) == sorted(want), f"at {path or 'the root'}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_same_values(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), f"at {path}: {len(want)} results expected"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_values(g, w, f"{path}[{i}]")
    elif want is None:
        assert got is None, f"at {path}: None expected"
    else:
        assert isinstance(got, torch.Tensor), f"at {path}: {type(got).__name__} where the dict has a tensor"
        assert got.dtype == want.dtype and got.shape == want.shape, (
            f"at {path}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
        )
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, msg=lambda m: f"at {path}: {m}")


# -- contexts --------------------------------------------------------------------------------------

COMPILED = {"compile_eager": "eager", "compile_aot_eager": "aot_eager"}
# the batch dims the operation sees in each context (vmap contexts map the empty-batch ensemble)
BATCH_DIMS = {"eager": 3, **dict.fromkeys(COMPILED, 3), "tt_vmap": 2, "vmap": 0, "grad": 3, "jvp": 3, "vmap_grad": 0}
DIFFERENTIATED = ("grad", "jvp", "vmap_grad")
CONTEXTS = tuple(BATCH_DIMS)
EXAMPLES = {"eager": 3, "tt_vmap": 2, "vmap": 1, "grad": 1, "jvp": 1, "vmap_grad": 1}
NONE = frozenset()


class Case:
    """One drawn input of one kind: the node, its dict twin, and the ensemble (empty batch size) for vmap."""

    def __init__(self, kind: str, spec: tuple[int, ...], newdir: Callable[[], str], ensemble: bool) -> None:
        data = _data(spec)
        self.bs = torch.Size(spec[:3])
        self.tags = TAGS[kind]
        self.batch = () if ensemble else tuple(self.bs)
        self.x = _node(kind, data, self.batch, newdir)
        self.d = optree.tree_map(torch.clone, plain(self.x))
        self.kind, self.newdir = kind, newdir

    def like(self, data: Any) -> Any:
        """A node of this case's kind, batch size and tags holding ``data`` (a dict like ``self.d``)."""
        return _node(self.kind, data, self.batch, self.newdir)


def run_context(row: Row, context: str, case: Case) -> tuple[Any, Any, Callable[[Any], None]]:
    """``(node result, dict result, the check of the result's tags)`` of ``row`` in ``context``."""
    x, d, bs, where = case.x, case.d, case.bs, f"{row.name}-{context}"

    def on_node(tags: frozenset) -> Callable[[Any], Any]:
        return lambda n: checked_call(row, n, tags, where)

    def untagged(out: Any) -> None:  # built by torch.func's unflatten (DESIGN 3.1)
        check_tags(out, [], NONE, lambda _: NONE, where)

    def ruled(out: Any) -> None:
        check_tags(out, [x], case.tags, None, where)

    if context == "eager":
        out = checked_call(row, x, case.tags, where)
        return out, row.plain(d, bs), lambda o: None  # checked inside checked_call
    if context == "tt_vmap":
        # tdtree.vmap builds the nodes it hands the function from its arguments' leaves, seen through
        # the batching wrappers: by the rule (tdtree's own functions apply it, DESIGN 3.1) they keep
        # the argument's tags, so an editor on a Locked node refuses inside as it does outside
        out = tt.vmap(on_node(case.tags))(x)
        return out, torch.func.vmap(lambda d: row.plain(d, bs[1:]))(d), ruled
    if context == "vmap":
        return torch.func.vmap(on_node(NONE))(x), torch.func.vmap(lambda d: row.plain(d, torch.Size()))(d), untagged
    if context == "grad":
        out = torch.func.grad(lambda n: scalar(on_node(NONE)(n)))(x)
        return out, torch.func.grad(lambda d: scalar(row.plain(d, bs)))(d), untagged
    if context == "vmap_grad":
        out = torch.func.vmap(torch.func.grad(lambda n: scalar(on_node(NONE)(n))))(x)
        want = torch.func.vmap(torch.func.grad(lambda d: scalar(row.plain(d, torch.Size()))))(d)
        return out, want, untagged
    if context == "jvp":
        t = optree.tree_map(lambda v: torch.linspace(-1, 1, v.numel()).reshape(v.shape), d)
        out = torch.func.jvp(on_node(NONE), (x,), (case.like(t),))
        return out, torch.func.jvp(lambda d: row.plain(d, bs), (d,), (t,)), untagged
    raise AssertionError(context)


def run_cell(row: Row, context: str, kind: str, spec: tuple[int, ...], newdir: Callable[[], str]) -> None:
    case = Case(kind, spec, newdir, ensemble=context in ("vmap", "vmap_grad"))
    before = _snapshot(case.x)
    out, want, check = run_context(row, context, case)
    assert_same_values(plain(out), want)
    check(out)
    _assert_unchanged(case.x, before)


# -- compiled cells: one dynamo trace per input, run by each backend -------------------------------

FULLGRAPH_RAISE = (
    "LockedError under torch.compile is checked with fullgraph=False: torch lets no exception leave a "
    "fullgraph frame, so with fullgraph=True the user gets torch._dynamo.exc.Unsupported: Observed exception "
    "(its message names LockedError and its arguments)"
)
_COMPILED: dict[tuple[str, str], tuple[Case, dict[str, Any], Any]] = {}


class _Backends:
    """A torch.compile backend that hands dynamo's graph to each backend of ``backends`` and runs the
    one ``use`` names: the compiled contexts differ only after dynamo, so one trace serves them all.

    Each backend compiles the graph as ``torch.compile(backend=name)`` would; one that fails to
    compile fails the calls made with it, not the trace.
    """

    def __init__(self, backends: tuple[str, ...]) -> None:
        self.backends = backends
        self.use = backends[0]

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        compiled: dict[str, Any] = {}
        for name in self.backends:
            try:
                compiled[name] = torch._dynamo.lookup_backend(name)(gm, example_inputs)
            except Exception as e:
                compiled[name] = e

        def run(*args: Any) -> Any:
            fn = compiled[self.use]
            if isinstance(fn, Exception):
                raise fn
            return fn(*args)

        return run


def compiled_by_each(fn: Callable[[Any], Any], arg: Any, backends: tuple[str, ...]) -> dict[str, Any]:
    """``fn(arg)`` compiled with ``fullgraph=True`` by each backend of ``backends`` from one dynamo
    trace, in a fresh cache (never a silent eager fallback at the recompile limit): each backend's
    result, or the exception its compilation or its run raised."""
    torch._dynamo.reset()
    each = _Backends(backends)
    compiled = torch.compile(fn, fullgraph=True, backend=each)
    outs: dict[str, Any] = {}
    for name in backends:
        each.use = name
        try:
            outs[name] = compiled(arg)
        except Exception as e:
            outs[name] = e
    return outs


def _compile_rows(rows: list[Row], case: Case, contexts: tuple[str, ...]) -> dict[str, Any]:
    """Each context's results of ``rows`` (a tuple, one per row) or the exception it raised."""

    def batch(x: Any) -> tuple[Any, ...]:
        return tuple(_fn(row, x)(_editable(row, x, case.tags)) for row in rows)

    outs = compiled_by_each(batch, case.x, tuple(COMPILED[c] for c in contexts))
    return {c: outs[COMPILED[c]] for c in contexts}


def _compile_group(rows: list[Row], case: Case, contexts: tuple[str, ...], results: dict[str, dict[str, Any]]) -> None:
    """Each row's compiled result in each context, or the exception its own compilation raises, into
    ``results[context]``.

    All rows are traced at once; a context whose group fails is split in chunks of about 8 rows, and
    only a failing chunk is compiled row by row, so a few failures cost a few small traces.
    """
    outs = _compile_rows(rows, case, contexts)
    failed = tuple(c for c in contexts if isinstance(outs[c], Exception))
    for context in contexts:
        if context not in failed:
            results[context].update(zip((r.name for r in rows), outs[context]))
    if not failed:
        return
    if len(rows) == 1:
        for context in failed:
            results[context][rows[0].name] = outs[context]
        return
    size = 1 if len(rows) <= 8 else 8
    for i in range(0, len(rows), size):
        _compile_group(rows[i : i + size], case, failed, results)


def _compiled(kind: str, context: str, newdir: Callable[[], str]) -> tuple[Case, dict[str, Any], Any]:
    """The fixed case of ``kind``, each row's compiled result (or the exception) and the input snapshot.

    Every compiled context of ``kind`` is made at the first call for any of them, from one trace."""
    if (kind, context) not in _COMPILED:
        case = Case(kind, FIXED_SPEC, newdir, ensemble=False)
        before = _snapshot(case.x)
        rows = [r for r, c, k in CELLS if c == context and k == kind]
        # the compiled contexts run the same rows (a row that cannot be traced cannot be by any backend)
        assert all([r for r, c, k in CELLS if c == other and k == kind] == rows for other in COMPILED), kind
        results: dict[str, dict[str, Any]] = {c: {} for c in COMPILED}
        _compile_group(rows, case, tuple(COMPILED), results)
        for c in COMPILED:
            _COMPILED[kind, c] = case, results[c], before
    return _COMPILED[kind, context]


def run_compiled_cell(row: Row, context: str, kind: str, newdir: Callable[[], str]) -> None:
    case, results, before = _compiled(kind, context, newdir)
    out = results[row.name]
    if isinstance(out, Exception):
        raise out
    where = f"{row.name}-{context}"
    assert_same_values(plain(out), row.plain(case.d, case.bs))
    y_tags = case.tags - {tt.Locked} if row.editor else case.tags
    check_tags(out, [case.x], y_tags, row.tags, where)
    _assert_unchanged(case.x, before)
    if row.editor and tt.Locked in case.tags and context == "compile_eager":
        # The refusal happens while dynamo traces, before any backend runs: one backend shows it.
        # Without fullgraph, as FULLGRAPH_RAISE says: no exception leaves a fullgraph frame.
        torch._dynamo.reset()
        with pytest.raises(LockedError):
            torch.compile(_fn(row, case.x), backend=COMPILED[context])(case.x)


# -- the cells -------------------------------------------------------------------------------------


def _not_applicable(row: Row, context: str, kind: str) -> str | None:
    if kind.startswith("TensorClass") and isinstance(row.tc, str):
        return row.tc
    if row.min_batch > BATCH_DIMS[context]:
        return f"needs {row.min_batch} batch dims; the node has {BATCH_DIMS[context]} in {context}"
    if not row.diff and context in DIFFERENTIATED:
        return "no float leaf in the result to differentiate"
    return None


CELLS: list[tuple[Row, str, str]] = []
CANNOT: list[tuple[str, str]] = []  # (cell id, reason): cells that cannot work, printed in the summary
NOT_APPLICABLE: list[str] = []
for _row, _context, _kind in itertools.product(ROWS, CONTEXTS, KINDS):
    _id = f"{_row.name}-{_context}-{_kind}"
    if _not_applicable(_row, _context, _kind):
        NOT_APPLICABLE.append(_id)
    elif _context in _row.cannot:
        CANNOT.append((_id, _row.cannot[_context]))
    else:
        CELLS.append((_row, _context, _kind))


def summary(write: Callable[[str], None]) -> None:
    """The matrix's size and the cells left out, for the terminal summary."""
    write(
        f"matrix: {len(ROWS)} operations x {len(CONTEXTS)} contexts x {len(KINDS)} inputs = "
        f"{len(ROWS) * len(CONTEXTS) * len(KINDS)}; {len(CELLS)} cells run, {len(NOT_APPLICABLE)} not applicable "
        f"(batch dims, tensorclass fields, nothing to differentiate), {len(CANNOT)} cannot work:"
    )
    reasons: dict[str, dict[str, int]] = {}
    for cell, reason in CANNOT:
        row_context = cell.rsplit("-", 1)[0]
        counts = reasons.setdefault(reason, {})
        counts[row_context] = counts.get(row_context, 0) + 1
    write(f"  note: {FULLGRAPH_RAISE}")
    for reason, counts in reasons.items():
        cells = ", ".join(f"{rc} ({n} inputs)" for rc, n in counts.items())
        write(f"  {sum(counts.values())} cells, {cells}: {reason}")


@pytest.fixture(scope="module")
def newdir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], str]:
    root = tmp_path_factory.mktemp("matrix")
    count = itertools.count()
    return lambda: os.path.join(root, str(next(count)))


# The compiled cells of one kind share one dynamo trace, its results cached per process in _COMPILED:
# make test's pytest-xdist runs a module in one worker (--dist loadfile), so each trace is made once.
@pytest.mark.parametrize(("row", "context", "kind"), CELLS, ids=[f"{r.name}-{c}-{k}" for r, c, k in CELLS])
def test_matrix(row: Row, context: str, kind: str, newdir: Callable[[], str]) -> None:
    if context in COMPILED:
        run_compiled_cell(row, context, kind, newdir)
        return

    # no shrinking: the cell's id names what fails, and a shrink would rerun it many times
    @settings(max_examples=EXAMPLES[context], phases=(Phase.explicit, Phase.reuse, Phase.generate))
    @given(SPECS)
    def cell(spec: tuple[int, ...]) -> None:
        run_cell(row, context, kind, spec, newdir)

    cell()
