"""How cost grows with size: the fits of the sweep cases (bench/test_sweeps.py) that bench.report prints.

A sweep row is a pytest-benchmark result whose ``extra_info`` names its ``sweep`` (the family),
``op``, ``size`` and ``unit``. For each (family, op, implementation) the time at a size is the row's
*min* over its rounds (the least disturbed round on a shared machine; over several files, the lowest),
and the fit is

* the growth exponent: the least-squares slope of log(time) against log(size) over the sizes run
  (1: linear; below 1 while a fixed cost still dominates at the small sizes);
* the cost per unit: the time at the largest size run divided by that size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

# (family, op) -> implementation -> size -> min seconds
Sweeps = dict[tuple[str, str], dict[str, dict[int, float]]]


def is_sweep(bench: dict[str, Any]) -> bool:
    """Whether a pytest-benchmark result is a sweep row."""
    return "sweep" in bench.get("extra_info", {})


def load(paths: Iterable[str | Path]) -> tuple[Sweeps, dict[str, str]]:
    """The sweep rows of the files, each point the lowest min over them, and {family: unit}; families
    and operations in the order they first appear."""
    sweeps: Sweeps = {}
    units: dict[str, str] = {}
    for path in paths:
        for bench in json.loads(Path(path).read_text())["benchmarks"]:
            if not is_sweep(bench):
                continue
            info = bench["extra_info"]
            units.setdefault(info["sweep"], info["unit"])
            points = sweeps.setdefault((info["sweep"], info["op"]), {}).setdefault(info.get("impl", "tdtree"), {})
            size, seconds = int(info["size"]), bench["stats"]["min"]
            points[size] = min(seconds, points.get(size, math.inf))
    return sweeps, units


def exponent(points: dict[int, float]) -> float:
    """The least-squares slope of log(time) against log(size); nan with fewer than two sizes."""
    if len(points) < 2:
        return math.nan
    xs = [math.log(size) for size in points]
    ys = [math.log(seconds) for seconds in points.values()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


class Fit(NamedTuple):
    """One implementation's sweep: its growth exponent, its largest size and the time per unit there."""

    exponent: float
    largest: int
    per_unit: float


def fit(points: dict[int, float]) -> Fit:
    largest = max(points)
    return Fit(exponent(points), largest, points[largest] / largest)


def ratio(mine: dict[int, float], other: dict[int, float]) -> tuple[int, float] | None:
    """(the largest size both ran, ``mine``'s time there over ``other``'s); None when they share none."""
    common = mine.keys() & other.keys()
    if not common:
        return None
    size = max(common)
    return size, mine[size] / other[size]
