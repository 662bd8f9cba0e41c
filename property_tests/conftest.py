"""Hypothesis profiles: derandomized when CI is set, larger and random locally."""

import os
import sys

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


def pytest_terminal_summary(terminalreporter) -> None:
    """The matrix's size and the cells it leaves out, with their reasons (when it ran)."""
    matrix = next((m for name, m in sys.modules.items() if name.endswith("test_matrix")), None)
    if matrix is not None and hasattr(matrix, "summary"):
        matrix.summary(terminalreporter.write_line)
