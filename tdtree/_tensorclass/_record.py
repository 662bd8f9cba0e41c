"""Loading a memmap directory: :func:`load_memmap`, and the tensorclass record (see
:mod:`tdtree._tensorclass._layout`) read back around the loaded node.

Loading accepts only a class in the name table of tensorclasses made in this
process (:func:`tdtree._tensorclass._pytree.registered`) and an enum that the field's own
annotation names: nothing is imported, so a file can never run code.
"""

from __future__ import annotations

import enum
import os
import types
import typing
from collections.abc import Callable
from typing import Any

from .._base import Layout
from .._memmap import load
from .._node import TensorDict
from .._tags import tag_rule
from ..errors import MemmapError
from ._class import _hints, from_layout
from ._pytree import registered

__all__ = ["load_memmap", "from_record"]


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


@tag_rule
def load_memmap(prefix: str | os.PathLike[str], mode: str = "r+") -> Any:
    """The node stored under ``prefix`` by :meth:`TensorDict.memmap`, leaves mapped from its files.

    The directory is opened once and every file read through it, so a load sees
    one complete directory even while another process replaces ``prefix``. The
    prefix itself, ``meta.json`` and the leaf files must not be symlinks (parent
    directories may be), and must be regular files: anything else is refused.

    Args:
        prefix: the memmap directory.
        mode: as numpy's memmap: ``"r+"`` maps the files shared: in-place writes go
            to the files and are seen by every process that maps them. ``"r"``:
            read-only, every tdtree in-place writer raises WriteError. ``"c"``:
            copy-on-write, in-place writes stay in this process's memory. A pickle (or
            torch.multiprocessing) of an ``"r+"`` / ``"r"`` node maps the same files again
            with the same mode, or raises MemmapError when ``prefix`` no longer holds them;
            a ``"c"`` node pickles by value, as its ``clone()`` (untagged).

    Returns:
        The node, on the CPU, tagged ``{Memmap, Locked}`` on every sub-node; a tensorclass
        instance when a tensorclass was memmapped (its class must be defined in this process).

    Raises:
        MemmapError: naming the file: a missing, corrupt, oversized, non-regular or
            symlinked metadata or leaf file, an unknown format version, a dtype that
            cannot be mapped, a shape too large, or a leaf file of the wrong size.
    """
    node, rec, meta = load(prefix, mode)
    if rec is None:
        return node
    return from_record(node, rec, lambda reason: MemmapError(f"corrupt metadata file {meta}: {reason}"))
