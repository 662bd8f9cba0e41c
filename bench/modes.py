"""Eager and compiled runs of one bench case: the ``mode`` values and the timed call they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .impls import Impl

MODES = ["eager", "compile"]


def run_mode(benchmark: Any, impl: Impl, mode: str, compiler: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Time ``fn(*args)``, compiled when ``mode`` says so, after two warm calls.

    The tdtree and pytree rows assert that nothing recompiled while timed;
    tensordict's rows are timed as they come.
    """
    if mode == "compile":
        fn = compiler(fn)
    fn(*args)
    fn(*args)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    out = benchmark(fn, *args)
    if impl.name != "tensordict":
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, "recompiled while timed"
    return out
