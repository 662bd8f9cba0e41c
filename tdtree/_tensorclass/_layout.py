"""What a tensorclass adds to its inner node, its layout (:func:`tdtree._base.layout`), as JSON for a
memmap directory.

The record names the class by its name in :mod:`tdtree._names` and holds the
static fields' values (an enum member as its enum's path and member name) and the
records of nested tensorclasses; :mod:`tdtree._tensorclass._record` reads it back.
"""

from __future__ import annotations

import enum
from typing import Any

from .._base import Layout
from .._names import name_of

__all__ = ["record"]


def _encode(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        kind = type(value)
        return {"enum": f"{kind.__module__}.{kind.__qualname__}", "name": value.name}
    return value


def record(lay: Layout) -> dict[str, Any]:
    """The JSON-able record of a layout."""
    cls, static, nested = lay
    return {
        "class": name_of(cls),
        "static": [[k, _encode(v)] for k, v in static],
        "nested": [[k, record(sub)] for k, sub in nested],
    }
