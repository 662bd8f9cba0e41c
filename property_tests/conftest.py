"""Hypothesis profiles: derandomized when CI is set, larger and random locally."""

import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=150,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _matrix_summary() -> list[str]:
    """The matrix's size and the cells it leaves out, with their reasons (when this process collected it)."""
    matrix = next((m for name, m in sys.modules.items() if name.endswith("test_matrix")), None)
    lines: list[str] = []
    if matrix is not None and hasattr(matrix, "summary"):
        matrix.summary(lines.append)
    return lines


# Under pytest-xdist the workers collect the matrix and the controller prints the summary: a worker
# hands its lines over in workeroutput, which the controller reads when the worker goes down.
_FROM_WORKERS: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["tdtree_matrix_summary"] = _matrix_summary()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    if not _FROM_WORKERS:
        _FROM_WORKERS.extend(getattr(node, "workeroutput", {}).get("tdtree_matrix_summary", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _matrix_summary() or _FROM_WORKERS:
        terminalreporter.write_line(line)
