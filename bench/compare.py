"""Compare tdtree's speed at a git ref with the working tree.

Usage: ``python -m bench.compare BASE_REF [--runs N] [pytest args, e.g. -m quick or -k get]``

BASE_REF is checked out in a temporary ``git worktree`` (removed afterwards)
and the working tree's ``bench/`` is copied into it, so both sides run the
same cases and only the library differs. The suite runs tdtree's rows alone,
alternating base and working tree (A, B, A, B, ...: ``--runs`` each, default
2) so that a drift of the machine's speed hits both sides alike.

The table gives the working tree's max, mean and ops, the ops on BASE_REF,
and the change in ops (positive: faster). Ops are 1 / the median time
(``bench.report.ops``, the one definition; a side's median is the mean of its
runs' medians). A change counts, and is shown in bold with "faster" or
"slower", when both hold:

* it is over 5%, and
* the two sides' interquartile ranges, each the union over its runs of
  [q1, q3] of one run, do not overlap (so the two distributions are apart,
  not just their means).

A side's failures do not stop the comparison: the suite runs with
``--continue-on-collection-errors``, so a bench file that cannot be imported
at BASE_REF (it uses a module the base does not have) loses its own cases
only. The table compares the cases both sides ran; a case one side lacks is
listed with a dash and counted under the table, and each side's failures
(files that did not import, cases that failed) are listed after it, by side.
The exit status is 1 when no case ran on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .report import fmt_ops, fmt_time, geomean, ops

# Keep in step with BENCH_OPTS in the Makefile.
BENCH_ARGS = [
    "--benchmark-max-time=0.25",
    "--benchmark-min-rounds=20",
    "--benchmark-warmup=on",
    "--benchmark-warmup-iterations=100",
    "--benchmark-disable-gc",
    "--benchmark-quiet",
]
THRESHOLD = 0.05


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _collection_reasons(output: str) -> dict[str, str]:
    """{file: the last ``E`` line of its "ERROR collecting" block}: the exception that stopped its import
    (pytest's summary line for a collection error names the file alone)."""
    reasons: dict[str, str] = {}
    current = None
    for line in output.splitlines():
        header = re.fullmatch(r"_+ ERROR collecting (\S+) _+", line)
        if header or line.startswith(("___", "===")):
            current = header.group(1) if header else None
        elif current is not None and line.startswith("E   "):
            reasons[current] = line[1:].strip()
    return reasons


def problems(returncode: int, output: str) -> list[str]:
    """What went wrong in one pytest run, from its exit status and output (``-rfE``'s summary lines:
    a bench file that failed to import, a case that failed or errored)."""
    reasons = _collection_reasons(output)
    found = []
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            path = line.split()[1]
            found.append(f"{line} - {reasons[path]}" if " - " not in line and path in reasons else line)
    if returncode == 5:
        found.append("no bench case was collected (exit 5)")
    elif returncode not in (0, 1) or (returncode == 1 and not found):
        last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
        found.append(f"pytest exited with status {returncode}: {last}")
    return found


def _run(tree: Path, out: Path, extra: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({case: stats} of tdtree on the library in ``tree``, what went wrong in the run)."""
    # the installed tdtree's plugins (tdtree.testing's pytest fixtures and hypothesis strategies) may
    # not exist at the base ref, and the bench uses none of them
    # the run is a pytest of its own, never a pytest-xdist worker (pytest-benchmark disables itself in one)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env |= {"PYTHONPATH": str(tree), "HYPOTHESIS_NO_PLUGINS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "bench", "--impls=tdtree", *BENCH_ARGS]
    cmd += [f"--benchmark-json={out}", "-p", "no:cacheprovider", "-p", "no:tdtree"]
    cmd += ["--continue-on-collection-errors", "-rfE", *extra]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    data = json.loads(out.read_text()) if out.exists() else {"benchmarks": []}
    cases = {b["extra_info"].get("case", b["name"]): b["stats"] for b in data["benchmarks"]}
    return cases, problems(proc.returncode, proc.stdout + proc.stderr)


def diagnosis(side: str, runs: list[dict[str, dict[str, Any]]], found: list[str]) -> str:
    """What went wrong on one side (``side`` names it), or "" when nothing did."""
    lines = [] if any(runs) else [f"{side} ran no bench case."]
    if found:
        lines.append(f"{side}: {len(found)} problems (pytest's summary lines):")
        lines += [f"  {line}" for line in found]
    return "\n".join(lines)


def _only(cases: list[str], side: str) -> str:
    names = ", ".join(f"`{case}`" for case in cases[:10]) + (", ..." if len(cases) > 10 else "")
    return f"{len(cases)} cases ran only on {side}: {names}" if cases else ""


def _side(runs: list[dict[str, dict[str, Any]]], case: str) -> dict[str, float] | None:
    stats = [run[case] for run in runs if case in run]
    if not stats:
        return None
    median = sum(s["median"] for s in stats) / len(stats)
    return {
        "mean": sum(s["mean"] for s in stats) / len(stats),
        "max": max(s["max"] for s in stats),
        "ops": ops(median),
        "lo": min(s["q1"] for s in stats),
        "hi": max(s["q3"] for s in stats),
    }


def significant(head: dict[str, float], base: dict[str, float]) -> bool:
    """The rule in the module docstring: over 5% and interquartile ranges apart."""
    change = head["ops"] / base["ops"] - 1
    apart = head["hi"] < base["lo"] or base["hi"] < head["lo"]
    return abs(change) > THRESHOLD and apart


def table(base_ref: str, heads: list[dict[str, dict[str, Any]]], bases: list[dict[str, dict[str, Any]]]) -> str:
    lines = [
        f"| Name | Max | Mean | Ops | Ops on {base_ref} | Change |",
        "|---|---|---|---|---|---|",
    ]
    cases = list(dict.fromkeys(case for run in (*heads, *bases) for case in run))
    head_only = [case for case in cases if not any(case in run for run in bases)]
    base_only = [case for case in cases if not any(case in run for run in heads)]
    ratios: list[float] = []
    faster = slower = 0
    for case in cases:
        head, base = _side(heads, case), _side(bases, case)
        if head is None or base is None:
            row = [fmt_time(head["max"]) if head else "—", fmt_time(head["mean"]) if head else "—"]
            row += [fmt_ops(head["ops"] if head else None), fmt_ops(base["ops"] if base else None), "—"]
        else:
            ratio = head["ops"] / base["ops"]
            ratios.append(ratio)
            change = f"{(ratio - 1) * 100:+.1f}%"
            if significant(head, base):
                faster += ratio > 1
                slower += ratio < 1
                change = f"**{change}** {'faster' if ratio > 1 else 'slower'}"
            row = [fmt_time(head["max"]), fmt_time(head["mean"]), fmt_ops(head["ops"]), fmt_ops(base["ops"]), change]
        lines.append(f"| `{case}` | " + " | ".join(row) + " |")
    lines += [
        "",
        f"{faster} cases faster and {slower} slower beyond the noise (over {THRESHOLD:.0%} and "
        f"interquartile ranges apart), {len(ratios) - faster - slower} unchanged, of {len(ratios)} on both sides.",
        f"Geometric-mean ratio of ops, working tree / {base_ref}: {geomean(ratios):.3f}"
        + ("" if ratios else " (no case ran on both sides)"),
    ]
    lines += [line for line in (_only(head_only, "the working tree"), _only(base_only, base_ref)) if line]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("base_ref", help="the git ref to compare the working tree with")
    parser.add_argument("--runs", type=int, default=2, help="runs of each side, alternating (default 2)")
    args, extra = parser.parse_known_args(argv)
    root = Path(_git("rev-parse", "--show-toplevel", cwd=Path.cwd()))
    commit = _git("rev-parse", "--verify", f"{args.base_ref}^{{commit}}", cwd=root)
    tmp = Path(tempfile.mkdtemp(prefix="tdtree-bench-"))
    base_tree = tmp / "base"
    _git("worktree", "add", "--detach", str(base_tree), commit, cwd=root)
    try:
        shutil.rmtree(base_tree / "bench", ignore_errors=True)
        shutil.copytree(root / "bench", base_tree / "bench", ignore=shutil.ignore_patterns("results", "__pycache__"))
        heads: list[dict[str, dict[str, Any]]] = []
        bases: list[dict[str, dict[str, Any]]] = []
        found: dict[str, dict[str, None]] = {"base": {}, "head": {}}  # each side's problems, once each
        for i in range(args.runs):
            for side, tree, runs in (("base", base_tree, bases), ("head", root, heads)):
                print(
                    f"run {i + 1}/{args.runs}: {args.base_ref if side == 'base' else 'working tree'} ...",
                    file=sys.stderr,
                )
                cases, side_problems = _run(tree, tmp / f"{side}-{i}.json", extra)
                runs.append(cases)
                found[side].update(dict.fromkeys(side_problems))
    finally:
        _git("worktree", "remove", "--force", str(base_tree), cwd=root)
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(args.base_ref, heads, bases))
    for side, runs, label in (("base", bases, f"{args.base_ref} (the base)"), ("head", heads, "the working tree")):
        text = diagnosis(label, runs, list(found[side]))
        if text:
            print("\n" + text)
    both = {case for run in heads for case in run} & {case for run in bases for case in run}
    return 0 if both else 1


if __name__ == "__main__":
    raise SystemExit(main())
