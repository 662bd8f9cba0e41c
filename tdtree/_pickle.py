"""Pickling: nodes reduce to tensors and plain metadata, and rebuild through one function.

The rebuild function is the only thing tdtree adds to torch's safe globals, so
``torch.load(f, weights_only=True)`` of a file holding nodes works and can run
nothing else. Unpickling makes the tags' claims true again: leaves of a
``Shared`` node are moved to shared memory when they are not there already.
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import Node, make
from ._tags import Shared, tag_named, tagged_type

__all__ = ["reduce_node", "rebuild_node"]

_ROOTS: dict[str, type] = {}
# The name is fixed when the class is made: a module may rename a class's
# __module__ afterwards (TensorDict shows as "tdtree.TensorDict").
_NAMES: dict[type, str] = {}


def register_root(cls: type) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    _ROOTS[name] = cls
    _NAMES[cls] = name


def reduce_node(node: Node) -> tuple[Any, tuple[Any, ...]]:
    keys, batch_size, device, tags = node._meta
    return rebuild_node, (
        _NAMES[type(node)._root],
        keys,
        tuple(node._data.values()),
        tuple(batch_size),
        None if device is None else str(device),
        tuple(sorted(t.name for t in tags)),
    )


def rebuild_node(
    root_name: str,
    keys: tuple[str, ...],
    values: tuple[Any, ...],
    batch_size: tuple[int, ...],
    device: str | None,
    tag_names: tuple[str, ...],
) -> Node:
    try:
        root = _ROOTS[root_name]
    except KeyError:
        raise TypeError(f"cannot unpickle a node of unknown type {root_name!r}") from None
    tags = frozenset(tag_named(n) for n in tag_names)
    if Shared in tags:
        for v in values:
            if isinstance(v, torch.Tensor) and not v.is_shared():
                v.share_memory_()
    return make(
        tagged_type(root, tags),
        dict(zip(keys, values)),
        torch.Size(batch_size),
        None if device is None else torch.device(device),
    )


torch.serialization.add_safe_globals([rebuild_node])
