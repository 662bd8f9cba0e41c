"""Tensorclasses as pytrees: the registry of classes by import path, flatten and unflatten, and
:func:`rewrap`, which puts a TensorDict result back into a tensorclass.

The children are the data fields in canonical (sorted) key order, a nested tensorclass as itself;
the metadata is ``(td_meta, static)``, with ``td_meta`` the inner node's
``(keys, batch_size, device, tags)``, so static values are never leaves. Unflatten
builds an untagged instance (DESIGN 3.1): structures still differ by tags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree

from .._base import from_meta
from .._names import add, every, named
from .._node import TensorDict
from .._pytree import NAMESPACE, check_children
from .._torch_private import torch_pytree
from ._ops import RecordOps

__all__ = ["register", "registered", "rewrap", "watch"]

# called with each class made (tdtree.testing registers each with hypothesis through this)
_WATCHERS: list[Callable[[type], None]] = []


def registered(name: object) -> Any:
    """The tensorclass made under the import path ``name`` (the latest one made), or None.

    A memmap directory names its class by this path and is loaded back only as a class
    found here (nothing is ever imported)."""
    return named(name, RecordOps)


def watch(fn: Callable[[type], None]) -> None:
    """Call ``fn`` with every tensorclass made so far and with each one made from now on."""
    _WATCHERS.append(fn)
    for cls in every(RecordOps):
        fn(cls)


def register(cls: Any) -> None:
    """List ``cls`` under its import path in the name table and register it with optree (namespace
    "tdtree") and torch's pytree."""
    name = add(cls)

    def unflatten(context: Any, children: Any) -> Any:
        return _from_pytree(cls, context, children)

    def torch_unflatten(children: Any, context: tuple) -> Any:
        children = list(children)
        check_children(context[0], [c._td if isinstance(c, RecordOps) else c for c in children])
        return _from_pytree(cls, context, children)

    optree.register_pytree_node(cls, _flatten, unflatten, path_entry_type=optree.GetAttrEntry, namespace=NAMESPACE)
    torch_pytree.register_pytree_node(
        cls,
        _torch_flatten,
        torch_unflatten,
        serialized_type_name=name,
        flatten_with_keys_fn=_torch_flatten_with_keys,
    )
    for fn in _WATCHERS:
        fn(cls)


def _flatten(tc: Any) -> tuple[list[Any], tuple, tuple[str, ...]]:
    meta = tc._td._meta
    return [getattr(tc, k) for k in meta[0]], (meta, tc._static), meta[0]


def _torch_flatten(tc: Any) -> tuple[list[Any], tuple]:
    meta = tc._td._meta
    return [getattr(tc, k) for k in meta[0]], (meta, tc._static)


def _torch_flatten_with_keys(tc: Any) -> tuple[list[tuple[Any, Any]], tuple]:
    meta = tc._td._meta
    return [(torch_pytree.GetAttrKey(k), getattr(tc, k)) for k in meta[0]], (meta, tc._static)


def _from_pytree(cls: Any, context: tuple, children: list[Any]) -> Any:
    meta, static = context
    entries = [c._td if isinstance(c, RecordOps) else c for c in children]
    td = from_meta(TensorDict, meta, entries)  # untagged, as every unflatten builds
    obj: Any = object.__new__(cls)
    object.__setattr__(obj, "_td", td)
    object.__setattr__(obj, "_static", static)
    for k, c in zip(meta[0], children):
        object.__setattr__(obj, k, c)
    for k, v in static:
        object.__setattr__(obj, k, v)
    return obj


def rewrap(template: Any, td: TensorDict) -> Any:
    """A tensorclass like ``template`` (same class, static fields and nested classes) holding ``td``,
    a result of a TensorDict operation on ``template._td`` (same keys)."""
    cls = type(template)
    obj = object.__new__(cls)
    object.__setattr__(obj, "_td", td)
    object.__setattr__(obj, "_static", template._static)
    entries = td._data
    for name in cls._fields:
        old = getattr(template, name)
        if name in entries:
            new = entries[name]
            if isinstance(old, RecordOps):
                new = rewrap(old, new)
            object.__setattr__(obj, name, new)
        else:
            object.__setattr__(obj, name, old)
    return obj
