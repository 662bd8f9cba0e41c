"""Keep ``bench/tagcost.py`` working and honest: ``make test`` runs it once, with one round of one
call, and checks that each case's floor gives the result the tag rule gives (the same keys, and the
same tags on every node), so a floor never leaves out work the rule must do for that result."""

from __future__ import annotations

import tempfile

import tdtree as tt

from .tagcost import cases, floor, measure, table


def _tags_by_path(node: tt.TensorDict) -> dict[tuple[str, ...], frozenset]:
    found = {(): node.tags}
    for key in node.keys(include_nested=True):
        path = key if isinstance(key, tuple) else (key,)
        value = node[path]
        if isinstance(value, tt.TensorDict):
            found[path] = value.tags
    return found


def test_each_floor_gives_what_the_rule_gives() -> None:
    with tempfile.TemporaryDirectory() as prefix:
        every = cases(prefix)
        kinds = {case[4] for case in every}
        assert kinds == {"own", "new", "view"}
        for case in every:
            name, _, tagged, op, kind = case
            least, ruled = floor(case), op(tagged)
            assert list(least.keys(include_nested=True)) == list(ruled.keys(include_nested=True)), name
            if kind == "own":  # one tagged root; its sub-nodes are the input's, as in the rule's result
                assert least.tags == ruled.tags == tagged.tags, name
            else:
                assert _tags_by_path(least) == _tags_by_path(ruled), name
                assert ruled.tags == (tagged.tags if kind == "view" else frozenset()), name


def test_the_table_has_a_row_per_case() -> None:
    results = measure(rounds=1, number=1)
    with tempfile.TemporaryDirectory() as prefix:
        names = [case[0] for case in cases(prefix)]
    assert list(results) == names
    assert all(min(times) > 0 for times in results.values())
    text = table(results)
    assert all(f"| {name} |" in text for name in names)
