"""The tags: claims a node makes about all of its leaves, and their names.

The lowest floor with the errors and keys: pytree registration reads tags from
their names (``torch.export`` contexts, pickles), the rule in :mod:`tdtree._tags`
compares them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

__all__ = ["Tag", "Locked", "Shared", "Memmap", "tag_named"]


class Tag(enum.Enum):
    """A claim a node makes about all of its leaves; compared by identity, sorted by name.

    An enum, because dynamo treats enum members as constants: a compiled
    function that locks, unlocks or rebuilds a tagged node traces as eager runs.
    Pickled by name (a pickle does not depend on the claims' wording).
    """

    Locked = "writes go in place only; the functional editors refuse"
    Shared = "every leaf with data lives in shared memory"
    Memmap = "every leaf with data is backed by a memory-mapped file"

    @property
    def claim(self) -> str:
        """What a node carrying this tag promises about its leaves."""
        return self.value  # type: ignore[no-any-return]  # every member's value is its claim, a str

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__
    # by identity, as a tag compares: enum's hash (of the name) is Python code that dynamo
    # would trace, and guard on, wherever a compiled function hashes a node's tags
    __hash__ = object.__hash__

    def __reduce_ex__(self, protocol: object) -> tuple[Callable[[str], Tag], tuple[str]]:
        return tag_named, (self.name,)

    def __lt__(self, other: Tag) -> bool:
        return self.name < other.name


Locked = Tag.Locked
Shared = Tag.Shared
Memmap = Tag.Memmap
_BY_NAME = {t.name: t for t in (Locked, Shared, Memmap)}


def tag_named(name: str) -> Tag:
    """The tag called ``name``; ValueError for an unknown name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown tag {name!r}; tags are {sorted(_BY_NAME)}") from None
