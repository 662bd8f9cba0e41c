"""The node's data layout and its trusted factory; a holder's (a tensorclass's) layout.

A node holds two slots: ``_data``, a dict from key to leaf in canonical
(sorted) key order, and ``_meta``, the static metadata
``(keys, batch_size, device, tags)`` that is also the node's pytree metadata.
``make``, ``from_meta`` and ``with_meta`` build nodes without validation: they
are for results of operations, whose inputs were validated when they entered;
``alike`` is ``with_meta`` for several nodes of one type and metadata in one
call (the results of ``unbind``, or of equal ``split`` sections, at one level
of the tree);
``chain``, ``along`` and ``rebuilt`` build the nodes on one key's path (a new
path, a selected path, a path with one entry replaced) in one call;
``from_levels`` builds a tree of nodes from plain dicts in one call (what
``unflatten_keys`` makes, and the constructor from nested dicts); ``fill`` writes the slots of a
node the constructor made.

The eight result factories build untagged nodes of the root type, whatever
type or metadata they are given (DESIGN 3.1): a node made from leaves has no
inputs whose storages it could compare, so an operation that forgets the tag
rule loses tags instead of keeping false ones. Two factories write tags:
``retagged``, a whole tree, which only the tag rule (:mod:`tdtree._tags`) calls, and
``make_tagged``, one node, which no operation calls (the tests build trees of
mixed tags with it, which no operation makes).

These eleven are the only code that writes ``_data`` and ``_meta``; ``memo`` writes the third
slot, a cache of what the tag rule derives from a node's leaves. Eager code writes them through
the slot descriptors, at about half the cost of ``object.__setattr__`` (which
builds an argument tuple per call); a node is made for every result, so this
is a fixed cost of every operation. Dynamo cannot trace a descriptor's
``__set__``, so each of the eleven has a traced twin, registered with
``torch.compiler.substitute_in_graph`` (through ``_torch_private``, when dynamo is imported), that
compiled code runs instead: it
writes the slots with a literal ``object.__setattr__``, which dynamo traces.
"""

from __future__ import annotations

from bisect import bisect_right as _bisect_right
from collections.abc import Callable, Iterable
from itertools import compress, repeat
from operator import countOf
from typing import Any, ClassVar, TypeVar

import torch

from ._argtypes import TAGGED_TYPES, UNTAGGED_TYPES
from ._torch_private import substitute_in_graph

__all__ = [
    "Node",
    "NodeT",
    "Holder",
    "Layout",
    "layout",
    "NO_TAGS",
    "all_plain",
    "make",
    "from_meta",
    "with_meta",
    "alike",
    "make_tagged",
    "retagged",
    "UNDECIDED",
    "fill",
    "chain",
    "along",
    "rebuilt",
    "from_levels",
    "sorted_data",
    "insertion_point",
    "memo",
    "FEW",
]

NO_TAGS: frozenset = frozenset()

# The number of items from which a loop in C over them (map, all, countOf) costs less than a Python loop
# with its setup; the fast paths for many keys or leaves start there.
FEW = 8


class Node:
    """Base of every node type: the slots, immutability and the pytree hook."""

    # ``_memo``: what is known of the node's leaves (``memo``: the tag rule's storages, the writers' leaf
    # kinds), computed on first use
    __slots__ = ("_data", "_meta", "_memo")
    _tags: ClassVar[frozenset] = frozenset()
    _root: ClassVar[type[Node]]
    _data: dict[str, Any]
    _meta: tuple[tuple[str, ...], torch.Size, torch.device | None, frozenset]
    _memo: tuple[dict[str, Any], dict[Any, Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_tags" in cls.__dict__:
            TAGGED_TYPES.add(cls)
            return  # a tagged variant, made and registered by _pytree.tagged_type
        UNTAGGED_TYPES.add(cls)
        cls._root = cls  # a root type: the module defining it registers it (_pytree.register)

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError(
            f"{type(self).__name__} is immutable: use .set(key, value) or .update(...) for a new node, "
            "or the in-place writers update_() / copy_() / at[idx].set_()"
        )

    def __delattr__(self, name: str) -> None:
        raise TypeError(f"{type(self).__name__} is immutable: use .exclude(key) for a node without it")


# An operation's result is a node of its input's root type (its tags may differ): ``view(td: NodeT) -> NodeT``.
NodeT = TypeVar("NodeT", bound=Node)


class Holder:
    """Base of types that hold a node in ``_td`` and are rebuilt around a new one by ``_wrap(node)``
    (tensorclasses): the tag rule finds their node and puts its decision back through them. What a
    holder adds to its node is its :func:`layout`."""

    __slots__ = ()
    _td: Any
    _static: tuple[tuple[str, Any], ...]

    def _wrap(self, out: Any) -> Any:
        raise NotImplementedError


Layout = tuple[Any, tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]]


def layout(holder: Any) -> Layout:
    """``(class, static pairs, ((field, nested layout), ...))``: with its inner node, the whole holder
    (pickles carry it as is; holders stack or cat only with equal layouts). A nested tensorclass is
    the one kind of holder a field holds."""
    nested = tuple((k, layout(v)) for k in type(holder)._fields if isinstance(v := getattr(holder, k), Holder))
    return type(holder), holder._static, nested


_new = object.__new__
_Tensor = torch.Tensor
# the slot descriptors themselves (``Node._data`` reads the descriptor too, but is typed as the slot's value)
_set_data = vars(Node)["_data"].__set__
_set_meta = vars(Node)["_meta"].__set__
_set_memo = vars(Node)["_memo"].__set__


def _traced(node: Any, data: dict[str, Any], meta: tuple) -> Any:
    """The slot writes as compiled code spells them (the traced twins below share it)."""
    object.__setattr__(node, "_data", data)
    object.__setattr__(node, "_meta", meta)
    return node


def _untagged(meta: tuple) -> tuple:
    return (meta[0], meta[1], meta[2], NO_TAGS)


def make(cls: type[Node], data: dict[str, Any], batch_size: torch.Size, device: torch.device | None) -> Any:
    """An untagged node of ``cls``'s root type from ``data`` already in canonical key order."""
    node = _new(cls._root)
    _set_data(node, data)
    _set_meta(node, (tuple(data), batch_size, device, NO_TAGS))
    return node


@substitute_in_graph(make)
def _make_traced(cls: type[Node], data: dict[str, Any], batch_size: torch.Size, device: torch.device | None) -> Any:
    return _traced(object.__new__(cls._root), data, (tuple(data), batch_size, device, NO_TAGS))


def from_meta(cls: type[Node], meta: tuple, values: Any) -> Any:
    """An untagged node of ``cls``'s root type from pytree metadata (its tags left out) and children:
    the unflatten path."""
    node = _new(cls._root)
    _set_data(node, dict(zip(meta[0], values)))
    _set_meta(node, _untagged(meta) if meta[3] else meta)
    return node


@substitute_in_graph(from_meta)
def _from_meta_traced(cls: type[Node], meta: tuple, values: Any) -> Any:
    return _traced(object.__new__(cls._root), dict(zip(meta[0], values)), _untagged(meta) if meta[3] else meta)


def with_meta(cls: type[Node], data: dict[str, Any], meta: tuple) -> Any:
    """An untagged node of ``cls``'s root type from ``data`` and its metadata ``meta`` (``meta[0]`` is
    ``tuple(data)``; its tags are left out)."""
    node = _new(cls._root)
    _set_data(node, data)
    _set_meta(node, _untagged(meta) if meta[3] else meta)
    return node


@substitute_in_graph(with_meta)
def _with_meta_traced(cls: type[Node], data: dict[str, Any], meta: tuple) -> Any:
    return _traced(object.__new__(cls._root), data, _untagged(meta) if meta[3] else meta)


def alike(cls: type[Node], datas: Iterable[dict[str, Any]], meta: tuple) -> list[Any]:
    """Untagged nodes of ``cls``'s root type, one per dict of ``datas``, all with the metadata ``meta``
    (its tags left out; ``meta[0]`` is the keys of every dict): ``with_meta`` for each in one call. A
    factory call per node costs about what the node's own writes do, and ``unbind`` makes a node per
    index at every level."""
    root = cls._root
    if meta[3]:
        meta = _untagged(meta)
    out = []
    for data in datas:
        node = _new(root)
        _set_data(node, data)
        _set_meta(node, meta)
        out.append(node)
    return out


@substitute_in_graph(alike)
def _alike_traced(cls: type[Node], datas: Iterable[dict[str, Any]], meta: tuple) -> list[Any]:
    root = cls._root
    if meta[3]:
        meta = _untagged(meta)
    return [_traced(object.__new__(root), data, meta) for data in datas]


def make_tagged(cls: type[Node], data: dict[str, Any], meta: tuple) -> Any:
    """A node of the tagged type ``cls`` from ``data`` and ``meta``, whose tags are ``cls._tags``.

    Its sub-nodes are kept as given, whatever their tags: no operation calls it (``retag`` calls
    :func:`retagged`); the tests build trees of mixed tags with it.
    """
    node = _new(cls)
    _set_data(node, data)
    _set_meta(node, meta)
    return node


@substitute_in_graph(make_tagged)
def _make_tagged_traced(cls: type[Node], data: dict[str, Any], meta: tuple) -> Any:
    return _traced(object.__new__(cls), data, meta)


def all_plain(values: Iterable[Any], n: int) -> bool:
    """Whether the ``n`` entries ``values`` are all plain tensors (no sub-node)."""
    if n < FEW:
        for v in values:
            if type(v) is not _Tensor:
                return False
        return True
    return countOf(map(type, values), _Tensor) == n


UNDECIDED = object()  # what retagged returns when only_if answers False

_storage = torch.Tensor.untyped_storage


def _storages(values: Iterable[Any]) -> Iterable[torch.UntypedStorage]:
    """The storages of the tensors among a node's entries ``values`` (a dict view: read twice), in C."""
    return map(_storage, compress(values, map(isinstance, values, repeat(_Tensor))))


def retagged(
    node: Node,
    cls: type[Node],
    tags: frozenset,
    variant: Callable[[type, frozenset], Any],
    depth: int = 0,
    shallow: bool = False,
    only_if: Callable[[Iterable[torch.UntypedStorage]], bool] | None = None,
) -> Any:
    """``node`` with every node of its tree carrying exactly ``tags``, or None when every one already
    does. A node is rebuilt only when it or a node below it changes; leaves and unchanged sub-trees are
    shared. ``cls`` is the type of ``node``'s root type with ``tags`` (the root type itself for none)
    and ``tags`` its ``_tags`` (``NO_TAGS`` for none); ``variant(root, tags)`` gives the type for a
    node of another root type. ``shallow``: the caller has checked that every sub-node of ``node``
    carries exactly ``tags`` (the tag rule, for a result holding its input's own sub-nodes), so they
    are not visited. ``only_if``: asked of the storages of each node's tensors, for every node of the
    tree (the root alone with ``shallow``), before that node is built; when it answers False for one,
    nothing is built and the answer is ``UNDECIDED`` (the tag rule's storage test, made in the walk
    that builds the tagged tree: a caller outside functorch transforms, whose wrappers have no storage
    of their own).

    The tree factory that writes tags: only the tag rule (:mod:`tdtree._tags`) calls it. One
    call for the whole tree, where a factory call per node cost about what the node's own writes do.
    It recurses one frame a level (the common, shallow trees); a sub-tree below ``_DEEP`` levels is
    retagged from an explicit stack, so a tree as deep as a nested dict gets is retagged at any
    recursion depth.
    """
    if depth == _DEEP:
        return _retagged_deep(node, cls, tags, variant, only_if)
    data = node._data
    new = None
    values = data.values()
    # a node of plain tensors alone (a flat node, each level of a nested one) is told by a count in C:
    # no sub-node to visit, and no loop over its leaves
    if shallow or (len(data) >= FEW and all_plain(values, len(data))):
        if only_if is not None and not only_if(_storages(values) if shallow else map(_storage, values)):
            return UNDECIDED
    else:
        # the tensors for only_if, picked here: an isinstance test in C costs more on a sub-node
        tensors: list[torch.Tensor] | None = None if only_if is None else []
        for k, v in data.items():
            if type(v) is _Tensor or not isinstance(v, Node):
                if tensors is not None and isinstance(v, _Tensor):
                    tensors.append(v)
                continue
            out = retagged(v, cls, tags, variant, depth + 1, False, only_if)
            if out is not None:
                if out is UNDECIDED:
                    return out
                if new is None:  # the first changed sub-node: copy the entries once
                    new = data.copy()
                new[k] = out
        if tensors is not None and only_if is not None and not only_if(map(_storage, tensors)):
            return UNDECIDED
    if new is None:
        if type(node)._tags == tags:
            return None
        # a node's entries never change once built, so an unchanged dict is shared, as a shallow clone shares it
        new = data
    return _tagged_copy(node, new, cls, tags, variant)


def _tagged_copy(
    node: Node, data: dict[str, Any], cls: type[Node], tags: frozenset, variant: Callable[[type, frozenset], Any]
) -> Any:
    """``node`` holding ``data``, of the type :func:`retagged` gives it for ``tags``."""
    keys, batch_size, device, _ = node._meta
    kind, own = cls, tags
    if type(node)._root is not cls._root:
        kind = variant(type(node)._root, tags)
        own = kind._tags if tags else tags  # a tagged type's own tags, as cls's are
    out = _new(kind)
    _set_data(out, data)
    _set_meta(out, (keys, batch_size, device, own))
    return out


_DEEP = 64  # levels retagged by recursion before the explicit stack takes over


def _retagged_deep(
    node: Node,
    cls: type[Node],
    tags: frozenset,
    variant: Callable[[type, frozenset], Any],
    only_if: Callable[[Iterable[torch.UntypedStorage]], bool] | None = None,
) -> Any:
    """:func:`retagged` from an explicit stack: the nodes listed parents first, then rebuilt in reverse
    (every sub-node before the node holding it), each as :func:`retagged` rebuilds it."""
    order = [node]
    for n in order:  # the list grows as it is read: every node of the tree, each after its parent
        order.extend(v for v in n._data.values() if type(v) is not _Tensor and isinstance(v, Node))
    done: dict[int, Any] = {}  # id of a node -> its retagged copy, for those that change
    for n in order[::-1]:
        data = n._data
        if only_if is not None and not only_if(_storages(data.values())):
            return UNDECIDED
        new = None
        for k, v in data.items():
            out = done.get(id(v))
            if out is not None:
                if new is None:
                    new = data.copy()
                new[k] = out
        if new is None:
            if type(n)._tags == tags:
                continue
            new = data
        done[id(n)] = _tagged_copy(n, new, cls, tags, variant)
    return done.get(id(node))


@substitute_in_graph(retagged)
def _retagged_traced(
    node: Node,
    cls: type[Node],
    tags: frozenset,
    variant: Callable[[type, frozenset], Any],
    depth: int = 0,
    shallow: bool = False,
    only_if: Callable[[Iterable[torch.UntypedStorage]], bool] | None = None,
) -> Any:
    # compiled, the tag rule is _ruled_traced, which asks no only_if: the storage test is its own
    if only_if is not None:
        return UNDECIDED
    data = node._data
    new = None
    for k, v in () if shallow else data.items():
        if type(v) is _Tensor or not isinstance(v, Node):
            continue
        out = _retagged_traced(v, cls, tags, variant)
        if out is not None:
            if new is None:
                new = data.copy()
            new[k] = out
    if new is None:
        if type(node)._tags == tags:
            return None
        new = data
    keys, batch_size, device, _ = node._meta
    kind, own = cls, tags
    if type(node)._root is not cls._root:
        kind = variant(type(node)._root, tags)
        own = kind._tags if tags else tags
    return _traced(object.__new__(kind), new, (keys, batch_size, device, own))


def memo(node: Node, compute: Callable[[Node], Any]) -> Any:
    """``compute(node)``, worked out on the first call for ``node`` and kept on it for the next ones
    (one value kept for each ``compute``).

    A node never changes, so what is derived from its leaves stays true; the values are kept with the
    ``_data`` dict they were derived from and worked out again if the constructor ever refills the node.
    Eager code only: under ``torch.compile`` the nodes are rebuilt for each call, and their callers
    (the tag rule, the writers' leaf-kind check) ask no memo there.
    """
    data = node._data
    try:
        kept = node._memo
    except AttributeError:  # never asked for this node
        kept = None
    if kept is None or kept[0] is not data:
        kept = (data, {})
        _set_memo(node, kept)
    known = kept[1]
    try:
        return known[compute]
    except KeyError:
        value = known[compute] = compute(node)
        return value


def fill(node: Node, data: dict[str, Any], meta: tuple) -> None:
    """Write the slots of ``node``, made by its type's constructor."""
    _set_data(node, data)
    _set_meta(node, meta)


@substitute_in_graph(fill)
def _fill_traced(node: Node, data: dict[str, Any], meta: tuple) -> None:
    _traced(node, data, meta)


def chain(
    cls: type[Node], path: tuple[str, ...], value: Any, batch_size: torch.Size, device: torch.device | None
) -> Any:
    """Untagged nodes of ``cls``'s root type, one per part of ``path``, each holding the next under
    its part and the last holding ``value``; all with ``batch_size`` and ``device``. What a ``set``
    below a missing key makes, built bottom up in one call (a factory call per level costs more than
    the level's own writes)."""
    root = cls._root
    # a reversed slice, not reversed(): dynamo traces reversed() through a polyfill iterator and guards on it
    for part in path[::-1]:
        node = _new(root)
        _set_data(node, {part: value})
        _set_meta(node, ((part,), batch_size, device, NO_TAGS))
        value = node
    return value


@substitute_in_graph(chain)
def _chain_traced(
    cls: type[Node], path: tuple[str, ...], value: Any, batch_size: torch.Size, device: torch.device | None
) -> Any:
    root = cls._root
    for part in path[::-1]:
        value = _traced(object.__new__(root), {part: value}, ((part,), batch_size, device, NO_TAGS))
    return value


def along(levels: list[Node], path: tuple[str, ...], value: Any) -> Any:
    """For ``levels``, the nodes ``path`` goes through from the top: an untagged node per level, of
    its root type, batch size and device, holding only the next under its part of ``path``; the
    deepest holds ``value``. What selecting one nested key makes, built bottom up in one call."""
    for part, level in zip(path[len(levels) - 1 :: -1], levels[::-1]):
        meta = level._meta
        node = _new(type(level)._root)
        _set_data(node, {part: value})
        _set_meta(node, ((part,), meta[1], meta[2], NO_TAGS))
        value = node
    return value


@substitute_in_graph(along)
def _along_traced(levels: list[Node], path: tuple[str, ...], value: Any) -> Any:
    for part, level in zip(path[len(levels) - 1 :: -1], levels[::-1]):
        meta = level._meta
        value = _traced(object.__new__(type(level)._root), {part: value}, ((part,), meta[1], meta[2], NO_TAGS))
    return value


def rebuilt(levels: list[Node], path: tuple[str, ...], child: Any) -> Any:
    """``levels[0]`` with ``child`` in place of the entry at ``path[: len(levels)]``, ``levels`` being the
    nodes that path goes through: each level copied untagged with its own metadata (its keys stay the
    same); ``child`` itself when ``levels`` is empty."""
    for part, level in zip(path[len(levels) - 1 :: -1], levels[::-1]):
        data = level._data.copy()
        data[part] = child
        meta = level._meta
        child = _new(type(level)._root)
        _set_data(child, data)
        _set_meta(child, _untagged(meta) if meta[3] else meta)
    return child


@substitute_in_graph(rebuilt)
def _rebuilt_traced(levels: list[Node], path: tuple[str, ...], child: Any) -> Any:
    for part, level in zip(path[len(levels) - 1 :: -1], levels[::-1]):
        data = level._data.copy()
        data[part] = child
        meta = level._meta
        child = _traced(object.__new__(type(level)._root), data, _untagged(meta) if meta[3] else meta)
    return child


def from_levels(cls: type[Node], levels: list[tuple[Any, ...]]) -> Any:
    """Untagged nodes of ``cls``'s root type from plain dicts, one per level of ``levels``: each
    ``(data, parent, name, batch_size, device)``, listed after the level whose dict ``parent`` holds it
    under ``name``; the first, the top, has none. Built bottom up, each put in its parent's dict in place
    of its own (the dicts are the caller's, made for this), its keys put in canonical order; returns
    the node of the first level (several tops, each with a parent, are built in place). What
    unflattening keys makes, and the constructor from nested dicts, in one call (a factory call per
    level costs about what the level's own writes do)."""
    root = cls._root
    node = None
    for data, parent, name, batch_size, device in levels[::-1]:
        keys = tuple(data)
        # A level made from dotted keys holds them in the order of the joined keys, which differs from
        # its own only where a key has a character that sorts before the separator. Two keys (each
        # level of a deep key) are compared as they are: a sort costs several times that.
        if len(keys) == 2:
            if keys[1] < keys[0]:
                first, second = keys = (keys[1], keys[0])
                data = {first: data[first], second: data[second]}  # a display: a comprehension costs a frame
        elif len(keys) > 2 and keys != (order := tuple(sorted(keys))):
            data, keys = {k: data[k] for k in order}, order
        node = _new(root)
        _set_data(node, data)
        _set_meta(node, (keys, batch_size, device, NO_TAGS))
        if parent is not None:
            parent[name] = node
    return node


@substitute_in_graph(from_levels)
def _from_levels_traced(cls: type[Node], levels: list[tuple[Any, ...]]) -> Any:
    root = cls._root
    node = None
    for data, parent, name, batch_size, device in levels[::-1]:
        data = sorted_data(data)
        node = _traced(object.__new__(root), data, (tuple(data), batch_size, device, NO_TAGS))
        if parent is not None:
            parent[name] = node
    return node


def insertion_point(order: tuple[str, ...], key: str) -> int:
    """Where ``key`` goes in the sorted key tuple ``order``: the index of the first key after it."""
    return _bisect_right(order, key)


@substitute_in_graph(insertion_point)
def _insertion_point_traced(order: tuple[str, ...], key: str) -> int:
    # dynamo cannot trace the C bisect; the keys are constants while tracing, so this loop leaves
    # nothing in the graph
    for i, k in enumerate(order):
        if k > key:
            return i
    return len(order)


def sorted_data(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` in canonical key order (returned as is when already sorted)."""
    keys = list(data)
    if keys == sorted(keys):
        return data
    return {k: data[k] for k in sorted(keys)}
