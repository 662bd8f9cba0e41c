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

import enum
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from ._base import Node, with_meta
from ._pytree import register
from ._torch_private import holds_data, nonstrict_trace, storage_id, storage_ids, storages

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


class Tag(enum.Enum):
    """A claim a node makes about all of its leaves; compared by identity, sorted by name.

    An enum, because dynamo treats enum members as constants: a compiled
    function that locks, unlocks or rebuilds a tagged node traces as eager runs.
    Pickled by name (a pickle does not depend on the claims' wording).
    """

    Locked = "writes go in place only; the functional editors refuse"
    Shared = "every leaf with data lives in shared memory"
    Memmap = "every leaf with data is backed by a memory-mapped file"

    @property
    def claim(self) -> str:
        """What a node carrying this tag promises about its leaves."""
        return self.value  # type: ignore[no-any-return]  # every member's value is its claim, a str

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__
    # by identity, as a tag compares: enum's hash (of the name) is Python code that dynamo
    # would trace, and guard on, wherever a compiled function hashes a node's tags
    __hash__ = object.__hash__

    def __reduce_ex__(self, protocol: object) -> tuple[Callable[[str], Tag], tuple[str]]:
        return tag_named, (self.name,)

    def __lt__(self, other: Tag) -> bool:
        return self.name < other.name


Locked = Tag.Locked
Shared = Tag.Shared
Memmap = Tag.Memmap
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
    if not isinstance(node, Node):
        return node
    return _retag(node, tags, {})


def _retag(node: Node, tags: frozenset, types: dict[type, type]) -> Node:
    # One pass bottom up: a sub-tree already carrying ``tags`` everywhere comes back as it is.
    # ``types`` holds the tagged type of each root met, looked up once per call.
    data = node._data
    for k, v in data.items():
        if isinstance(v, Node):
            new = _retag(v, tags, types)
            if new is not v:
                if data is node._data:  # the first changed sub-node: copy the entries once
                    data = dict(data)
                data[k] = new
    if data is node._data and type(node)._tags == tags:
        return node
    root = type(node)._root
    cls: Any = types.get(root)  # a tagged type, whose _tags mypy cannot see on a plain type
    if cls is None:
        cls = types[root] = tagged_type(root, tags)
    # a node's entries never change once built, so an unchanged dict is shared, as a shallow clone shares it
    keys, batch_size, device, _ = node._meta
    return with_meta(cls, data, (keys, batch_size, device, cls._tags))


def storage_key(tensor: torch.Tensor) -> int | None:
    """The identity of ``tensor``'s storage, or None when the storage holds no bytes.

    The identity is the storage itself (its C++ object), which two tensors share
    exactly when they view the same memory: the same test as equal
    ``untyped_storage().data_ptr()``, but also defined for the fake tensors
    dynamo traces with. A functorch wrapper has the identity of the tensor it
    wraps. Zero-byte storages hold no data and never decide.
    """
    storage = next(storages((tensor,)))
    return storage_id(storage) if holds_data(storage) else None


@nonstrict_trace
def _new_storages(results: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> list[bool]:
    """For each leaf list of ``results``: whether a leaf holds data (a ``storage_key``) none of ``inputs`` has."""
    # nonstrict_trace: under torch.compile dynamo runs this on the fake tensors
    # at trace time (fakes keep their storages' identity) and keeps the bools as
    # constants, so the rule adds no graph break; in eager it is a plain call.
    # Dynamo's graph keeps a call of it whose result nothing reads: AOTAutograd
    # traces that to nothing (inductor and aot_eager never call it again), and
    # only the "eager" backend, which runs dynamo's graph as it is, calls it per run.
    same = set(map(id, inputs))
    known: set[int] | None = None
    decided = []
    for leaves in results:
        if same.issuperset(map(id, leaves)):
            decided.append(False)  # the inputs' own tensors (select, exclude, ...): their storages
            continue
        if known is None:
            # the inputs' zero-byte storages are in ``known`` too: a leaf on one of them
            # has no storage_key, and is no new storage either way
            known = set(storage_ids(inputs))
        found = list(storages(leaves))
        decided.append(
            not known.issuperset(map(storage_id, found))
            and any(holds_data(s) for s in found if storage_id(s) not in known)  # storage_key is not None
        )
    return decided


def _scan(node: Node, tags: frozenset, out: list[torch.Tensor]) -> bool:
    """Append ``node``'s leaves to ``out`` (depth first); whether every node of it carries exactly ``tags``."""
    # a walk of ``_data`` (optree would call back per node and check every leaf against its
    # registry), which also tells whether retag has work to do; a leaf that is not a tensor (the
    # placeholders torch unflattens into node structures) holds no storage and is passed over
    uniform = type(node)._tags == tags
    for v in node._data.values():
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, Node):
            uniform = _scan(v, tags, out) and uniform
    return uniform


def _node_inputs(args: tuple, kwargs: dict) -> Iterator[Node]:
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, Node):
            yield arg
        elif type(arg) in (list, tuple):
            for item in arg:
                if isinstance(item, Node):
                    yield item


def _decide(out: Any, inputs: list[Node]) -> Any:
    common = frozenset.intersection(*(type(n)._tags for n in inputs))
    many = type(out) in (list, tuple)
    results = out if many else (out,)
    decided = _ruled(results, inputs, common) if common else [retag(r, common) for r in results]
    return type(out)(decided) if many else decided[0]


def _ruled(results: Iterable[Any], inputs: list[Node], common: frozenset) -> list[Any]:
    """``results`` with the rule applied for the non-empty ``common`` tags of ``inputs``."""
    known: list[torch.Tensor] = []
    for n in inputs:
        _scan(n, common, known)
    nodes = [r for r in results if isinstance(r, Node)]
    leaves: list[list[torch.Tensor]] = [[] for _ in nodes]
    uniform = [_scan(r, common, found) for r, found in zip(nodes, leaves)]
    decisions = iter(zip(_new_storages(leaves, known), uniform))  # the input storages gathered once
    decided = []
    for r in results:
        if isinstance(r, Node):
            fresh, carries_common = next(decisions)
            if fresh:
                r = retag(r, frozenset())
            elif not carries_common:  # a result carrying them everywhere already is kept as it is
                r = retag(r, common)
        decided.append(r)
    return decided


def _any_tagged(args: tuple, kwargs: dict) -> bool:
    for arg in args:
        if isinstance(arg, Node):
            if arg._meta[3]:
                return True
        elif type(arg) is list or (type(arg) is tuple and not (arg and type(arg[0]) is str)):
            # sequences of nodes (stack, cat); a tuple starting with a str is a nested key, not scanned
            for item in arg:
                if isinstance(item, Node) and item._meta[3]:
                    return True
    if kwargs:  # not bool(kwargs) and ...: compiled code would guard on the builtin
        return _any_tagged(tuple(kwargs.values()), {})
    return False


def tag_rule(fn: F) -> F:
    """Apply the propagation rule to what ``fn`` returns (a node, or a list or tuple of nodes).

    Untagged inputs return ``fn``'s result as it is: the common path pays one
    scan of the arguments and nothing else.

    Under ``torch.compile`` the decision is made while tracing, from the fake
    tensors' storages. A leaf whose size depends on data (``td[mask]``) counts
    as holding data, since the trace cannot know its size: compiled, a masked
    index drops the tags even for an all-False mask, where eager keeps them
    (every leaf then holds zero bytes). Dropping is the safe side of the rule.
    """

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if _any_tagged(args, kwargs):
            return _decide(out, list(_node_inputs(args, kwargs)))
        return out

    return op  # type: ignore[return-value]
