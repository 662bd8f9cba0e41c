"""Shared memory: ``share_memory()`` copies a node's leaves into shared memory.

The copy is made once, leaf by leaf, like ``clone()``: the input is not
changed, and leaves that were views of one storage become separate storages
(a small view of a large tensor costs only its own bytes). The result is tagged
``{Shared, Locked}`` on every sub-node: its storages are what other processes
see, so writes to it must go in place (``update_``, ``copy_``, ``at[...].set_``).
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import Node
from ._maps import map_leaves
from ._tags import Locked, Shared, retag

__all__ = ["share_memory"]

_SHARED_LOCKED = frozenset({Shared, Locked})


def _shared_copy(leaf: torch.Tensor) -> torch.Tensor:
    # A CPU clone is moved into shared memory; a CUDA clone is already
    # shareable (share_memory_ is a no-op there and is_shared() is True).
    return leaf.clone().share_memory_()


def share_memory(node: Node) -> Any:
    """A copy of ``node`` whose leaves live in shared memory, tagged ``{Shared, Locked}``.

    The tags are set, not decided by the rule: every leaf is new storage, and
    the copy makes the ``Shared`` claim true whatever the input's tags were (a
    ``Memmap`` input gives ``{Shared, Locked}``). Passing the result to
    ``torch.multiprocessing`` workers hands them the same storages, so their
    in-place writes are seen here.

    Args:
        node: the node (``self`` as a method); it is not changed.

    Returns:
        A new node of copies of the leaves in shared memory, tagged ``{Shared, Locked}`` on every
        sub-node (set, not kept: only ``update_``, ``copy_``, ``at[...].set_`` write into it).

    Example:
        >>> import torch, tdtree as tt
        >>> td = tt.TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]).share_memory()
        >>> td["x"].is_shared(), sorted(t.name for t in td.tags)
        (True, ['Locked', 'Shared'])
    """
    return retag(map_leaves(_shared_copy, node), _SHARED_LOCKED)
