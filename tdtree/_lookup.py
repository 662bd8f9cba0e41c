"""Reading a node by key: lookup, membership, the key views, the walk every traversal shares, and
select / exclude, which give a node of entries already there.

Nothing here takes a value in: a result holds the node's own leaves and sub-nodes, so nothing is
validated again. The editors that take values in are in :mod:`tdtree._keyops`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, KeysView
from itertools import repeat
from operator import is_
from typing import Any

from ._base import FEW, NO_TAGS, Node, NodeT, along, make, rebuilt, sorted_data, with_meta
from ._keys import NestedKey, as_path, display
from ._tags import tag_rule
from .errors import KeyNotFoundError, NotANodeKeyError

__all__ = [
    "MISSING",
    "not_found",
    "get",
    "contains",
    "walk",
    "walk_keys",
    "keys",
    "values",
    "items",
    "select",
    "exclude",
    "without",
    "path_nodes",
    "to_dict",
]

MISSING: Any = object()
_ABSENT: Any = object()
_ALL = object()


def not_found(path: tuple[str, ...], depth: int, level: Node) -> KeyNotFoundError:
    """The error for ``path[depth]`` missing from ``level`` (the node at ``path[:depth]``), listing its keys."""
    return KeyNotFoundError(display(path), [display((*path[:depth], k)) for k in level._data])


def get(node: Node, key: NestedKey, default: Any = MISSING) -> Any:
    """The entry at ``key``: a leaf, or a sub-node as it is stored (the same object, tags and all).

    Args:
        node: The node (``self`` as a method).
        key: A str, or a non-empty tuple of str for a nested key (``"a"`` and ``("a",)`` are the same).
        default: Returned when no entry is at ``key``; without it, a missing key raises.

    Returns:
        The stored tensor or sub-node itself (no copy), else ``default``.

    Raises:
        TypeError: ``key`` is not a str or a non-empty tuple of str (even with a ``default``).
        KeyNotFoundError: no entry at ``key`` and no ``default``; the message lists the keys there.
        NotANodeKeyError: a part of ``key`` before the last names a leaf, and no ``default``.
    """
    # One walk that checks as it goes (each part an exact str, each value on the way a node), with
    # the lookup a plain subscript: checking the whole key with as_path first, then walking with
    # dict.get, cost three times a chain of dict lookups on a deep key. Any stop (a part that is not
    # a str, a leaf on the way, a missing key, no key at all) goes to as_path and _missing below,
    # which raise the exact error, so the walk only has to be right when it finishes.
    value: Any = node
    if type(key) is tuple and key:
        try:
            for part in key:
                if type(part) is not str or not isinstance(value, Node):
                    break
                value = value._data[part]
            else:
                return value
        except KeyError:
            pass
    elif type(key) is str:
        value = node._data.get(key, MISSING)
        if value is not MISSING:
            return value
    path = as_path(key)
    if default is not MISSING:
        return default
    raise _missing(node, path)


def _missing(node: Node, path: tuple[str, ...]) -> KeyError:
    """The error for a ``path`` that does not lead to an entry: where the walk stopped, and why."""
    value: Any = node
    for depth, part in enumerate(path):
        if not isinstance(value, Node):
            return NotANodeKeyError(display(path), display(path[:depth]))
        level = value
        value = level._data.get(part, MISSING)
        if value is MISSING:
            return not_found(path, depth, level)
    raise AssertionError(f"{display(path)!r} leads to an entry: get() asks for an error only when it does not")


def contains(node: Node, key: object) -> bool:
    """True when ``key`` names an entry (a leaf or a sub-node)."""
    if type(key) is str:
        return key in node._data
    return type(key) is tuple and len(key) > 0 and get(node, key, _ABSENT) is not _ABSENT


def walk(node: Node, include_nested: bool, leaves_only: bool) -> list[tuple[NestedKey, Any]]:
    """(key, value) pairs depth first in canonical order, a sub-node's key before its children's."""
    out: list[Any] = []
    _visit(node, include_nested, leaves_only, False, out)
    return out


def walk_keys(node: Node, include_nested: bool, leaves_only: bool) -> list[NestedKey]:
    """The keys of :func:`walk` alone, in its order: no (key, value) pair is built to be taken apart."""
    out: list[Any] = []
    _visit(node, include_nested, leaves_only, True, out)
    return out


def _visit(node: Node, nested: bool, leaves: bool, keys_only: bool, out: list[Any]) -> None:
    # From an explicit stack of the levels above, not by recursion: a node is as deep as a nested dict
    # gets, at any recursion depth of the caller.
    prefix: tuple[str, ...] = ()
    items = iter(node._data.items())
    above = []  # (prefix, items) of the levels above, each where it left off
    while True:
        for k, v in items:
            # prefix + (k,) is one new tuple ((*prefix, k) builds a list and copies it); a top-level key is
            # its str, spelled where it is appended (a local holding it cost more)
            path = prefix + (k,)
            if isinstance(v, Node):
                if not leaves:
                    out.append((path if prefix else k) if keys_only else (path if prefix else k, v))
                if nested:
                    above.append((prefix, items))
                    prefix, items = path, iter(v._data.items())
                    break
            else:
                out.append((path if prefix else k) if keys_only else (path if prefix else k, v))
        else:
            if not above:
                return
            prefix, items = above.pop()


class NestedKeysView(KeysView):
    """The keys of a node as a set-like view; membership is a lookup, not a walk."""

    __slots__ = ("_node", "_nested", "_leaves", "_keys")

    def __init__(self, node: Node, include_nested: bool, leaves_only: bool) -> None:
        self._node, self._nested, self._leaves = node, include_nested, leaves_only
        self._keys: list[NestedKey] | None = None

    def _list(self) -> list[NestedKey]:
        if self._keys is None:
            self._keys = walk_keys(self._node, self._nested, self._leaves)
        return self._keys

    def __contains__(self, key: object) -> bool:
        if type(key) is tuple and len(key) > 1 and not self._nested:
            return False
        value: Any = _ABSENT
        if type(key) is str or (type(key) is tuple and key):
            # A key missing at the top, the common miss, is told by one test: get() finds a miss by
            # a subscript's KeyError, which costs more than the rest of the call.
            head = key if type(key) is str else key[0]
            if type(head) is str and head not in self._node._data:
                as_path(key)  # a key with a part that is not a str raises TypeError, as get() does
                return False
            value = get(self._node, key, _ABSENT)
        return value is not _ABSENT and not (self._leaves and isinstance(value, Node))

    def __iter__(self) -> Iterator[NestedKey]:
        return iter(self._list())

    def __len__(self) -> int:
        return len(self._list())

    def __repr__(self) -> str:
        return f"NestedKeysView({self._list()!r})"


def keys(node: Node, include_nested: bool = False, leaves_only: bool = False) -> KeysView[NestedKey]:
    """The node's keys in canonical order: sorted at each level, a sub-node's key before its children's.

    Args:
        node: The node (``self`` as a method).
        include_nested: Also the keys below sub-nodes, as tuples (``("a", "b")``).
        leaves_only: Leave out the keys of sub-nodes (only keys of leaves).

    Returns:
        A set-like view; membership (``key in view``) is a lookup, not a walk. With neither flag it is
        the node's own ``dict`` view of its top-level str keys.
    """
    if not include_nested and not leaves_only:
        return node._data.keys()
    return NestedKeysView(node, include_nested, leaves_only)


def values(node: Node, include_nested: bool = False, leaves_only: bool = False) -> Collection[Any]:
    """The node's entries in the order of :func:`keys` with the same flags.

    Args:
        node: The node (``self`` as a method).
        include_nested: Also the entries below sub-nodes.
        leaves_only: Leave out the sub-nodes (only tensors).

    Returns:
        The stored tensors and sub-nodes themselves (no copies; sub-nodes keep their tags).
    """
    if not include_nested and not leaves_only:
        return node._data.values()
    return [v for _, v in walk(node, include_nested, leaves_only)]


def items(node: Node, include_nested: bool = False, leaves_only: bool = False) -> Collection[tuple[NestedKey, Any]]:
    """``(key, entry)`` pairs in the order of :func:`keys` with the same flags.

    Args:
        node: The node (``self`` as a method).
        include_nested: Also the entries below sub-nodes, keyed by tuples.
        leaves_only: Leave out the sub-nodes (only tensors).

    Returns:
        Pairs of each key and the stored tensor or sub-node itself (no copies; sub-nodes keep their tags).
    """
    if not include_nested and not leaves_only:
        return node._data.items()
    return walk(node, include_nested, leaves_only)


def _trie(paths: tuple[Any, ...]) -> dict[str, Any]:
    """The paths as a trie: nested dicts of keys, ``_ALL`` where a whole entry is named. A path is a
    checked tuple of str or a key (a str is told inline, a nested key checked by ``as_path``)."""
    trie: dict[str, Any] = {}
    for path in paths:
        if type(path) is str:  # a top-level key names its whole entry: no tuple to make and walk
            trie[path] = _ALL
            continue
        if type(path) is tuple and len(path) == 2:  # the common nested key, without the walk's slice and loop
            head, last = path
            if type(head) is str and type(last) is str:
                nxt = trie.get(head)
                if nxt is None:
                    trie[head] = {last: _ALL}
                elif nxt is not _ALL:
                    nxt[last] = _ALL
                continue
        if type(path) is not tuple or not path:
            as_path(path)  # raises TypeError naming it
        # each part checked as it is walked (as_path's own loop, without a call per key)
        level = trie
        for part in path[:-1]:
            if type(part) is not str:
                as_path(path)
            nxt = level.get(part)
            if nxt is _ALL:
                break
            if nxt is None:
                nxt = level[part] = {}
            level = nxt
        else:
            last = path[-1]
            if type(last) is not str:
                as_path(path)
            level[last] = _ALL
    return trie


# Where a trie walk is: () at the root, else (where its parent is, key). One pair per level, where
# the path itself would copy the whole prefix at every level (a tenth of a deep select or exclude);
# only an error spells it out.
_Trail = tuple


def _trie_error(trail: _Trail, k: str, sub: Any, level: Node) -> KeyError:
    """The error for the trie's key ``k`` at ``level``: missing there, or a leaf with keys asked below it."""
    parts = [k]
    while trail:
        trail, parent = trail
        parts.append(parent)
    path = tuple(parts[::-1])
    if k not in level._data:
        return not_found(path, len(path) - 1, level)
    return NotANodeKeyError(display((*path, next(iter(sub)))), display(path))


def _select(node: NodeT, trie: dict[str, Any], strict: bool, trail: _Trail) -> NodeT:
    _, batch_size, device, _ = node._meta
    if len(trie) >= FEW and all(map(is_, trie.values(), repeat(_ALL))):
        # whole entries alone (the last level of nested keys): picked at once; a missing key takes the
        # loop below, which passes over it or names it
        entries = node._data
        try:
            data = {k: entries[k] for k in sorted(trie)}
        except KeyError:
            pass
        else:
            return make(type(node), data, batch_size, device)
    data = {}
    for k, sub in trie.items():
        v = node._data.get(k, MISSING)
        if v is MISSING:
            if strict:
                raise _trie_error(trail, k, sub, node)
            continue
        if sub is _ALL:
            data[k] = v
        elif isinstance(v, Node):
            data[k] = _select(v, sub, strict, (trail, k))
        elif strict:
            raise _trie_error(trail, k, sub, node)
    # one key is in order: a deep key selects one key per level, and sorting them was a fifth of select
    return make(type(node), sorted_data(data) if len(data) > 1 else data, batch_size, device)


def path_nodes(node: Node, path: tuple[Any, ...]) -> list[Node] | None:
    """The nodes ``path`` goes through, from ``node`` to the one holding its last part, when ``path`` is a
    non-empty tuple of str naming an entry; else None (the caller raises or skips the key)."""
    levels = []
    level: Any = node
    for part in path:
        if type(part) is not str or not isinstance(level, Node):
            return None
        levels.append(level)
        level = level._data.get(part, MISSING)
        if level is MISSING:
            return None
    return levels or None


def _select_one(node: NodeT, key: Any) -> NodeT | None:
    """``select(node, key)`` for one key naming an entry: one new node per level, each holding only
    the next (no trie to build, nothing to sort); None for anything else."""
    if type(key) is str:
        value = node._data.get(key, MISSING)
        if value is MISSING:
            return None
        _, batch_size, device, _ = node._meta
        return with_meta(type(node), {key: value}, ((key,), batch_size, device, NO_TAGS))
    if type(key) is not tuple:
        return None
    levels = path_nodes(node, key)
    if levels is None:
        return None
    return along(levels, key, levels[-1]._data[key[-1]])


@tag_rule
def select(node: NodeT, *keys: NestedKey, strict: bool = True) -> NodeT:
    """A node with only the entries at ``keys``, and the sub-nodes on the way to them.

    Args:
        node: The node (``self`` as a method).
        *keys: Keys (str or tuples of str) to keep. A key keeps its whole entry, so ``"a"`` together
            with ``("a", "b")`` keeps all of ``"a"``. No keys: an empty node with this batch size.
        strict: When False, keys that name no entry are passed over.

    Returns:
        A new node of the same root type, batch size and device. The leaves and the selected sub-nodes
        are the same objects; only the nodes on the path to a nested key are new, each with its own
        level's batch size. Tags are kept (no data is made), as the rule keeps them.

    Raises:
        TypeError: a key is not a str or a non-empty tuple of str.
        KeyNotFoundError: ``strict`` and a key names no entry (the message lists the keys there).
        NotANodeKeyError: ``strict`` and a part of a key before the last names a leaf.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2), "c": torch.ones(2)}}, [2]).lock()
    >>> s = td.select(("n", "b"))
    >>> list(s.keys(include_nested=True)), s["n", "b"] is td["n", "b"], s.tags == td.tags
    (['n', ('n', 'b')], True, True)
    """
    if len(keys) == 1:
        out = _select_one(node, keys[0])
        if out is not None:
            return out
    if not keys:
        return make(type(node), {}, node._meta[1], node._meta[2])
    _, batch_size, device, _ = node._meta
    if type(keys[0]) is str:
        # Top-level keys, the common many-key select: picked in sorted order (timsort takes keys given
        # sorted in one pass), with no trie to build. Anything else (a nested or missing key, a key that
        # is not a str) fails the sort or the lookup and takes the general path, which names it.
        data = node._data
        names: Any = keys  # str keys, unless the sort or a lookup fails
        try:
            picked = {k: data[k] for k in sorted(names)}
        except (KeyError, TypeError):
            pass
        else:
            if all(map(is_, map(type, picked), repeat(str))):  # a str subclass is no key: as_path refuses it
                return make(type(node), picked, batch_size, device)
    return _select(node, _trie(keys), strict, ())


def _exclude(node: NodeT, trie: dict[str, Any], strict: bool, trail: _Trail) -> NodeT:
    data = node._data.copy()
    for k, sub in trie.items():
        v = data.get(k, MISSING)
        if v is MISSING:
            if strict:
                raise _trie_error(trail, k, sub, node)
            continue
        if sub is _ALL:
            del data[k]
        elif isinstance(v, Node):
            data[k] = _exclude(v, sub, strict, (trail, k))
        elif strict:
            raise _trie_error(trail, k, sub, node)
    _, batch_size, device, _ = node._meta
    return make(type(node), data, batch_size, device)


def _exclude_one(node: NodeT, key: Any) -> NodeT | None:
    """``exclude(node, key)`` for one key naming an entry: the nodes on its path copied, each but the last
    with its own metadata; None for anything else."""
    path = (key,) if type(key) is str else key
    levels = path_nodes(node, path) if type(path) is tuple else None
    if levels is None:
        return None
    bottom = levels[-1]
    data = bottom._data.copy()
    del data[path[-1]]
    _, batch_size, device, _ = bottom._meta
    return rebuilt(levels[:-1], path, with_meta(type(bottom), data, (tuple(data), batch_size, device, NO_TAGS)))


@tag_rule
def exclude(node: NodeT, *keys: NestedKey, strict: bool = True) -> NodeT:
    """A node without the entries at ``keys``.

    Args:
        node: The node (``self`` as a method).
        *keys: Keys (str or tuples of str) to drop, each with everything below it. Sub-nodes left
            empty are kept as empty entries.
        strict: When False, keys that name no entry are passed over.

    Returns:
        A new node of the same root type, batch size and device. Every other leaf and untouched
        sub-node is the same object; only the nodes on the path to a dropped key are new. Tags are
        kept (no data is made), as the rule keeps them.

    Raises:
        TypeError: a key is not a str or a non-empty tuple of str.
        KeyNotFoundError: ``strict`` and a key names no entry (the message lists the keys there).
        NotANodeKeyError: ``strict`` and a part of a key before the last names a leaf.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, [2])
    >>> e = td.exclude(("n", "b"))  # "n" is kept, empty
    >>> list(e.keys(include_nested=True)), e["a"] is td["a"]
    (['a', 'n'], True)
    """
    if len(keys) == 1:
        out = _exclude_one(node, keys[0])
        if out is not None:
            return out
    elif keys and type(keys[0]) is str:
        # top-level keys, each named once: deleted from a copy of the node's dict, which stays in
        # canonical order. Anything else (a nested, missing or repeated key, a key that is not a str)
        # fails a deletion and takes the general path, which names it.
        data = node._data.copy()
        names: Any = keys  # str keys, unless a deletion fails
        try:
            for k in names:
                del data[k]
        except (KeyError, TypeError):
            pass
        else:
            if all(map(is_, map(type, keys), repeat(str))):  # a str subclass is no key: as_path refuses it
                _, batch_size, device, _ = node._meta
                return make(type(node), data, batch_size, device)
    return _exclude(node, _trie(keys), strict, ())


def without(node: NodeT, paths: list[tuple[str, ...]]) -> NodeT:
    """``node`` without the entries at ``paths`` (checked by ``as_path``), those missing passed over:
    built untagged, for an editor whose own rule decides the tags (``rename``)."""
    if len(paths) == 1:
        out = _exclude_one(node, paths[0])
        if out is not None:
            return out
    return _exclude(node, _trie(tuple(paths)), False, ())


def to_dict(node: Node) -> dict[str, Any]:
    """Nested plain dicts of the node's tensors (the same tensor objects)."""
    out: dict[str, Any] = {}
    todo = [(node, out)]  # an explicit stack, as _visit walks: any depth a nested dict gets
    while todo:
        level, into = todo.pop()
        for k, v in level._data.items():
            if isinstance(v, Node):
                sub: dict[str, Any] = {}
                into[k] = sub
                todo.append((v, sub))
            else:
                into[k] = v
    return out
