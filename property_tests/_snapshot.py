"""Helpers the laws share: record leaves before a step and check nothing changed them (where the step is
more than one call: for one call, tdtree.testing.laws.assert_pure), tag checks."""

from __future__ import annotations

from typing import Any

import torch

import tdtree as tt
from tdtree._tags import storage_key
from tdtree.testing import assert_equal


def snapshot(td: Any) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    """Each leaf with its ``_version`` and a copy of its values."""
    return [(leaf, leaf._version, leaf.clone()) for leaf in tt.tree.leaves(td)]


def assert_unchanged(td: Any, before: list[tuple[torch.Tensor, int, torch.Tensor]]) -> None:
    """The same leaf objects, versions and values as when ``before`` was taken."""
    after = tt.tree.leaves(td)
    assert len(after) == len(before)
    for leaf, (orig, version, values) in zip(after, before):
        assert leaf is orig
        assert leaf._version == version
        assert_equal(leaf, values)


def holds_data(out: Any) -> bool:
    return any(storage_key(x) is not None for x in tt.tree.leaves(out))


def assert_drops_tags(out: Any) -> None:
    """The rule for results built on new storage: Locked goes, unless no leaf holds data."""
    assert out.tags == (frozenset() if holds_data(out) else frozenset({tt.Locked}))


def assert_shares_storage(out: Any, td: Any) -> None:
    for x, y in zip(tt.tree.leaves(out), tt.tree.leaves(td), strict=True):
        assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
