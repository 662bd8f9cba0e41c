"""Record a node's leaves (identity, version, values) to check later that nothing changed them."""

from __future__ import annotations

from typing import Any

import torch

import tdtree as tt


def snapshot(td: Any) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    return [(leaf, leaf._version, leaf.clone()) for leaf in tt.tree.leaves(td)]


def assert_unchanged(td: Any, before: list[tuple[torch.Tensor, int, torch.Tensor]]) -> None:
    after = tt.tree.leaves(td)
    assert len(after) == len(before)
    for leaf, (orig, version, values) in zip(after, before):
        assert leaf is orig
        assert leaf._version == version
        assert torch.equal(leaf, values) or (leaf.is_floating_point() and torch.equal(leaf.isnan(), values.isnan()))
