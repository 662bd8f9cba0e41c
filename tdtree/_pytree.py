"""Registration of node types with optree (namespace ``"tdtree"``) and torch's pytree.

Children are the values in canonical key order; the metadata is
``(keys, batch_size, device, tags)``. Unflatten builds untagged nodes whatever
the tags in the metadata (DESIGN 3.1: a node built from leaves has no inputs
to compare storages with), so two structures still differ by tags but nothing
rebuilt from leaves claims any. The torch side also checks, on unflatten,
that every child starts with the batch size: ``torch.func.vmap`` hands
transformed functions leaves that have lost the mapped dimension, and a node
must never claim a batch size its leaves do not have.
"""

from __future__ import annotations

import itertools
from typing import Any

import optree
import torch
import torch.utils._pytree as torch_pytree

from ._base import Node, from_meta
from .errors import BatchSizeError

NAMESPACE = "tdtree"

__all__ = ["NAMESPACE", "register"]


def _flatten(node: Node) -> tuple[tuple[Any, ...], tuple, tuple[str, ...]]:
    meta = node._meta
    return tuple(node._data.values()), meta, meta[0]


def _torch_flatten(node: Node) -> tuple[list[Any], tuple]:
    return list(node._data.values()), node._meta


def _torch_flatten_with_keys(node: Node) -> tuple[list[tuple[Any, Any]], tuple]:
    return [(torch_pytree.MappingKey(k), v) for k, v in node._data.items()], node._meta


def _check_children(meta: tuple, values: list[Any]) -> None:
    batch_size = meta[1]
    n = len(batch_size)
    if not n:
        return  # every shape starts with ()
    for key, value in zip(meta[0], values):
        if isinstance(value, Node):
            shape = value._meta[1]
        elif isinstance(value, torch.Tensor):
            shape = value.shape
        else:
            continue  # torch builds trees of placeholders (in_dims, specs) through unflatten too
        if tuple(shape[:n]) != tuple(batch_size):
            raise BatchSizeError(
                f"cannot rebuild a node with batch_size {tuple(batch_size)}: entry {key!r} has shape "
                f"{tuple(shape)}. torch.func.vmap hands leaves that lost the "
                "mapped dimension; map over nodes with tdtree.vmap, which rewrites batch sizes."
            )


def _dumpable(meta: tuple) -> dict[str, Any]:
    keys, batch_size, device, tags = meta
    return {
        "keys": list(keys),
        "batch_size": list(batch_size),
        "device": None if device is None else str(device),
        "tags": sorted(t.name for t in tags),
    }


def register(cls: type) -> None:
    """Register ``cls`` (a node type with its ``_tags``) with both pytree registries.

    Registering a root type also makes every tagged variant of it: torch finds
    a type by its serialized name when ``torch.export.load`` reads a program, so
    ``TensorDict[Locked]`` must exist before any node of it does.
    """

    def unflatten(meta: tuple, values: Any) -> Any:
        return from_meta(cls, meta, values)

    def torch_unflatten(values: Any, meta: tuple) -> Any:
        values = list(values)
        _check_children(meta, values)
        return from_meta(cls, meta, values)

    def from_dumpable(ctx: dict[str, Any]) -> tuple:
        from ._tags import tag_named

        device = None if ctx["device"] is None else torch.device(ctx["device"])
        tags = frozenset(tag_named(n) for n in ctx["tags"])
        return (tuple(ctx["keys"]), torch.Size(ctx["batch_size"]), device, tags)

    # optree's stub is wrong here: it types the functions as taking any Collection and any Hashable
    # metadata, but optree calls them only with instances of ``cls`` and the metadata _flatten made
    optree.register_pytree_node(
        cls, _flatten, unflatten, path_entry_type=optree.MappingEntry, namespace=NAMESPACE  # type: ignore[arg-type]
    )
    torch_pytree.register_pytree_node(
        cls,
        _torch_flatten,
        torch_unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        to_dumpable_context=_dumpable,
        from_dumpable_context=from_dumpable,
        flatten_with_keys_fn=_torch_flatten_with_keys,
    )
    if "_tags" not in cls.__dict__:  # a root type; its variants set their own tags
        from ._tags import Locked, Memmap, Shared, tagged_type

        every = (Locked, Memmap, Shared)
        for n in range(1, len(every) + 1):
            for tags in itertools.combinations(every, n):
                tagged_type(cls, tags)
