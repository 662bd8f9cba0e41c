"""Python records as nodes: dataclass and named-tuple instances in, named tuples out.

A record becomes a mapping from field name to value, a nested record (dataclass
or named tuple, either inside either) a nested mapping, and the whole goes
through :func:`tdtree._keyops.from_dict`: the same validation, and the same
batch size inference when none is given. Field values are kept, not copied.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import keyword
from collections.abc import Mapping
from typing import Any

import torch

from . import _keyops
from ._base import Node, NodeT
from ._keys import display

__all__ = ["from_dataclass", "from_namedtuple", "to_namedtuple"]


def _is_dataclass(obj: object) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _fields(obj: Any, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """``obj``'s fields as a dict, nested records as nested dicts."""
    if _is_dataclass(obj):
        pairs = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    else:
        pairs = list(obj._asdict().items())
    out: dict[str, Any] = {}
    for key, value in pairs:
        if _is_dataclass(value) or _is_namedtuple(value):
            out[key] = _fields(value, (*path, key))
        elif isinstance(value, (torch.Tensor, Node, Mapping)):
            out[key] = value
        else:
            # Checked here so the message names the whole field path (from_dict names the last part).
            raise TypeError(
                f"field {display((*path, key))!r} of {type(obj).__name__} is a {type(value).__name__}; "
                "fields are tensors, nodes, mappings or records (wrap numbers with torch.as_tensor)"
            )
    return out


def from_dataclass(root: type[NodeT], obj: Any, batch_size: Any = None, device: Any = None) -> NodeT:
    """An untagged node with one entry per field of the dataclass instance ``obj``.

    Nested dataclass and named-tuple fields become nested nodes; other fields
    must be tensors, nodes or mappings (TypeError naming the field).
    ``batch_size=None`` infers it as :func:`tdtree._keyops.from_dict` does.
    """
    if not _is_dataclass(obj):
        what = "a dataclass type" if dataclasses.is_dataclass(obj) else type(obj).__name__
        raise TypeError(f"from_dataclass takes a dataclass instance, got {what}")
    return _keyops.from_dict(root, _fields(obj), batch_size, device)


def from_namedtuple(root: type[NodeT], obj: Any, batch_size: Any = None, device: Any = None) -> NodeT:
    """An untagged node with one entry per field of the named tuple ``obj``; as :func:`from_dataclass`."""
    if not _is_namedtuple(obj):
        raise TypeError(f"from_namedtuple takes a named tuple instance, got {type(obj).__name__}")
    return _keyops.from_dict(root, _fields(obj), batch_size, device)


@functools.cache
def _record_type(keys: tuple[str, ...]) -> type:
    # One type per key set: nodes with the same keys give records of the same type.
    return collections.namedtuple("TensorDictRecord", keys)  # type: ignore[misc]


def _check_field(path: tuple[str, ...]) -> None:
    name = path[-1]
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(
            f"key {display(path)!r} cannot be a named-tuple field (fields are identifiers not starting "
            "with '_' and not keywords); rename it first with td.rename(...)"
        )


def to_namedtuple(node: Node, path: tuple[str, ...] = ()) -> Any:
    """A named tuple with one field per key in canonical order, sub-nodes as nested named tuples.

    The leaves are the node's own tensors. Batch size, device and tags are not
    kept (a record has no place for them).
    """
    values = []
    for key, value in node._data.items():
        _check_field((*path, key))
        values.append(to_namedtuple(value, (*path, key)) if isinstance(value, Node) else value)
    return _record_type(node._meta[0])(*values)
