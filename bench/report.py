"""Print a bench run as a Markdown table, tdtree beside tensordict and plain pytrees.

Usage: ``python -m bench.report [FILE.json ...]`` (default ``bench/results/latest.json``)

Given several files, from repeated full runs, each (case, implementation) row is the one with the
lowest median over the files, its max and mean from that same run: a stall that slowed one run
does not make a case look behind. With one file the table is that run's.

One row per case (the implementations of a case grouped by name): tdtree's
max and mean time and its operations per second, the ops of tensordict and
pytree, and tdtree's speedup over tensordict (its ops over tensordict's; above
1 is ahead). Ops are 1 / the *median* time, not pytest-benchmark's 1 / mean:
on a shared machine a few rounds stalled by other processes move the mean by
tens of percent and the median hardly at all. Below the table: the counts of cases ahead and behind, the
geometric-mean speedups, the goals line and the five cases furthest behind.

The goals (issue 20): every case at least 2x tensordict where the plain-pytree floor is itself at
least 2.2x tensordict, elsewhere within 1.2x of the floor (tdtree's time over the pytree row's; a
case with one of the two rows is held to the goal that row allows); the key operations on nested
nodes within 2x of the floor; no case behind tensordict.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).parent / "results" / "latest.json"
DASH = "—"
# The suite's goals: ops at least GOAL_SPEEDUP x tensordict's where the floor is at least
# FLOOR_AHEAD x tensordict's, else time at most FLOOR_SLACK x the pytree row's; key operations
# (KEY_OPS) at most KEY_SLACK x the pytree row's.
GOAL_SPEEDUP = 2.0
FLOOR_AHEAD = 2.2
FLOOR_SLACK = 1.2
KEY_SLACK = 2.0
KEY_OPS = frozenset(
    {
        "test_plain_set_nested",
        "test_set",
        "test_set_nested",
        "test_set_nested_new",
        "test_select",
        "test_select_nested",
        "test_exclude_nested",
        "test_update",
        "test_update_nested",
        "test_flatten_speed",
        "test_unflatten_speed",
        "test_rename_nested",
    }
)


def fmt_time(seconds: float) -> str:
    """``seconds`` in the unit that keeps 1 to 3 digits before the point."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("μs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def fmt_ops(ops: float | None) -> str:
    if ops is None:
        return DASH
    for unit, scale in (("MOps/s", 1e6), ("KOps/s", 1e3)):
        if ops >= scale:
            return f"{ops / scale:.4g} {unit}"
    return f"{ops:.4g} Ops/s"


def load(path: str | Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{case: {impl: stats}} from a pytest-benchmark JSON file, in the run's order."""
    data = json.loads(Path(path).read_text())
    cases: dict[str, dict[str, dict[str, Any]]] = {}
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        case = info.get("case", bench["name"])
        cases.setdefault(case, {})[info.get("impl", "tdtree")] = bench["stats"]
    return cases


def load_best(paths: Iterable[str | Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """{case: {impl: stats}} over several runs: per row the stats with the lowest median, cases in
    the order they first appear."""
    best: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        for case, impls in load(path).items():
            row = best.setdefault(case, {})
            for impl, stats in impls.items():
                if impl not in row or stats["median"] < row[impl]["median"]:
                    row[impl] = stats
    return best


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _ops(stats: dict[str, Any] | None) -> float | None:
    return None if stats is None else 1.0 / stats["median"]


def _goals(cases: dict[str, dict[str, dict[str, Any]]]) -> tuple[int, int, int, int]:
    """(cases meeting their goal, cases with a goal, key operations within KEY_SLACK of the floor,
    key operations with a floor row)."""
    met = judged = keys_met = keys_judged = 0
    for case, impls in cases.items():
        ops, ops_td, ops_pt = _ops(impls.get("tdtree")), _ops(impls.get("tensordict")), _ops(impls.get("pytree"))
        if ops is None:
            continue
        if ops_pt is not None and (ops_td is None or ops_pt / ops_td < FLOOR_AHEAD):
            judged += 1
            met += ops_pt / ops <= FLOOR_SLACK
        elif ops_td is not None:
            judged += 1
            met += ops / ops_td >= GOAL_SPEEDUP
        if ops_pt is not None and case.split("[")[0] in KEY_OPS:
            keys_judged += 1
            keys_met += ops_pt / ops <= KEY_SLACK
    return met, judged, keys_met, keys_judged


def table(cases: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The Markdown table and its summary."""
    lines = [
        "| Name | Max | Mean | Ops | Ops tensordict | Ops pytree | Speedup vs tensordict |",
        "|---|---|---|---|---|---|---|",
    ]
    speedups: dict[str, float] = {}
    vs_pytree: list[float] = []
    floor_vs_td: list[float] = []  # pytree ops / tensordict ops, where a case has both rows
    for case, impls in cases.items():
        mine = impls.get("tdtree")
        ops, ops_td, ops_pt = _ops(mine), _ops(impls.get("tensordict")), _ops(impls.get("pytree"))
        speed = DASH
        if ops is not None and ops_td is not None:
            speedups[case] = ops / ops_td
            speed = f"{speedups[case]:.2f}x"
        if ops is not None and ops_pt is not None:
            vs_pytree.append(ops / ops_pt)
        if ops_td is not None and ops_pt is not None:
            floor_vs_td.append(ops_pt / ops_td)
        max_t = fmt_time(mine["max"]) if mine else DASH
        mean_t = fmt_time(mine["mean"]) if mine else DASH
        lines.append(
            f"| `{case}` | {max_t} | {mean_t} | {fmt_ops(ops)} | {fmt_ops(ops_td)} | {fmt_ops(ops_pt)} | {speed} |"
        )
    ahead = sum(s > 1 for s in speedups.values())
    behind = sum(s < 1 for s in speedups.values())
    missing = sum("tdtree" not in impls for impls in cases.values())
    met, judged, keys_met, keys_judged = _goals(cases)
    lines += [
        "",
        f"tdtree is ahead of tensordict in {ahead} cases and behind in {behind} "
        f"(of {len(speedups)} run on both; {missing} cases have no tdtree result yet).",
        "Ops: 1 / median time. "
        f"Geometric-mean speedup vs tensordict: {geomean(list(speedups.values())):.2f}x"
        + (f"; vs plain pytrees: {geomean(vs_pytree):.2f}x over {len(vs_pytree)} cases." if vs_pytree else "."),
        f"Goals: {met} of {judged} cases meet theirs ({GOAL_SPEEDUP:g}x tensordict where the floor is "
        f"{FLOOR_AHEAD:g}x tensordict or more, else within {FLOOR_SLACK:g}x of the floor); {keys_met} of "
        f"{keys_judged} key operations within {KEY_SLACK:g}x of the floor; {behind} cases behind tensordict. "
        f"In {sum(r < FLOOR_AHEAD for r in floor_vs_td)} of the {len(floor_vs_td)} cases with both rows, "
        f"the pytree floor itself is under {FLOOR_AHEAD:g}x tensordict.",
    ]
    worst = sorted((kv for kv in speedups.items() if kv[1] < 1), key=lambda kv: kv[1])[:5]
    if worst:
        lines += ["", "Furthest behind tensordict (lowest speedup):", ""]
        lines += [f"1. `{case}`: {s:.2f}x" for case, s in worst]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(arg) for arg in args] or [DEFAULT]
    for path in paths:
        if not path.exists():
            print(f"no results at {path}: run `make bench` first", file=sys.stderr)
            return 1
    print(table(load_best(paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
