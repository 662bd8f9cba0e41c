"""The node's data layout and its trusted factory.

A node holds two slots: ``_data``, a dict from key to leaf in canonical
(sorted) key order, and ``_meta``, the static metadata
``(keys, batch_size, device, tags)`` that is also the node's pytree metadata.
``make`` and ``from_meta`` build nodes without validation: they are for
results of operations, whose inputs were validated when they entered. Slots are
written with a literal ``object.__setattr__`` because dynamo recognises that
spelling and traces node construction with it.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import torch

__all__ = ["Node", "NodeT", "make", "from_meta", "twin", "sorted_data", "leaf_or_node"]


class Node:
    """Base of every node type: the slots, immutability and the pytree hook."""

    __slots__ = ("_data", "_meta")
    _tags: ClassVar[frozenset] = frozenset()
    _root: ClassVar[type[Node]]
    _data: dict[str, Any]
    _meta: tuple[tuple[str, ...], torch.Size, torch.device | None, frozenset]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_tags" in cls.__dict__:
            return  # a tagged variant, made and registered by _tags.tagged_type
        cls._root = cls
        from . import _pickle, _pytree

        _pytree.register(cls)
        _pickle.register_root(cls)

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError(
            f"{type(self).__name__} is immutable: use .set(key, value) or .update(...) for a new node, "
            "or the in-place writers update_() / copy_() / at[idx].set_()"
        )

    def __delattr__(self, name: str) -> None:
        raise TypeError(f"{type(self).__name__} is immutable: use .exclude(key) for a node without it")


# An operation's result is a node of its input's root type (its tags may differ): ``view(td: NodeT) -> NodeT``.
NodeT = TypeVar("NodeT", bound=Node)


def make(cls: type[Node], data: dict[str, Any], batch_size: torch.Size, device: torch.device | None) -> Any:
    """Build a node of type ``cls`` from ``data`` already in canonical key order."""
    node = object.__new__(cls)
    object.__setattr__(node, "_data", data)
    object.__setattr__(node, "_meta", (tuple(data), batch_size, device, cls._tags))
    return node


def from_meta(cls: type[Node], meta: tuple, values: Any) -> Any:
    """Build a node from pytree metadata and children (the unflatten path)."""
    node = object.__new__(cls)
    object.__setattr__(node, "_data", dict(zip(meta[0], values)))
    object.__setattr__(node, "_meta", meta)
    return node


def twin(node: NodeT) -> NodeT:
    """A new node object of ``node``'s type over the same entries and metadata."""
    out = object.__new__(type(node))
    object.__setattr__(out, "_data", node._data)
    object.__setattr__(out, "_meta", node._meta)
    return out


def sorted_data(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` in canonical key order (returned as is when already sorted)."""
    keys = list(data)
    if keys == sorted(keys):
        return data
    return {k: data[k] for k in sorted(keys)}


def leaf_or_node(value: object) -> bool:
    return isinstance(value, (torch.Tensor, Node))
