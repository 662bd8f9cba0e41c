"""Keep ``bench/distributed.py`` working: the cross-process bench is a script (see its docstring),
so ``make test`` runs it here once, with a few rounds and a 1 MB "large" node, and checks that every
implementation's round trips brought the data back and that the table has a row for each."""

from __future__ import annotations

from .distributed import IMPLS, measure, table


def test_distributed_round_trips_run_and_report() -> None:
    medians, intact = measure(rounds=3, large_mb=1, warmup=1)
    cases = [(case, name) for case in ("small", "large") for name in IMPLS]
    assert sorted(intact) == sorted(cases)
    assert all(intact.values()), [key for key, ok in intact.items() if not ok]
    assert all(medians[key] > 0 for key in cases)
    text = table(medians, large_mb=1)
    for name in IMPLS:
        assert text.count(f"| {name} |") == 2
