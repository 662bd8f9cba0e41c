"""The tree of a node in the nested form that memmap directories (format version 1) and save files
(format version 2) held before the flat one, built here from the node's items, for the tests that
files of those versions still load."""

from __future__ import annotations

from typing import Any

from tdtree import TensorDict


def nested_tree(node: TensorDict, leaves: list[int] | None = None) -> dict[str, Any]:
    """``node``'s nested tree (leaf indices counted in ``leaves``, depth first in canonical order)."""
    leaves = [] if leaves is None else leaves
    entries: list[list[Any]] = []
    for key, value in node.items():
        if isinstance(value, TensorDict):
            entries.append([key, nested_tree(value, leaves)])
        else:
            entries.append([key, {"leaf": len(leaves), "dtype": str(value.dtype)[6:], "shape": list(value.shape)}])
            leaves.append(0)
    device = None if node.device is None else str(node.device)
    return {"batch_size": list(node.batch_size), "device": device, "entries": entries}
