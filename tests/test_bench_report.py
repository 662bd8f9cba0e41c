"""The bench's report and compare tables, on stats made up here (not on a timed run)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import compare, report


def _stats(median: float, q1: float | None = None, q3: float | None = None) -> dict[str, float]:
    return {
        "median": median,
        "mean": median * 1.1,
        "max": median * 3,
        "q1": median * 0.95 if q1 is None else q1,
        "q3": median * 1.05 if q3 is None else q3,
    }


def _bench(case: str, impl: str, median: float) -> dict[str, Any]:
    return {"name": f"{case}[{impl}]", "extra_info": {"case": case, "impl": impl}, "stats": _stats(median)}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    # fast: 4x tensordict, 1.2x the pytree's time; slow: 0.5x tensordict, pytree 1.5x tensordict;
    # no_pytree: 2x tensordict exactly, no pytree row; select_nested (a key operation): 10/3x tensordict,
    # 3x the pytree's time; rename_nested (a key operation): 1.5x the pytree's time, no tensordict row
    rows = [
        _bench("test_fast", "tdtree", 1e-6),
        _bench("test_fast", "tensordict", 4e-6),
        _bench("test_fast", "pytree", 1e-6 / 1.2),
        _bench("test_slow", "tdtree", 2e-6),
        _bench("test_slow", "tensordict", 1e-6),
        _bench("test_slow", "pytree", 1e-6 / 1.5),
        _bench("test_no_pytree", "tdtree", 1e-6),
        _bench("test_no_pytree", "tensordict", 2e-6),
        _bench("test_select_nested", "tdtree", 3e-6),
        _bench("test_select_nested", "tensordict", 10e-6),
        _bench("test_select_nested", "pytree", 1e-6),
        _bench("test_rename_nested", "tdtree", 1.5e-6),
        _bench("test_rename_nested", "pytree", 1e-6),
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"benchmarks": rows}))
    return path


def test_report_rows_and_summary(results: Path) -> None:
    out = report.table(report.load(results))
    lines = out.splitlines()
    assert lines[0] == "| Name | Max | Mean | Ops | Ops tensordict | Ops pytree | Speedup vs tensordict |"
    fast = next(line for line in lines if line.startswith("| `test_fast`"))
    assert fast.split("|")[4].strip() == "1 MOps/s" and fast.split("|")[7].strip() == "4.00x"
    assert next(line for line in lines if line.startswith("| `test_no_pytree`")).split("|")[6].strip() == "—"
    assert "ahead of tensordict in 3 cases and behind in 1 (of 4 run on both" in out
    assert f"{math.exp((math.log(4) + math.log(0.5) + math.log(2) + math.log(10 / 3)) / 4):.2f}x" in out
    # fast (floor 4.8x tensordict) and select_nested (floor 10x) are held to 2x tensordict, slow (floor
    # 1.5x) and rename_nested (no tensordict row) to 1.2x the floor, no_pytree to 2x tensordict
    assert "Goals: 3 of 5 cases meet theirs" in out
    assert "1 of 2 key operations within 2x of the floor; 1 cases behind tensordict." in out
    assert "In 1 of the 3 cases with both rows, the pytree floor itself is under 2.2x tensordict." in out
    assert out.rstrip().endswith("1. `test_slow`: 0.50x")


def test_report_main_without_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err


def test_report_of_one_file_is_that_run(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(results)]) == 0
    assert capsys.readouterr().out == report.table(report.load(results)) + "\n"


def test_report_of_several_runs_keeps_each_rows_lowest_median(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a second run: test_slow's tdtree row no longer stalled (4x faster), test_fast's tensordict row
    # faster (the row the goals compare with), test_select_nested's tdtree row slower (kept from run 1),
    # and a case the first run lacks
    second = [
        _bench("test_slow", "tdtree", 0.5e-6),
        _bench("test_fast", "tensordict", 3e-6),
        _bench("test_select_nested", "tdtree", 6e-6),
        _bench("test_new", "tdtree", 1e-6),
    ]
    other = tmp_path / "run2.json"
    other.write_text(json.dumps({"benchmarks": second}))
    best = report.load_best([results, other])
    assert list(best) == [*report.load(results), "test_new"]
    assert best["test_slow"]["tdtree"] == _stats(0.5e-6) and best["test_slow"]["pytree"] == _stats(1e-6 / 1.5)
    assert best["test_fast"]["tensordict"] == _stats(3e-6)
    assert best["test_select_nested"]["tdtree"] == _stats(3e-6)
    assert report.main([str(results), str(other)]) == 0
    out = capsys.readouterr().out
    assert out == report.table(best) + "\n"
    # test_slow is now 2x tensordict, no longer behind; held to 1.2x its floor (under 2.2x tensordict),
    # it now beats the floor. test_fast still meets 2x tensordict, rename_nested still misses its goal.
    assert "ahead of tensordict in 4 cases and behind in 0 (of 4 run on both; 0 cases" in out
    assert "Goals: 4 of 5 cases meet theirs" in out


def _side(median: float, spread: float) -> dict[str, dict[str, float]]:
    return {"test_a": _stats(median, median * (1 - spread), median * (1 + spread))}


@pytest.mark.parametrize(
    ("head", "base", "mark"),
    [
        (_side(1e-6, 0.01), _side(2e-6, 0.01), "**+100.0%** faster"),
        (_side(2e-6, 0.01), _side(1e-6, 0.01), "**-50.0%** slower"),
        (_side(1e-6, 0.4), _side(2e-6, 0.4), "+100.0%"),  # interquartile ranges overlap: noise
        (_side(1e-6, 0.001), _side(1.04e-6, 0.001), "+4.0%"),  # apart, but under 5%
    ],
)
def test_compare_marks_only_changes_beyond_the_noise(head: Any, base: Any, mark: str) -> None:
    out = compare.table("BASE", [head], [base])
    row = next(line for line in out.splitlines() if line.startswith("| `test_a`"))
    assert row.split("|")[6].strip() == mark
    beyond = "**" in mark
    assert f"{int(beyond and 'faster' in mark)} cases faster and {int(beyond and 'slower' in mark)} slower" in out
