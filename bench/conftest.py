"""Parametrize every bench case over the implementations and label its results.

A case takes the ``impl`` fixture and is run for ``tdtree`` and ``tensordict``;
cases marked ``pytree`` also run on plain dicts with optree. ``--impls`` narrows
the set (``bench.compare`` runs tdtree alone). Each result carries
``extra_info = {"case": ..., "impl": ...}`` and the case as its group, so the
report and the terminal table put the implementations of one case together.
"""

from __future__ import annotations

import pytest

from .impls import IMPLS, TENSORDICT_MISSING, Impl

ALL = ("tdtree", "tensordict", "pytree")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impls",
        default=",".join(ALL),
        help="comma-separated implementations to run the bench cases on (default: all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pytree: the case also runs on plain dicts with optree")
    config.addinivalue_line("markers", "quick: part of the representative subset run by make bench-quick")


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


@pytest.fixture
def impl(impl_name: str, request: pytest.FixtureRequest, benchmark: object) -> Impl:
    """The implementation under test; labels the case's benchmark result with it."""
    case = _case_name(request.node)
    benchmark.extra_info.update(case=case, impl=impl_name)  # type: ignore[attr-defined]
    benchmark.group = case  # type: ignore[attr-defined]
    return IMPLS[impl_name]
