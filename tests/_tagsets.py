"""The tag sets a node and its sub-nodes carry, for the tag tests."""

from __future__ import annotations

import tdtree as tt


def tag_sets(td: tt.TensorDict) -> set[frozenset]:
    """The distinct tag sets of ``td`` and every sub-node (one set when all agree)."""
    found = {td.tags}
    for _, v in td.items(include_nested=True):
        if isinstance(v, tt.TensorDict):
            found.add(v.tags)
    return found
