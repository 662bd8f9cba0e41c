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
"""

from __future__ import annotations

import argparse
import json
import os
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


def _run(tree: Path, out: Path, extra: list[str]) -> dict[str, dict[str, Any]]:
    """{case: stats} of tdtree on the library in ``tree``."""
    # the installed tdtree's plugins (tdtree.testing's pytest fixtures and hypothesis strategies) may
    # not exist at the base ref, and the bench uses none of them
    env = {**os.environ, "PYTHONPATH": str(tree), "HYPOTHESIS_NO_PLUGINS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "bench", "--impls=tdtree", *BENCH_ARGS]
    cmd += [f"--benchmark-json={out}", "-p", "no:cacheprovider", "-p", "no:tdtree", *extra]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 5):  # 5: nothing collected (a -k that matches no case)
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"the bench suite failed in {tree} (exit {proc.returncode})")
    data = json.loads(out.read_text()) if out.exists() else {"benchmarks": []}
    return {b["extra_info"].get("case", b["name"]): b["stats"] for b in data["benchmarks"]}


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
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}: {args.base_ref} ...", file=sys.stderr)
            bases.append(_run(base_tree, tmp / f"base-{i}.json", extra))
            print(f"run {i + 1}/{args.runs}: working tree ...", file=sys.stderr)
            heads.append(_run(root, tmp / f"head-{i}.json", extra))
    finally:
        _git("worktree", "remove", "--force", str(base_tree), cwd=root)
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(args.base_ref, heads, bases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
