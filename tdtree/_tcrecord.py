"""A tensorclass's layout as JSON, for the metadata file of a memmap directory.

The record names the class by its import path and holds the static fields'
values (an enum member as its enum's path and member name) and the records of
nested tensorclasses. Loading accepts only a class in the registry of
tensorclasses made in this process (:func:`tdtree._tcpytree.registered`)
and an enum that the field's own annotation names: nothing is imported, so a
file can never run code.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable
from typing import Any

from ._node import TensorDict
from ._tcpytree import registered
from ._tensorclass import Layout, _hints, from_layout

__all__ = ["record", "from_record"]


def _encode(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        kind = type(value)
        return {"enum": f"{kind.__module__}.{kind.__qualname__}", "name": value.name}
    return value


def record(lay: Layout) -> dict[str, Any]:
    """The JSON-able record of a layout (see :func:`tdtree._tensorclass.layout`)."""
    cls, static, nested = lay
    return {
        "class": cls._path,  # type: ignore[attr-defined]
        "static": [[k, _encode(v)] for k, v in static],
        "nested": [[k, record(sub)] for k, sub in nested],
    }


def _enums(hint: Any) -> list[type[enum.Enum]]:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return [hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [e for arg in typing.get_args(hint) for e in _enums(arg)]
    return []


def _decode(cls: Any, name: str, value: Any, corrupt: Callable[[str], Exception]) -> Any:
    if value is None or type(value) in (str, int, float, bool):
        return value
    if type(value) is dict and set(value) == {"enum", "name"}:
        for kind in _enums(_hints(cls).get(name)):
            if f"{kind.__module__}.{kind.__qualname__}" == value["enum"] and value["name"] in kind.__members__:
                return kind[value["name"]]
        raise corrupt(
            f"{cls.__name__}.{name} holds {value['enum']}.{value['name']}, which is not a member of an "
            "enum its annotation names"
        )
    raise corrupt(f"{cls.__name__}.{name} holds {value!r}, not a static value")


def _layout(rec: object, corrupt: Callable[[str], Exception]) -> Layout:
    if type(rec) is not dict or type(rec.get("static")) is not list or type(rec.get("nested")) is not list:
        raise corrupt("malformed tensorclass record")
    cls = registered(rec.get("class"))
    if cls is None:
        raise corrupt(
            f"unknown tensorclass {rec.get('class')!r}: import the module that defines it before "
            "loading (a memmap file never imports code)"
        )
    static: list[tuple[str, Any]] = []
    nested: list[tuple[str, Any]] = []
    for pairs, out, convert in (
        (rec["static"], static, lambda k, v: _decode(cls, k, v, corrupt)),
        (rec["nested"], nested, lambda k, v: _layout(v, corrupt)),
    ):
        for pair in pairs:
            if type(pair) is not list or len(pair) != 2 or pair[0] not in cls._fields:
                raise corrupt(f"malformed field entry {str(pair)[:80]} for {cls.__name__}")
            out.append((pair[0], convert(*pair)))
    return cls, tuple(static), tuple(nested)


def from_record(node: TensorDict, rec: object, corrupt: Callable[[str], Exception]) -> Any:
    """The tensorclass instance ``rec`` describes around the loaded ``node``; ``corrupt(reason)``
    makes the error for a record that does not fit."""
    return from_layout(_layout(rec, corrupt), node, corrupt)
