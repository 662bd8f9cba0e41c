"""What the tag rule knows of a node's leaves and storages, and its storage tests.

The rule (:mod:`tdtree._tags`) decides by storage identity alone. What it needs of an input node
(the ids of its leaves and sub-nodes, whether its tree carries its tags everywhere, its leaves'
storages) is worked out once per node, kept on it (``memo``: a node never changes) as a
:class:`Known`, so that an operation pays for its result, not its input; :func:`holds_new` then tells
whether a result's leaves hold data on a storage none of its inputs has.
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import FEW, Node, all_plain
from ._torch_private import holds_data, storage_id, storage_of, storage_set, storages

__all__ = ["storage_key", "Known", "holds_new", "scan", "untagged_throughout"]

_Tensor = torch.Tensor


def storage_key(tensor: torch.Tensor) -> int | None:
    """The identity of ``tensor``'s storage, or None when the storage holds no bytes.

    The identity is the storage itself (``_torch_private.storage_id``), which two
    tensors share exactly when they view the same memory: the same test as equal
    ``untyped_storage().data_ptr()``, but also defined for the fake tensors
    dynamo traces with. A functorch wrapper has the identity of the tensor it
    wraps. Zero-byte storages hold no data and never decide.
    """
    storage = storage_of(tensor)
    return storage_id(storage) if holds_data(storage) else None


class Known:
    """What the rule knows of one input node: the ids of its leaves and sub-nodes, whether every node
    of it carries its own tags, and (asked for only when a result leaf is not one of them) its
    leaves' storages.

    The storages are kept as themselves, a set by identity (``_torch_private.storage_set``): a
    result leaf's storage is looked up with no ``id()`` per leaf, and the set holds no storage
    longer than the node's leaves do."""

    __slots__ = ("leaves", "ids", "uniform", "_storages")

    def __init__(self, node: Node) -> None:
        self.leaves: list[torch.Tensor] = []
        subs: list[Node] = []
        self.uniform = scan(node, type(node)._tags, self.leaves, subs)
        # a sub-node is its leaves: a result holding it as it is holds them
        self.ids = set(map(id, self.leaves))
        self.ids.update(map(id, subs))
        self._storages: set[torch.UntypedStorage] | None = None

    @property
    def storages(self) -> set[torch.UntypedStorage]:
        # the inputs' zero-byte storages are in it too: a leaf on one of them has no storage_key,
        # and is no new storage either way
        if self._storages is None:
            self._storages = storage_set(self.leaves)
        return self._storages


def _in_any(x: object, sets: list[set[Any]]) -> bool:
    for s in sets:
        if x in s:
            return True
    return False


def holds_new(leaves: list[torch.Tensor], known: list[Known], mixed: bool = False) -> bool:
    """Whether one of ``leaves`` holds data (a ``storage_key``) on a storage none of ``known`` has
    (``mixed``: the caller found already that not all of them are the one input's own tensors)."""
    if len(known) == 1:
        ids = known[0].ids
        if not mixed and ids.issuperset(map(id, leaves)):
            return False  # the input's own tensors (select, exclude, ...): its storages
        seen = known[0].storages
        # the input's own leaves and views of them (an index, a reshape): its storages, told by one
        # test in C (the input's leaves are looked up too: cheaper than picking the others out)
        if seen.issuperset(storages(leaves)):
            return False
        # stops at the first new storage holding data: one of zero bytes does not decide
        for storage in storages(leaves):
            if storage not in seen and holds_data(storage):
                return True
        return False
    idsets = [k.ids for k in known]
    sets = [k.storages for k in known]
    for t in leaves:
        if not _in_any(id(t), idsets):
            # the first leaf that is no input's own decides when it holds data on a new storage (a +
            # of two nodes, stack, cat): no pass over the others
            storage = storage_of(t)
            if not _in_any(storage, sets) and holds_data(storage):
                return True
            break
    unknown = leaves
    for ids in idsets:
        unknown = [t for t in unknown if id(t) not in ids]
    # stops at the first new storage holding data: an operation that computes new tensors is
    # decided by its first leaf
    for storage in storages(unknown):
        for seen in sets:
            if storage in seen:
                break
        else:
            if holds_data(storage):
                return True
    return False


def scan(node: Node, tags: frozenset, out: list[torch.Tensor], nodes: list[Node] | None = None) -> bool:
    """Append ``node``'s leaves to ``out`` (depth first), and its sub-nodes to ``nodes`` when given;
    whether every node of it carries exactly ``tags``."""
    # a walk of ``_data`` (optree would call back per node and check every leaf against its
    # registry), which also tells whether retag has work to do; a leaf that is not a tensor (the
    # placeholders torch unflattens into node structures) holds no storage and is passed over
    # (from an explicit stack of the levels above, as _maps.leaves walks: a node is as deep as a
    # nested dict gets)
    uniform = type(node)._tags == tags
    data = node._data
    if len(data) >= FEW and all_plain(data.values(), len(data)):
        out.extend(data.values())  # a flat node of plain tensors, told by a count in C (as retagged does)
        return uniform
    values = iter(data.values())
    above = []
    while True:
        for v in values:
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, Node):
                uniform = uniform and type(v)._tags == tags
                if nodes is not None:
                    nodes.append(v)
                above.append(values)
                values = iter(v._data.values())
                break
        else:
            if not above:
                return uniform
            values = above.pop()


def untagged_throughout(node: Node) -> bool:
    """Whether no node of ``node``'s tree carries a tag: :func:`scan` for no tags, without collecting
    the leaves (a tensor entry costs one type test)."""
    if type(node)._tags:
        return False
    todo = [node]
    while todo:
        data = todo.pop()._data
        if len(data) >= FEW and all_plain(data.values(), len(data)):
            continue
        for v in data.values():
            if type(v) is not _Tensor and isinstance(v, Node):
                if type(v)._tags:
                    return False
                todo.append(v)
    return True
