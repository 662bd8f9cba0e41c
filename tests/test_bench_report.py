"""The bench's report and compare tables, on stats made up here (not on a timed run)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import compare, growth, report


def _stats(median: float, q1: float | None = None, q3: float | None = None) -> dict[str, float]:
    return {
        "median": median,
        "mean": median * 1.1,
        "max": median * 3,
        "q1": median * 0.95 if q1 is None else q1,
        "q3": median * 1.05 if q3 is None else q3,
    }


def _bench(case: str, impl: str, median: float, family: str = "ops") -> dict[str, Any]:
    return {
        "name": f"{case}[{impl}]",
        "fullname": f"bench/test_{family}.py::{case}[{impl}]",
        "extra_info": {"case": case, "impl": impl},
        "stats": _stats(median),
    }


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
        _bench("test_select_nested", "tdtree", 3e-6, "common"),
        _bench("test_select_nested", "tensordict", 10e-6, "common"),
        _bench("test_select_nested", "pytree", 1e-6, "common"),
        _bench("test_rename_nested", "tdtree", 1.5e-6, "common"),
        _bench("test_rename_nested", "pytree", 1e-6, "common"),
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"benchmarks": rows}))
    return path


def test_report_rows_and_summary(results: Path) -> None:
    cases = report.load(results)
    lines = report.table(cases).splitlines()
    assert lines[0] == "| Name | Max | Mean | Ops | Ops tensordict | Ops pytree | Speedup vs tensordict |"
    assert len(lines) == 2 + len(cases)
    fast = next(line for line in lines if line.startswith("| `test_fast`"))
    assert fast.split("|")[4].strip() == "1 MOps/s" and fast.split("|")[7].strip() == "4.00x"
    assert next(line for line in lines if line.startswith("| `test_no_pytree`")).split("|")[6].strip() == "—"
    out = report.summary(cases)
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
    assert capsys.readouterr().out == report.summary(report.load(results)) + "\n"


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
    assert out == report.summary(best) + "\n"
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


def test_report_prints_the_summary_first_and_the_table_on_request(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = report.load(results)
    assert report.main([str(results), "--table"]) == 0
    out = capsys.readouterr().out
    assert out == report.summary(cases) + "\n\n" + report.table(cases) + "\n"
    assert out.index("tdtree is ahead of tensordict") < out.index("| Name |")
    assert report.main([str(results)]) == 0
    assert "| Name |" not in capsys.readouterr().out


def test_help_needs_no_results_and_no_matplotlib(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    code = (
        "import sys\n"
        "from bench import report\n"
        "report.DEFAULT = report.Path(sys.argv[1])\n"
        "try:\n"
        "    report.main(['--help'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "assert 'matplotlib' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "none.json")], cwd=root, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "--plot FILE" in proc.stdout and "--table" in proc.stdout and "usage: python -m bench.report" in proc.stdout


def test_ops_is_one_over_the_median_in_report_and_compare(results: Path) -> None:
    # a row whose mean is far from its median: both tables show 1 / median
    stats = {**_stats(1e-6), "mean": 4e-6}
    row = report.table({"test_a": {"tdtree": stats}}).splitlines()[2]
    assert row.split("|")[4].strip() == report.fmt_ops(1e6) == "1 MOps/s"
    head = compare.table("BASE", [{"test_a": stats}], [{"test_a": stats}]).splitlines()[2]
    assert head.split("|")[4].strip() == "1 MOps/s"
    assert report.ops(stats["median"]) == 1 / stats["median"]


def test_families_are_the_bench_files(results: Path) -> None:
    assert report.families([results]) == {
        "test_fast": "ops",
        "test_slow": "ops",
        "test_no_pytree": "ops",
        "test_select_nested": "common",
        "test_rename_nested": "common",
    }
    rows = report._layout(report.load(results), report.families([results]))
    assert rows == [
        ("ops", None),
        ("ops", "test_fast"),
        ("ops", "test_slow"),
        ("ops", "test_no_pytree"),
        ("common", None),
        ("common", "test_select_nested"),
        ("common", "test_rename_nested"),
    ]


def test_bar_colours_follow_each_cases_goal(results: Path) -> None:
    cases = report.load(results)
    met, missed, grey = report.MET, report.MISSED, report.UNJUDGED
    # fast: held to 2x tensordict (4x: met); its floor panel is not its goal
    assert report._colours("test_fast", cases["test_fast"]) == (met, grey)
    # slow: floor under 2.2x tensordict, held to 1.2x the floor (1.5x: missed)
    assert report._colours("test_slow", cases["test_slow"]) == (grey, missed)
    # select_nested: 10/3x tensordict meets 2x; a key operation at 3x its floor misses 2x
    assert report._colours("test_select_nested", cases["test_select_nested"]) == (met, missed)
    # rename_nested: no tensordict row, 1.5x the floor misses 1.2x
    assert report._colours("test_rename_nested", cases["test_rename_nested"]) == (grey, missed)
    assert report._colours("test_no_pytree", cases["test_no_pytree"]) == (met, grey)


@pytest.mark.parametrize("suffix", ["svg", "png"])
def test_plot_draws_every_case_and_goal(
    results: Path, tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"plot.{suffix}"
    assert report.main([str(results), "--plot", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(report.summary(report.load(results))) and printed.rstrip().endswith(f"plot: {out}")
    data = out.read_bytes()
    if suffix == "png":
        assert data.startswith(b"\x89PNG")
        return
    svg = data.decode()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for text in ("fast", "slow", "no_pytree", "select_nested", "rename_nested", "ops", "common"):
        assert f">{text}<" in svg, text
    assert "goal: 2x tensordict" in svg and "goal: within 1.2x of the floor" in svg
    assert "key operations: within 2x" in svg
    # the same results draw the same file
    again = tmp_path / "again.svg"
    report.main([str(results), "--plot", str(again)])
    assert again.read_text() == svg


# -- size sweeps ---------------------------------------------------------------------------------------

# (family, op, unit) -> impl -> {size: min seconds}: width/clone a fixed cost plus a per-leaf one (the
# slope is not a round number), depth/create exactly linear, with no tensordict row at the deepest size
SWEEP_DATA = {
    ("width", "clone", "leaf"): {
        "tdtree": {1: 2e-6, 10: 3e-6, 100: 1e-5, 1000: 8e-5},
        "tensordict": {1: 5e-6, 10: 1e-5, 100: 6e-5, 1000: 4e-4},
        "pytree": {1: 1e-6, 10: 2e-6, 100: 8e-6, 1000: 6.4e-5},
    },
    ("width", "clone_locked", "leaf"): {"tdtree": {1: 3e-6, 10: 3.3e-6, 100: 1.05e-5, 1000: 8.4e-5}},
    ("depth", "create", "level"): {
        "tdtree": {1: 1e-6, 4: 4e-6, 16: 16e-6, 64: 64e-6},
        "tensordict": {1: 2e-6, 4: 8e-6, 16: 32e-6},
        "pytree": {1: 0.5e-6, 4: 2e-6, 16: 8e-6, 64: 32e-6},
    },
}


def _sweep_rows(data: dict[Any, dict[str, dict[int, float]]]) -> list[dict[str, Any]]:
    rows = []
    for (family, op, unit), impls in data.items():
        for impl, points in impls.items():
            for size, seconds in points.items():
                case = f"test_sweep_{family}[{op}-{size}]"
                rows.append(
                    {
                        "name": f"{case}[{impl}]",
                        "fullname": f"bench/test_sweeps.py::{case}",
                        "extra_info": {
                            "case": case,
                            "impl": impl,
                            "sweep": family,
                            "op": op,
                            "size": size,
                            "unit": unit,
                        },
                        # the median is far from the min: the fits must read the min
                        "stats": {**_stats(seconds * 2), "min": seconds},
                    }
                )
    return rows


def _slope(points: dict[int, float]) -> float:
    import numpy as np

    return float(np.polyfit(np.log(list(points)), np.log(list(points.values())), 1)[0])


def _cells(table: str, family: str, op: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(f"| {family} | {op} |"))
    return [cell.strip() for cell in row.split("|")[1:-1]]


@pytest.fixture
def with_sweeps(results: Path, tmp_path: Path) -> Path:
    path = tmp_path / "with_sweeps.json"
    path.write_text(json.dumps({"benchmarks": json.loads(results.read_text())["benchmarks"] + _sweep_rows(SWEEP_DATA)}))
    return path


def test_sweep_table_fits_exponents_and_costs_per_unit(with_sweeps: Path) -> None:
    sweeps, units = growth.load([with_sweeps])
    assert units == {"width": "leaf", "depth": "level"}
    table = report.sweep_table(sweeps, units)
    width = SWEEP_DATA["width", "clone", "leaf"]
    cells = _cells(table, "width", "clone")
    assert cells[2] == "1–1,000 leaves"
    assert cells[3:6] == [f"{_slope(width[impl]):.2f}" for impl in ("tdtree", "tensordict", "pytree")]
    # per leaf at 1,000: 80 µs, 400 µs and 64 µs over 1,000 leaves; tt/td 80/400, tt/floor 80/64
    assert cells[6:9] == ["80 ns/leaf", "400 ns/leaf", "64 ns/leaf"]
    assert cells[9:] == ["0.20", "1.25", "—"]
    # clone on a locked node over clone untagged: 1.5 at 1 leaf (the most), 1.05 at 1,000
    assert _cells(table, "width", "clone_locked")[11] == "1.50 (at 1); 1.05 at 1,000"
    cells = _cells(table, "depth", "create")
    assert cells[2] == "1–64 levels"
    assert cells[3:6] == ["1.00", "1.00", "1.00"]
    # tensordict's deepest row is 16: its cost per level there, and tt/td at 16 (16 µs / 32 µs)
    assert cells[6:9] == ["1 μs/level", "2 μs/level (at 16)", "500 ns/level"]
    assert cells[9:] == ["0.50 (at 16)", "2.00", "—"]


def test_sweeps_are_their_own_section_after_the_summary(
    results: Path, with_sweeps: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the summary and the table of every case are those of the results without the sweeps
    assert report.load(with_sweeps) == report.load(results)
    assert report.families([with_sweeps]) == report.families([results])
    assert report.main([str(with_sweeps), "--table"]) == 0
    sweeps, units = growth.load([with_sweeps])
    expected = report.report(report.load(results), with_table=True) + "\n\n" + report.sweep_table(sweeps, units)
    assert capsys.readouterr().out == expected + "\n"
    # a file of sweeps alone prints the sweep section alone
    only = with_sweeps.with_name("only.json")
    only.write_text(json.dumps({"benchmarks": _sweep_rows(SWEEP_DATA)}))
    assert report.main([str(only)]) == 0
    assert capsys.readouterr().out == report.sweep_table(sweeps, units) + "\n"


def test_sweeps_over_several_runs_keep_each_points_lowest_min(with_sweeps: Path, tmp_path: Path) -> None:
    # a second run: tdtree's 1,000-leaf clone at 40% of the time (kept), its 10-leaf clone slower (ignored)
    second = tmp_path / "second.json"
    rows = _sweep_rows({("width", "clone", "leaf"): {"tdtree": {1000: 3.2e-5, 10: 9e-6}}})
    second.write_text(json.dumps({"benchmarks": rows}))
    sweeps, units = growth.load([with_sweeps, second])
    points = {**SWEEP_DATA["width", "clone", "leaf"]["tdtree"], 1000: 3.2e-5}
    assert sweeps["width", "clone"]["tdtree"] == points
    cells = _cells(report.sweep_table(sweeps, units), "width", "clone")
    assert cells[3] == f"{_slope(points):.2f}" and cells[6] == "32 ns/leaf" and cells[9:] == ["0.08", "0.50", "—"]


def test_sweep_with_one_size_has_no_exponent() -> None:
    assert math.isnan(growth.exponent({10: 1e-6}))
    assert growth.fit({10: 1e-6, 100: 1e-5}) == growth.Fit(pytest.approx(1.0), 100, pytest.approx(1e-7))


def test_report_without_any_result_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"benchmarks": []}))
    assert report.main([str(empty)]) == 1
    assert "no bench results in" in capsys.readouterr().err


# -- bench.compare when a side fails ---------------------------------------------------------------------


def test_compare_lists_the_cases_one_side_lacks() -> None:
    head = {"test_a": _stats(1e-6), "test_new": _stats(1e-6)}
    base = {"test_a": _stats(1e-6), "test_gone": _stats(1e-6)}
    out = compare.table("BASE", [head], [base])
    assert "of 1 on both sides" in out
    assert "1 cases ran only on the working tree: `test_new`" in out
    assert "1 cases ran only on BASE: `test_gone`" in out
    assert next(line for line in out.splitlines() if line.startswith("| `test_gone`")).split("|")[6].strip() == "—"


def test_compare_problems_name_the_file_and_the_side() -> None:
    output = (
        "....\n"
        "=========================== short test summary info ============================\n"
        "ERROR bench/test_nn.py - ModuleNotFoundError: No module named 'tdtree.nn'\n"
        "FAILED bench/test_ops.py::test_x[tdtree] - AssertionError: assert 1 == 2\n"
        "1 failed, 3 passed, 1 error in 2.00s\n"
    )
    collection = (
        "==================================== ERRORS ====================================\n"
        "_____________________ ERROR collecting bench/test_rl.py ______________________\n"
        "ImportError while importing test module 'bench/test_rl.py'.\n"
        "E   ImportError: cannot import name 'stack' from 'tdtree'\n"
        "=========================== short test summary info ============================\n"
        "ERROR bench/test_rl.py\n"
    )
    found = compare.problems(1, output)
    assert found == [
        "ERROR bench/test_nn.py - ModuleNotFoundError: No module named 'tdtree.nn'",
        "FAILED bench/test_ops.py::test_x[tdtree] - AssertionError: assert 1 == 2",
    ]
    text = compare.diagnosis("a59f752 (the base)", [{}, {}], found)
    assert text.splitlines()[0] == "a59f752 (the base) ran no bench case."
    assert "a59f752 (the base): 2 problems" in text and "No module named 'tdtree.nn'" in text
    assert compare.problems(2, collection) == [
        "ERROR bench/test_rl.py - ImportError: cannot import name 'stack' from 'tdtree'",
        "pytest exited with status 2: ERROR bench/test_rl.py",
    ]
    assert compare.problems(0, "5 passed") == [] and compare.diagnosis("x", [{"test_a": {}}], []) == ""
    assert compare.problems(5, "no tests ran") == ["no bench case was collected (exit 5)"]
    assert compare.problems(4, "ERROR: usage: unknown option --impls") == [
        "pytest exited with status 4: ERROR: usage: unknown option --impls"
    ]


def test_compare_runs_the_files_that_import_when_others_do_not(tmp_path: Path) -> None:
    # a tree whose bench has one file importing a module that does not exist and one that runs
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "conftest.py").write_text(
        "def pytest_addoption(parser):\n    parser.addoption('--impls', default='tdtree')\n"
    )
    (bench / "test_gone.py").write_text("import module_that_is_not_there\n")
    (bench / "test_ok.py").write_text("def test_fine(benchmark):\n    benchmark(int)\n")
    cases, found = compare._run(tmp_path, tmp_path / "out.json", [])
    assert list(cases) == ["test_fine"]
    assert (
        len(found) == 1 and found[0].startswith("ERROR bench/test_gone.py") and "module_that_is_not_there" in found[0]
    )
