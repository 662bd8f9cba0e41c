"""The one table from names to the types tdtree builds: node types (root and tagged) and tensorclasses.

A type's name is its module and qualified name when it is registered
(``tdtree.TensorDict``, ``tdtree.TensorDict[Locked]``, ``my.module.Point``).
Three readers use it: pickles and memmap directories name a node's root type
by it, a memmap directory names its tensorclass by it, and torch's pytree
registry serializes a type (``torch.export``) under it. A name is looked up,
never imported: a file can only name a type this process already made.
Registering a second type under a name (a class defined again) replaces the
first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._base import Node

__all__ = ["add", "name_of", "named", "root_named", "every"]

_BY_NAME: dict[str, type] = {}
_NAME: dict[type, str] = {}


def add(cls: type) -> str:
    """Register ``cls`` under its module and qualified name, and return that name."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    _BY_NAME[name] = cls
    _NAME[cls] = name
    return name


def name_of(cls: type) -> str:
    """The name ``cls`` was registered under (KeyError for a type never registered)."""
    return _NAME[cls]


def named(name: object, kind: type) -> type | None:
    """The registered subclass of ``kind`` called ``name`` (a str), or None."""
    found = _BY_NAME.get(name) if type(name) is str else None
    return found if found is not None and issubclass(found, kind) else None


def root_named(name: object) -> Any:
    """The registered root node type (not a tagged variant) called ``name``, or None."""
    found: Any = named(name, Node)
    return found if found is not None and found._root is found else None


def every(kind: type) -> Iterator[type]:
    """Every registered subclass of ``kind`` (the latest one under each name), in registration order."""
    return (cls for cls in list(_BY_NAME.values()) if issubclass(cls, kind))
