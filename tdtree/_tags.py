"""Tags and the one propagation rule.

A node's tags are part of its type: ``TensorDict[Shared]`` is a real, cached
subclass of ``TensorDict``, and ``TensorDict[Locked, Shared]`` subclasses both
``TensorDict[Locked]`` and ``TensorDict[Shared]``, so ``isinstance`` is true
when a node carries at least the tags asked for.

The rule, applied by :func:`tag_rule` to every operation that returns nodes:
a result carries the tags common to its node inputs if and only if every leaf
of the result that holds data uses a storage one of those inputs already used;
otherwise it carries none. Untagged inputs skip the check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import optree
import torch

from ._base import Node, make
from ._pytree import NAMESPACE, register

__all__ = [
    "Tag",
    "Locked",
    "Shared",
    "Memmap",
    "tag_named",
    "tagged_type",
    "retag",
    "tag_rule",
    "storage_key",
]

F = TypeVar("F", bound=Callable[..., Any])


class Tag:
    """A claim a node makes about all of its leaves; compared by identity, sorted by name."""

    __slots__ = ("name", "claim")

    def __init__(self, name: str, claim: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "claim", claim)

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError("tags are constants")

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple[Callable[[str], Tag], tuple[str]]:
        return tag_named, (self.name,)

    def __lt__(self, other: Tag) -> bool:
        return self.name < other.name


Locked = Tag("Locked", "writes go in place only; the functional editors refuse")
Shared = Tag("Shared", "every leaf with data lives in shared memory")
Memmap = Tag("Memmap", "every leaf with data is backed by a memory-mapped file")
_BY_NAME = {t.name: t for t in (Locked, Shared, Memmap)}


def tag_named(name: str) -> Tag:
    """The tag called ``name``; ValueError for an unknown name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown tag {name!r}; tags are {sorted(_BY_NAME)}") from None


_TYPES: dict[tuple[type, frozenset], type] = {}


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
    bases = tuple(tagged_type(root, tags - {t}) for t in order)
    name = f"{root.__name__}[{', '.join(t.name for t in order)}]"
    cls = type(root)(
        name,
        bases,
        {"__slots__": (), "_tags": tags, "_root": root, "__module__": root.__module__, "__qualname__": name},
    )
    register(cls)
    _TYPES[(root, tags)] = cls
    return cls


def retag(node: Any, tags: frozenset) -> Any:
    """``node`` with every sub-node carrying exactly ``tags`` (leaves reused, node returned when it already does)."""
    if not isinstance(node, Node) or _uniform(node, tags):
        return node
    data = {k: retag(v, tags) for k, v in node._data.items()}
    _, batch_size, device, _ = node._meta
    return make(tagged_type(type(node)._root, tags), data, batch_size, device)


def _uniform(node: Node, tags: frozenset) -> bool:
    return type(node)._tags == tags and all(
        not isinstance(v, Node) or _uniform(v, tags) for v in node._data.values()
    )


def storage_key(tensor: torch.Tensor) -> tuple[torch.device, int] | None:
    """The identity of ``tensor``'s storage, or None when the storage holds no bytes."""
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return (tensor.device, storage.data_ptr())


def _leaves(tree: Any) -> list[Any]:
    return optree.tree_leaves(tree, namespace=NAMESPACE)


def _node_inputs(args: tuple, kwargs: dict) -> Iterator[Node]:
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, Node):
            yield arg
        elif type(arg) in (list, tuple):
            for item in arg:
                if isinstance(item, Node):
                    yield item


def _keeps_storage(result: Node, known: set) -> bool:
    for leaf in _leaves(result):
        if isinstance(leaf, torch.Tensor):
            key = storage_key(leaf)
            if key is not None and key not in known:
                return False
    return True


def _decide(out: Any, inputs: list[Node]) -> Any:
    common = frozenset.intersection(*(type(n)._tags for n in inputs))
    known: set | None = None
    if common:
        known = set()
        for node in inputs:
            for leaf in _leaves(node):
                if isinstance(leaf, torch.Tensor):
                    key = storage_key(leaf)
                    if key is not None:
                        known.add(key)

    def one(result: Any) -> Any:
        if not isinstance(result, Node):
            return result
        keep = known is not None and _keeps_storage(result, known)
        return retag(result, common if keep else frozenset())

    if type(out) in (list, tuple):
        return type(out)(one(r) for r in out)
    return one(out)


def tag_rule(fn: F) -> F:
    """Apply the propagation rule to what ``fn`` returns (a node, or a list or tuple of nodes)."""

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        inputs = list(_node_inputs(args, kwargs))
        for node in inputs:
            if type(node)._tags:
                return _decide(out, inputs)
        return out

    return op  # type: ignore[return-value]
