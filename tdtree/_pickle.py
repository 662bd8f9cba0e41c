"""Pickling: nodes reduce to tensors and plain metadata, and rebuild through one function.

The rebuild function is the only thing tdtree adds to torch's safe globals, so
``torch.load(f, weights_only=True)`` of a file holding nodes works and can run
nothing else. Unpickling makes the tags' claims true again: leaves of a
``Shared`` node are moved to shared memory when they are not there already,
and a ``Memmap`` node pickles by reference (each leaf as its directory, file
index and view, see :func:`tdtree._memmap.reference`) and maps its files again,
shared or private as it was. Leaves that hold no bytes travel by value.
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import Node, make
from ._tags import Memmap, Shared, retag, tag_named

__all__ = ["reduce_node", "rebuild_node", "root_name", "root_named"]

_ROOTS: list[type] = []
_BY_NAME: dict[str, type] = {}


def register_root(cls: type) -> None:
    _ROOTS.append(cls)


def root_name(cls: type) -> str:
    """The name a node type is pickled under: its module and qualified name as they are now."""
    return f"{cls.__module__}.{cls.__qualname__}"


def root_named(name: object) -> type | None:
    """The registered node type pickled as ``name``, or None."""
    if type(name) is not str:
        return None
    found = _BY_NAME.get(name)
    if found is None:
        # Names are read when first asked for: a class may set its public
        # __module__ (tdtree.TensorDict) after it was registered.
        _BY_NAME.clear()
        _BY_NAME.update((root_name(c), c) for c in _ROOTS)
        found = _BY_NAME.get(name)
    return found


def reduce_node(node: Node) -> tuple[Any, tuple[Any, ...]]:
    root = type(node)._root
    keys, batch_size, device, tags = node._meta
    values = tuple(node._data.values())
    if Memmap in tags:
        from ._memmap import reference

        values = tuple(v if isinstance(v, Node) else reference(v) for v in values)
    return rebuild_node, (
        root_name(root),
        keys,
        values,
        tuple(batch_size),
        None if device is None else str(device),
        tuple(sorted(t.name for t in tags)),
    )


def rebuild_node(
    type_name: str,
    keys: tuple[str, ...],
    values: tuple[Any, ...],
    batch_size: tuple[int, ...],
    device: str | None,
    tag_names: tuple[str, ...],
) -> Node:
    root = root_named(type_name)
    if root is None:
        raise TypeError(f"cannot unpickle a node of unknown type {type_name!r}")
    tags = frozenset(tag_named(n) for n in tag_names)
    if Memmap in tags:
        from ._memmap import resolve

        values = tuple(v if isinstance(v, Node) else resolve(v) for v in values)
    if Shared in tags:
        for v in values:
            if isinstance(v, torch.Tensor) and not v.is_shared():
                v.share_memory_()
    # the claims are true again (above), so the tags are written back: unpickling is one of retag's callers
    node = make(root, dict(zip(keys, values)), torch.Size(batch_size), None if device is None else torch.device(device))
    return retag(node, tags) if tags else node


torch.serialization.add_safe_globals([rebuild_node])
