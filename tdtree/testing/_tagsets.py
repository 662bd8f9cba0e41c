"""The tag sets a node can carry, in a module that does not import hypothesis (the registration reads
them while hypothesis may still be importing)."""

from __future__ import annotations

from .. import Locked, Memmap, Shared, Tag

__all__ = ["TAG_SETS"]

# every tag set a node reaches through the public API (lock, unlock, share_memory, memmap and the rule)
TAG_SETS: tuple[frozenset[Tag], ...] = (
    frozenset(),
    frozenset({Locked}),
    frozenset({Shared, Locked}),
    frozenset({Shared}),
    frozenset({Memmap, Locked}),
    frozenset({Memmap}),
)
