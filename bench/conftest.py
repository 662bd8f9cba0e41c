"""Parametrize every bench case over the implementations and label its results.

A case takes the ``impl`` fixture and is run for ``tdtree`` and ``tensordict``;
cases marked ``pytree`` also run on plain dicts with optree, and cases marked
``no_tensordict`` (an operation tensordict lacks) have no tensordict row; a parameter marked
``no_tensordict`` (a size tensordict cannot reach) drops the tensordict row of that parameter
alone. ``--impls`` narrows the set (``bench.compare`` runs tdtree alone). Each result carries
``extra_info = {"case": ..., "impl": ...}`` and the case as its group, so the
report and the terminal table put the implementations of one case together.

Compiled cases take the ``compiler`` fixture. It compiles with
``fullgraph=True, dynamic=False`` and the backend of ``--compile-backend``:
by default ``inductor`` when timing and ``eager`` under ``--benchmark-disable``:
``make test`` runs each case once, to check that it still traces as one graph
(dynamo's part); inductor's code generation costs seconds per graph on two
cores, and even aot_eager doubles the cost of the tracing. tests/test_compile_*
check tdtree's graphs through aot_eager.

Cases marked ``bench_only`` (the largest sizes of the sweeps, bench/test_sweeps.py) are
deselected under ``--benchmark-disable``: ``make test`` runs every other case once, ``make bench``
runs them all.

Bench cases run with ``--torch-threads`` intra-op threads (default 1, restored
after each case). The suite times what a library adds around torch's kernels;
on a shared machine torch's thread pool waits at every parallel kernel for a
thread whose core is busy elsewhere, which made whole cases 10-100x slower in
one run and not in the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from .impls import IMPLS, TENSORDICT_MISSING, Impl

ALL = ("tdtree", "tensordict", "pytree")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impls",
        default=",".join(ALL),
        help="comma-separated implementations to run the bench cases on (default: all)",
    )
    parser.addoption(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads while a bench case runs (default: 1; see the module doc)",
    )
    parser.addoption(
        "--compile-backend",
        default=None,
        help="torch.compile backend of the compiled cases (default: inductor; eager with --benchmark-disable)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pytree: the case also runs on plain dicts with optree")
    config.addinivalue_line("markers", "quick: part of the representative subset run by make bench-quick")
    config.addinivalue_line(
        "markers",
        "no_tensordict: tensordict has no counterpart, so the case (or the parameter marked) has no tensordict row",
    )
    config.addinivalue_line("markers", "sweep: a size sweep, reported as growth exponents by bench.report")
    config.addinivalue_line("markers", "bench_only: too costly to run once under --benchmark-disable (make test)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tensordict rows of parameters marked ``no_tensordict`` and, under
    ``--benchmark-disable``, the cases marked ``bench_only`` (see the module doc)."""
    disabled = config.getoption("benchmark_disable")
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        impl_name = None if callspec is None else callspec.params.get("impl_name")
        dropped = (impl_name == "tensordict" and item.get_closest_marker("no_tensordict") is not None) or (
            disabled and item.get_closest_marker("bench_only") is not None
        )
        (drop if dropped else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" not in metafunc.fixturenames:
        return
    wanted = metafunc.config.getoption("--impls").split(",")
    unknown = set(wanted) - set(ALL)
    if unknown:
        raise pytest.UsageError(f"--impls: unknown {sorted(unknown)}; choose from {ALL}")
    names = [n for n in ALL if n in wanted]
    if metafunc.definition.get_closest_marker("pytree") is None:
        names = [n for n in names if n != "pytree"]
    if metafunc.definition.get_closest_marker("no_tensordict") is not None:
        names = [n for n in names if n != "tensordict"]
    params = []
    for name in names:
        marks = []
        if name == "tensordict" and TENSORDICT_MISSING:
            marks.append(pytest.mark.skip(reason=TENSORDICT_MISSING))
        params.append(pytest.param(name, id=name, marks=marks))
    metafunc.parametrize("impl_name", params)


def _case_name(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    ids = [] if callspec is None else [p for p in callspec.id.split("-") if p not in ALL]
    name = getattr(item, "originalname", item.name)
    return f"{name}[{'-'.join(ids)}]" if ids else name


@pytest.fixture(autouse=True)
def _torch_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.config.getoption("--torch-threads"))
    yield
    torch.set_num_threads(before)


@pytest.fixture
def impl(impl_name: str, request: pytest.FixtureRequest, benchmark: object) -> Impl:
    """The implementation under test; labels the case's benchmark result with it."""
    case = _case_name(request.node)
    benchmark.extra_info.update(case=case, impl=impl_name)  # type: ignore[attr-defined]
    benchmark.group = case  # type: ignore[attr-defined]
    return IMPLS[impl_name]


@pytest.fixture
def compiler(request: pytest.FixtureRequest) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``torch.compile(fn, fullgraph=True, dynamic=False)`` with the session's backend (see the module doc)."""
    backend = request.config.getoption("--compile-backend")
    once = backend is None and request.config.getoption("benchmark_disable")
    if backend is None:
        backend = "eager" if once else "inductor"

    def compile_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
        # Each case starts from empty caches: modules of one class share their
        # forward's code object, and the cases together would pass dynamo's
        # recompile limit for it (an error under fullgraph=True).
        torch._dynamo.reset()
        return torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)

    return compile_fn
