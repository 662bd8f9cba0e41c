"""Report a bench run: a summary, tdtree beside tensordict and plain pytrees, optionally a table and a plot.

Usage: ``python -m bench.report [FILE.json ...] [--table] [--plot FILE.svg]`` (default file
``bench/results/latest.json``; ``--help`` for the options)

Given several files, from repeated full runs, each (case, implementation) row is the one with the
lowest median over the files, its max and mean from that same run: a stall that slowed one run
does not make a case look behind. With one file the report is that run's.

The summary comes first: the counts of cases ahead and behind, the geometric-mean speedups, the
goals line and the five cases furthest behind. ``--table`` adds one Markdown row per case (the
implementations of a case grouped by name): tdtree's max and mean time and its operations per
second, the ops of tensordict and pytree, and tdtree's speedup over tensordict (its ops over
tensordict's; above 1 is ahead). ``--plot`` draws each case's speedup over tensordict and its time
over the plain-pytree floor, grouped by family (the bench file), with the goal lines (SVG or PNG,
by the file's suffix; matplotlib, from the bench extra).

The size sweeps (bench/test_sweeps.py) are left out of all three and printed as their own section
after them (:func:`sweep_table`): per family and operation, each implementation's growth exponent
and cost per unit (bench/growth.py, from each row's min time) and tdtree's time over tensordict's and
over the floor's at the largest size both ran; for an operation on a locked node (``*_locked``),
tdtree's time over its time for the same operation untagged, the most over the sizes and at the
largest.

Ops are 1 / the *median* time (:func:`ops`, which bench.compare uses too), not pytest-benchmark's
1 / mean: on a shared machine a few rounds stalled by other processes move the mean by tens of
percent and the median hardly at all.

The goals: every case at least 2x tensordict where the plain-pytree floor is itself at least 2.2x
tensordict, elsewhere within 1.2x of the floor (tdtree's time over the pytree row's; a case with one
of the two rows is held to the goal that row allows); the key operations on nested nodes within 2x
of the floor; no case behind tensordict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from . import growth

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


Cases = dict[str, dict[str, dict[str, Any]]]


def load(path: str | Path) -> Cases:
    """{case: {impl: stats}} from a pytest-benchmark JSON file, in the run's order."""
    data = json.loads(Path(path).read_text())
    cases: Cases = {}
    for bench in data["benchmarks"]:
        if growth.is_sweep(bench):
            continue
        info = bench.get("extra_info", {})
        case = info.get("case", bench["name"])
        cases.setdefault(case, {})[info.get("impl", "tdtree")] = bench["stats"]
    return cases


def load_best(paths: Iterable[str | Path]) -> Cases:
    """{case: {impl: stats}} over several runs: per row the stats with the lowest median, cases in
    the order they first appear."""
    best: Cases = {}
    for path in paths:
        for case, impls in load(path).items():
            row = best.setdefault(case, {})
            for impl, stats in impls.items():
                if impl not in row or stats["median"] < row[impl]["median"]:
                    row[impl] = stats
    return best


def families(paths: Iterable[str | Path]) -> dict[str, str]:
    """{case: family}: the bench file a case comes from, without ``test_`` (``ops`` for bench/test_ops.py)."""
    found: dict[str, str] = {}
    for path in paths:
        for bench in json.loads(Path(path).read_text())["benchmarks"]:
            if growth.is_sweep(bench):
                continue
            case = bench.get("extra_info", {}).get("case", bench["name"])
            module = Path(bench.get("fullname", "").split("::")[0]).stem
            found.setdefault(case, module.removeprefix("test_") or "other")
    return found


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def ops(median: float) -> float:
    """Operations per second of a row whose median time is ``median`` seconds: the one definition of
    ops in the report and in bench.compare."""
    return 1.0 / median


def _ops(stats: dict[str, Any] | None) -> float | None:
    return None if stats is None else ops(stats["median"])


class Goal(NamedTuple):
    """The goal one case is held to: ``against`` is "tensordict" (ops at least ``target`` x
    tensordict's) or "floor" (time at most ``target`` x the pytree row's); ``value`` is the case's
    speedup or time over the floor, ``met`` whether it reaches ``target``."""

    against: str
    target: float
    value: float
    met: bool


def goal(impls: dict[str, dict[str, Any]]) -> Goal | None:
    """The goal a case's rows hold it to (None: no tdtree row, or neither other row)."""
    mine, ops_td, ops_pt = _ops(impls.get("tdtree")), _ops(impls.get("tensordict")), _ops(impls.get("pytree"))
    if mine is None:
        return None
    if ops_pt is not None and (ops_td is None or ops_pt / ops_td < FLOOR_AHEAD):
        return Goal("floor", FLOOR_SLACK, ops_pt / mine, ops_pt / mine <= FLOOR_SLACK)
    if ops_td is not None:
        return Goal("tensordict", GOAL_SPEEDUP, mine / ops_td, mine / ops_td >= GOAL_SPEEDUP)
    return None


def is_key_op(case: str) -> bool:
    return case.split("[")[0] in KEY_OPS


def _goals(cases: Cases) -> tuple[int, int, int, int]:
    """(cases meeting their goal, cases with a goal, key operations within KEY_SLACK of the floor,
    key operations with a floor row)."""
    met = judged = keys_met = keys_judged = 0
    for case, impls in cases.items():
        held = goal(impls)
        if held is not None:
            judged += 1
            met += held.met
        mine, ops_pt = _ops(impls.get("tdtree")), _ops(impls.get("pytree"))
        if mine is not None and ops_pt is not None and is_key_op(case):
            keys_judged += 1
            keys_met += ops_pt / mine <= KEY_SLACK
    return met, judged, keys_met, keys_judged


def _speedups(cases: Cases) -> dict[str, float]:
    """{case: tdtree's ops / tensordict's} for the cases with both rows."""
    found = {}
    for case, impls in cases.items():
        mine, ops_td = _ops(impls.get("tdtree")), _ops(impls.get("tensordict"))
        if mine is not None and ops_td is not None:
            found[case] = mine / ops_td
    return found


def summary(cases: Cases) -> str:
    """The counts, geometric means, goals and the cases furthest behind tensordict."""
    speedups = _speedups(cases)
    vs_pytree: list[float] = []
    floor_vs_td: list[float] = []  # pytree ops / tensordict ops, where a case has both rows
    for impls in cases.values():
        mine, ops_td, ops_pt = _ops(impls.get("tdtree")), _ops(impls.get("tensordict")), _ops(impls.get("pytree"))
        if mine is not None and ops_pt is not None:
            vs_pytree.append(mine / ops_pt)
        if ops_td is not None and ops_pt is not None:
            floor_vs_td.append(ops_pt / ops_td)
    ahead = sum(s > 1 for s in speedups.values())
    behind = sum(s < 1 for s in speedups.values())
    missing = sum("tdtree" not in impls for impls in cases.values())
    met, judged, keys_met, keys_judged = _goals(cases)
    lines = [
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


def table(cases: Cases) -> str:
    """The Markdown table: one row per case."""
    lines = [
        "| Name | Max | Mean | Ops | Ops tensordict | Ops pytree | Speedup vs tensordict |",
        "|---|---|---|---|---|---|---|",
    ]
    speedups = _speedups(cases)
    for case, impls in cases.items():
        mine = impls.get("tdtree")
        speed = f"{speedups[case]:.2f}x" if case in speedups else DASH
        max_t = fmt_time(mine["max"]) if mine else DASH
        mean_t = fmt_time(mine["mean"]) if mine else DASH
        row = [fmt_ops(_ops(mine)), fmt_ops(_ops(impls.get("tensordict"))), fmt_ops(_ops(impls.get("pytree"))), speed]
        lines.append(f"| `{case}` | {max_t} | {mean_t} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def report(cases: Cases, with_table: bool = False) -> str:
    """The summary, then (``with_table``) the table."""
    return summary(cases) + ("\n\n" + table(cases) if with_table else "")


SWEEP_IMPLS = ("tdtree", "tensordict", "pytree")


def _ratio_cell(points: dict[str, dict[int, float]], other: str) -> str:
    found = growth.ratio(points["tdtree"], points[other]) if "tdtree" in points and other in points else None
    if found is None:
        return DASH
    size, value = found
    return f"{value:.2f}" + ("" if size == max(points["tdtree"]) else f" (at {size:,})")


def _per_unit_cell(fit: growth.Fit | None, unit: str, largest: int) -> str:
    if fit is None:
        return DASH
    return f"{fmt_time(fit.per_unit)}/{unit}" + ("" if fit.largest == largest else f" (at {fit.largest:,})")


LOCKED = "_locked"


def _tagged_cell(sweeps: growth.Sweeps, family: str, op: str) -> str:
    """For an operation on a locked node (``X_locked``): tdtree's time over its time for ``X`` on the
    untagged node, the most over the sizes both ran (and where), then at the largest of them."""
    untagged = sweeps.get((family, op.removesuffix(LOCKED)), {}).get("tdtree")
    mine = sweeps[family, op].get("tdtree")
    if not op.endswith(LOCKED) or not untagged or not mine:
        return DASH
    ratios = {size: mine[size] / untagged[size] for size in mine.keys() & untagged.keys()}
    if not ratios:
        return DASH
    worst = max(ratios, key=ratios.__getitem__)
    return f"{ratios[worst]:.2f} (at {worst:,}); {ratios[max(ratios)]:.2f} at {max(ratios):,}"


def sweep_table(sweeps: growth.Sweeps, units: dict[str, str]) -> str:
    """The size sweeps: one Markdown row per family and operation (see the module doc)."""
    lines = [
        "Size sweeps: exponent = least-squares slope of log(min time) against log(size) (1: linear); "
        "per unit = min time at the largest size / that size; tt/td and tt/floor = tdtree's time over "
        "tensordict's and over the plain-pytree floor's at the largest size both ran (below 1: tdtree faster); "
        "locked/untagged (rows of an operation on a locked node) = tdtree's time over its time for the "
        "same operation untagged, the most over the sizes (and where), then at the largest size.",
        "",
        "| Sweep | Op | Sizes | Exponent tdtree | tensordict | floor | Per unit tdtree | tensordict | floor "
        "| tt/td | tt/floor | locked/untagged |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (family, op), points in sweeps.items():
        fits = {impl: growth.fit(points[impl]) for impl in SWEEP_IMPLS if impl in points}
        sizes = sorted({size for impl_points in points.values() for size in impl_points})
        unit = units[family]
        span = f"{sizes[0]:,}–{sizes[-1]:,} " + ("leaves" if unit == "leaf" else f"{unit}s")
        exps = [f"{fits[impl].exponent:.2f}" if impl in fits else DASH for impl in SWEEP_IMPLS]
        per_unit = [_per_unit_cell(fits.get(impl), units[family], sizes[-1]) for impl in SWEEP_IMPLS]
        ratios = [_ratio_cell(points, "tensordict"), _ratio_cell(points, "pytree"), _tagged_cell(sweeps, family, op)]
        lines.append(f"| {family} | {op} | {span} | " + " | ".join([*exps, *per_unit, *ratios]) + " |")
    return "\n".join(lines)


MET, MISSED, UNJUDGED = "#2e7d32", "#c62828", "#9e9e9e"


def _layout(cases: Cases, family_of: dict[str, str]) -> list[tuple[str, str | None]]:
    """The plot's rows, top to bottom: per family (in order of first appearance) a header row
    ``(family, None)``, then ``(family, case)`` for each of its cases."""
    rows: list[tuple[str, str | None]] = []
    for family in dict.fromkeys(family_of.get(case, "other") for case in cases):
        rows.append((family, None))
        rows += [(family, case) for case in cases if family_of.get(case, "other") == family]
    return rows


def _colours(case: str, impls: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(the speedup bar's colour, the floor bar's): green where the case meets the goal that panel
    shows, red where it misses it, grey where the case is held to the other panel's goal."""
    held = goal(impls)
    left = right = UNJUDGED
    if held is not None and held.against == "tensordict":
        left = MET if held.met else MISSED
    if held is not None and held.against == "floor":
        right = MET if held.met else MISSED
    mine, ops_pt = _ops(impls.get("tdtree")), _ops(impls.get("pytree"))
    if is_key_op(case) and mine is not None and ops_pt is not None and right != MISSED:
        right = MET if ops_pt / mine <= KEY_SLACK else MISSED
    return left, right


def plot(cases: Cases, family_of: dict[str, str], path: Path, title: str = "") -> None:
    """Draw each case's speedup over tensordict (left panel) and its time over the plain-pytree floor
    (right panel) to ``path`` (SVG or PNG, by its suffix), the cases grouped by family, log scales,
    each bar drawn from parity (1x) to the case's value, with the goal lines; colours by
    :func:`_colours`."""
    # matplotlib comes with the bench extra and is needed only here: the summary and table work without it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    plt.rcParams["svg.hashsalt"] = "tdtree-bench"  # the same run gives the same SVG
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable
    rows = _layout(cases, family_of)
    fig, (left, right) = plt.subplots(1, 2, sharey=True, figsize=(13, 1.8 + 0.2 * len(rows)), constrained_layout=True)
    for y, (_, case) in enumerate(rows):
        if case is None:
            continue
        impls = cases[case]
        mine, ops_td, ops_pt = _ops(impls.get("tdtree")), _ops(impls.get("tensordict")), _ops(impls.get("pytree"))
        colour_left, colour_right = _colours(case, impls)
        if mine is not None and ops_td is not None:
            left.barh(y, mine / ops_td - 1, left=1, height=0.7, color=colour_left)
        if mine is not None and ops_pt is not None:
            right.barh(y, ops_pt / mine - 1, left=1, height=0.7, color=colour_right)
    ticks = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]
    for ax in (left, right):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.axvline(1, color="black", linewidth=0.8)
        ax.grid(axis="x", which="both", linewidth=0.3, alpha=0.5)
    left.axvline(GOAL_SPEEDUP, color=MET, linestyle="--", label=f"goal: {GOAL_SPEEDUP:g}x tensordict")
    right.axvline(FLOOR_SLACK, color=MET, linestyle="--", label=f"goal: within {FLOOR_SLACK:g}x of the floor")
    right.axvline(KEY_SLACK, color="#ef6c00", linestyle=":", label=f"key operations: within {KEY_SLACK:g}x")
    left.set_title("speedup over tensordict (tdtree ops / tensordict ops; right of 1: ahead)", fontsize=10)
    right.set_title("time over the plain-pytree floor (tdtree time / pytree time; 1: the floor)", fontsize=10)
    left.legend(loc="lower right", fontsize=8)
    right.legend(loc="lower right", fontsize=8)
    left.set_yticks(range(len(rows)))
    left.set_yticklabels([family if case is None else case.removeprefix("test_") for family, case in rows], fontsize=7)
    for label, (_, case) in zip(left.get_yticklabels(), rows):
        if case is None:
            label.set_fontweight("bold")
            label.set_fontsize(9)
    left.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    fig.suptitle(
        f"tdtree bench{': ' + title if title else ''} (ops = 1 / median time; green: goal met, red: missed, "
        "grey: the case is held to the other panel's goal)",
        fontsize=10,
    )
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report", description=(__doc__ or "").split("\n\n")[0].splitlines()[0]
    )
    parser.add_argument(
        "files", nargs="*", type=Path, default=[DEFAULT], help=f"pytest-benchmark JSON files (default: {DEFAULT})"
    )
    parser.add_argument("--table", action="store_true", help="add the table of every case after the summary")
    parser.add_argument(
        "--plot", type=Path, metavar="FILE", help="draw the speedups and floor ratios to FILE (.svg or .png)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for path in args.files:
        if not path.exists():
            print(f"no results at {path}: run `make bench` first", file=sys.stderr)
            return 1
    cases = load_best(args.files)
    sweeps, units = growth.load(args.files)
    if not cases and not sweeps:
        print(f"no bench results in {', '.join(map(str, args.files))}", file=sys.stderr)
        return 1
    sections = [report(cases, with_table=args.table)] if cases else []
    if sweeps:
        sections.append(sweep_table(sweeps, units))
    print("\n\n".join(sections))
    if args.plot is not None:
        plot(cases, families(args.files), args.plot, title=", ".join(path.name for path in args.files))
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
