"""Tagged draws: the tag sets a node can carry, how each is made, and where memmap files live.

Memmap files of a drawn node go to a fresh directory under one per-process
root (``tempfile.mkdtemp(prefix="tdtree-testing-")``). Drawn inside a
hypothesis test, the directory is removed when that example finishes
(``hypothesis.control.cleanup``), so a run of any length keeps only the
current example's files; drawn outside one (``strategy.example()``), it stays
until the interpreter exits, when the root is removed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Collection, Iterable
from typing import Any

from hypothesis import control
from hypothesis.errors import InvalidArgument

from .. import Locked, Memmap, Shared, Tag
from ._tagsets import TAG_SETS

__all__ = ["TAG_SETS", "tag_sets", "apply_tags", "memmap_prefix"]

_root: list[str] = []


def tag_sets(tags: bool | Collection[Any]) -> tuple[frozenset[Tag], ...]:
    """The tag sets ``tags=`` asks for: False none, True all of :data:`TAG_SETS`, one set of tags, or a
    collection of such sets; ValueError for a set no node reaches."""
    if tags is False or tags is None:
        return (frozenset(),)
    if tags is True:
        return TAG_SETS
    items = list(tags)
    sets = [frozenset(items)] if all(isinstance(t, Tag) for t in items) else [frozenset(s) for s in items]
    for s in sets:
        if s not in TAG_SETS:
            raise ValueError(
                f"tags={sorted(t.name for t in s)}: no node carries this set; "
                f"reachable sets are {[sorted(t.name for t in r) for r in TAG_SETS]}"
            )
    return tuple(sets)


def memmap_prefix() -> str:
    """A fresh directory path for one memmapped draw, removed after the example (see the module doc)."""
    if not _root:
        root = tempfile.mkdtemp(prefix="tdtree-testing-")
        _root.append(root)
        atexit.register(shutil.rmtree, root, True)
    where = tempfile.mkdtemp(dir=_root[0])
    try:
        control.cleanup(lambda: shutil.rmtree(where, ignore_errors=True))
    except InvalidArgument:
        pass  # not inside a test: removed with the root at exit
    return os.path.join(where, "node")


def apply_tags(value: Any, tags: Iterable[Tag]) -> Any:
    """``value`` (a node or tensorclass) made to carry exactly ``tags``, through the public API:
    ``lock()``, ``share_memory()`` (a copy), ``memmap()`` (a copy in files), ``unlock()``."""
    tags = frozenset(tags)
    if Memmap in tags:
        value = value.memmap(memmap_prefix())
    elif Shared in tags:
        value = value.share_memory()
    elif Locked in tags:
        value = value.lock()
    if Locked not in tags and value.tags:
        value = value.unlock()
    return value
