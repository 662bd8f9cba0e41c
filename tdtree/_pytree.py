"""Registration of node types with optree (namespace ``"tdtree"``), torch's pytree and the name
table (:mod:`tdtree._names`), and the tagged variants of each root type.

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

import copyreg
import itertools
from collections.abc import Iterable
from typing import Any

import optree
import torch

from . import _names
from ._base import Node, from_meta
from ._tagnames import Locked, Memmap, Shared, Tag, tag_named
from ._torch_private import torch_pytree
from .errors import BatchSizeError

NAMESPACE = "tdtree"

__all__ = ["NAMESPACE", "register", "tagged_type", "variant", "refuse_tagged", "check_children"]


def _flatten(node: Node) -> tuple[tuple[Any, ...], tuple, tuple[str, ...]]:
    meta = node._meta
    return tuple(node._data.values()), meta, meta[0]


def _torch_flatten(node: Node) -> tuple[list[Any], tuple]:
    return list(node._data.values()), node._meta


def _torch_flatten_with_keys(node: Node) -> tuple[list[tuple[Any, Any]], tuple]:
    return [(torch_pytree.MappingKey(k), v) for k, v in node._data.items()], node._meta


def check_children(meta: tuple, values: list[Any]) -> None:
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
    """Register ``cls`` (a node type with its ``_tags``) with both pytree registries and the name table.

    The module defining a root node type calls this once the class exists.
    Registering a root type also makes every tagged variant of it: torch finds
    a type by its serialized name when ``torch.export.load`` reads a program, so
    ``TensorDict[Locked]`` must exist before any node of it does.
    """

    def unflatten(meta: tuple, values: Any) -> Any:
        return from_meta(cls, meta, values)

    def torch_unflatten(values: Any, meta: tuple) -> Any:
        if meta[1]:  # batch dims, which every child must start with (parameter nodes have none)
            values = list(values)
            check_children(meta, values)
        return from_meta(cls, meta, values)

    def from_dumpable(ctx: dict[str, Any]) -> tuple:
        device = None if ctx["device"] is None else torch.device(ctx["device"])
        tags = frozenset(tag_named(n) for n in ctx["tags"])
        return (tuple(ctx["keys"]), torch.Size(ctx["batch_size"]), device, tags)

    # optree's stub is wrong here: it types the functions as taking any Collection and any Hashable
    # metadata, but optree calls them only with instances of ``cls`` and the metadata _flatten made
    optree.register_pytree_node(
        cls,
        _flatten,  # type: ignore[arg-type]
        unflatten,  # type: ignore[arg-type]
        path_entry_type=optree.MappingEntry,
        namespace=NAMESPACE,
    )
    torch_pytree.register_pytree_node(
        cls,
        _torch_flatten,
        torch_unflatten,
        serialized_type_name=_names.add(cls),
        to_dumpable_context=_dumpable,
        from_dumpable_context=from_dumpable,
        flatten_with_keys_fn=_torch_flatten_with_keys,
    )
    if "_tags" not in cls.__dict__:  # a root type; its variants set their own tags
        every = (Locked, Memmap, Shared)
        for n in range(1, len(every) + 1):
            for tags in itertools.combinations(every, n):
                tagged_type(cls, tags)


_TYPES: dict[tuple[type, frozenset], type] = {}
# root -> its tagged types with their tags, for retag: a compiled retag that finds its type by comparing tag
# sets guards on less than one that looks it up in _TYPES by hash (7 guards fewer on a view of a Shared node)
_VARIANTS: dict[type, list[tuple[frozenset, type]]] = {}


def refuse_tagged(cls: type, what: str) -> TypeError:
    """The error for building a node of the tagged type ``cls`` by ``what`` (a constructor)."""
    root = getattr(cls, "_root", cls).__name__
    return TypeError(
        f"{what}: {cls.__name__} is a tagged type and cannot be built directly: tags claim what the "
        f"storage is, and a node built from leaves has none to check. Build a {root} and call "
        ".lock(), .share_memory() or .memmap(prefix) on it."
    )


def _refused_init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    raise refuse_tagged(cls, f"{cls.__name__}(...)")


class _Tagged(type):
    """The metaclass of the tagged variants, which lets a variant pickle (a tree spec holds it) as the
    call that gives it back in any process: ``tagged_type(root, tags)``, the root pickled by name.

    The variants alone have it: a metaclass of its own makes every ``isinstance(x, cls)`` that is
    False go through ``__instancecheck__``, and the walks ask that of the root types on every leaf.
    """


_TAGGED_METAS: dict[type, type] = {type: _Tagged}


def _reduce_tagged(cls: Any) -> tuple[Any, tuple[type, tuple[Tag, ...]]]:
    return tagged_type, (cls._root, tuple(sorted(cls._tags)))


copyreg.pickle(_Tagged, _reduce_tagged)


def _tagged_meta(meta: type) -> type:
    """The metaclass of the variants of a root type whose metaclass is ``meta`` (``type``, or the root's
    own: a metaclass of the two, registered with copyreg as pickle looks metaclasses up by type)."""
    found = _TAGGED_METAS.get(meta)
    if found is None:
        found = _TAGGED_METAS[meta] = type(f"_Tagged{meta.__name__}", (_Tagged, meta), {})
        copyreg.pickle(found, _reduce_tagged)
    return found


def tagged_type(root: type, tags: Iterable[Tag]) -> type:
    """The node type ``root`` with exactly ``tags``, made and registered once."""
    tags = frozenset(tags)
    if not tags:
        return root
    cls = _TYPES.get((root, tags))
    if cls is not None:
        return cls
    for tag in tags:
        if not isinstance(tag, Tag):
            raise TypeError(f"{root.__name__}[...] takes tags (Locked, Shared, Memmap), got {tag!r}")
    order = sorted(tags)
    # a subclass's tagged type is also its parent's (``MyTD[Locked]`` is a ``TensorDict[Locked]``):
    # tags are types for subclasses too
    parents = tuple(tagged_type(b, tags) for b in root.__bases__ if b.__dict__.get("_root") is b)
    bases = tuple(tagged_type(root, tags - {t}) for t in order) + parents
    name = f"{root.__name__}[{', '.join(t.name for t in order)}]"
    cls = _tagged_meta(type(root))(
        name,
        bases,
        {
            "__slots__": (),
            "_tags": tags,
            "_root": root,
            "__module__": root.__module__,
            "__qualname__": name,
            "__init__": _refused_init,
        },
    )
    register(cls)
    _TYPES[(root, tags)] = cls
    _VARIANTS.setdefault(root, []).append((tags, cls))
    return cls


def variant(root: type, tags: frozenset) -> Any:
    """``tagged_type(root, tags)`` for non-empty ``tags``, found by comparing tag sets: under
    ``torch.compile`` this adds fewer guards than tagged_type's lookup by hash."""
    for have, cls in _VARIANTS.get(root, ()):
        if have == tags:
            return cls
    return tagged_type(root, tags)
