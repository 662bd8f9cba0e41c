"""Operations on keys: lookup, the functional editors, select/exclude, flatten/unflatten.

Every function takes a node and returns a new one (or a lookup result); the
editors copy only the path to what they change, reusing every other sub-node
and tensor.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, KeysView, Mapping
from typing import Any

import torch

from ._base import NO_TAGS, Node, NodeT, make, sorted_data, with_meta
from ._keys import NestedKey, as_path, display
from ._tags import Locked, retag, tag_rule
from ._validate import as_batch_size, as_device, build, entry, nest, settle_device
from .errors import BatchSizeError, KeyCollisionError, KeyNotFoundError, LockedError, NotANodeKeyError

__all__ = [
    "MISSING",
    "check_unlocked",
    "check_unlocked_tree",
    "get",
    "contains",
    "walk",
    "keys",
    "values",
    "items",
    "set_entry",
    "set_path",
    "setdefault",
    "update",
    "select",
    "exclude",
    "exclude_paths",
    "rename",
    "flatten_keys",
    "unflatten_keys",
    "to_dict",
    "from_dict",
]

MISSING: Any = object()
_ABSENT: Any = object()
_ALL = object()


def check_unlocked(node: Node, op: str, path: tuple[str, ...] = ()) -> None:
    """Raise LockedError naming ``op`` (and ``path``, the node's key below the root edited) when
    ``node`` is Locked."""
    tags = node._meta[3]
    if tags and Locked in tags:
        raise LockedError(op, display(path) if path else None)


def check_unlocked_tree(node: Node, op: str, path: tuple[str, ...] = ()) -> None:
    """:func:`check_unlocked` for ``node`` and every sub-node of it (an editor that rebuilds them all)."""
    check_unlocked(node, op, path)
    for k, v in node._data.items():
        if isinstance(v, Node):
            check_unlocked_tree(v, op, (*path, k))


def _check_path_unlocked(node: Node, path: tuple[str, ...], op: str) -> None:
    """:func:`check_unlocked` for ``node`` and each sub-node ``path`` goes through (the nodes an edit at
    ``path`` rebuilds)."""
    check_unlocked(node, op)
    level: Any = node
    for depth, part in enumerate(path[:-1]):
        level = level._data.get(part)
        if not isinstance(level, Node):
            return
        check_unlocked(level, op, path[: depth + 1])


def _not_found(path: tuple[str, ...], depth: int, level: Node) -> KeyNotFoundError:
    return KeyNotFoundError(display(path), [display((*path[:depth], k)) for k in level._data])


def get(node: Node, key: NestedKey, default: Any = MISSING) -> Any:
    """The entry at ``key`` (str or tuple of str); ``default`` when missing, else KeyNotFoundError."""
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
            return _not_found(path, depth, level)
    raise AssertionError(f"{display(path)!r} leads to an entry: get() asks for an error only when it does not")


def contains(node: Node, key: object) -> bool:
    """True when ``key`` names an entry (a leaf or a sub-node)."""
    if type(key) is str:
        return key in node._data
    return type(key) is tuple and len(key) > 0 and get(node, key, _ABSENT) is not _ABSENT


def walk(node: Node, include_nested: bool, leaves_only: bool) -> list[tuple[NestedKey, Any]]:
    """(key, value) pairs depth first in canonical order, a sub-node's key before its children's."""
    out: list[tuple[NestedKey, Any]] = []

    def visit(level: Node, prefix: tuple[str, ...]) -> None:
        for k, v in level._data.items():
            # prefix + (k,) is one new tuple ((*prefix, k) builds a list and copies it); a top-level key is
            # its str, spelled where it is appended (a local holding it cost more)
            path = prefix + (k,)
            if isinstance(v, Node):
                if not leaves_only:
                    out.append((path if prefix else k, v))
                if include_nested:
                    visit(v, path)
            else:
                out.append((path if prefix else k, v))

    visit(node, ())
    return out


class NestedKeysView(KeysView):
    """The keys of a node as a set-like view; membership is a lookup, not a walk."""

    __slots__ = ("_node", "_nested", "_leaves", "_keys")

    def __init__(self, node: Node, include_nested: bool, leaves_only: bool) -> None:
        self._node, self._nested, self._leaves = node, include_nested, leaves_only
        self._keys: list[NestedKey] | None = None

    def _list(self) -> list[NestedKey]:
        if self._keys is None:
            self._keys = [k for k, _ in walk(self._node, self._nested, self._leaves)]
        return self._keys

    def __contains__(self, key: object) -> bool:
        if type(key) is tuple and len(key) > 1 and not self._nested:
            return False
        value = get(self._node, key, _ABSENT) if (type(key) is str or type(key) is tuple) and key else _ABSENT
        return value is not _ABSENT and not (self._leaves and isinstance(value, Node))

    def __iter__(self) -> Iterator[NestedKey]:
        return iter(self._list())

    def __len__(self) -> int:
        return len(self._list())

    def __repr__(self) -> str:
        return f"NestedKeysView({self._list()!r})"


def keys(node: Node, include_nested: bool = False, leaves_only: bool = False) -> KeysView[NestedKey]:
    """Keys in canonical order; nested ones as tuples, a sub-node's key before its children's."""
    if not include_nested and not leaves_only:
        return node._data.keys()
    return NestedKeysView(node, include_nested, leaves_only)


def values(node: Node, include_nested: bool = False, leaves_only: bool = False) -> Collection[Any]:
    """Values in the order of :meth:`keys` with the same flags."""
    if not include_nested and not leaves_only:
        return node._data.values()
    return [v for _, v in walk(node, include_nested, leaves_only)]


def items(node: Node, include_nested: bool = False, leaves_only: bool = False) -> Collection[tuple[NestedKey, Any]]:
    """(key, value) pairs in the order of :meth:`keys` with the same flags."""
    if not include_nested and not leaves_only:
        return node._data.items()
    return walk(node, include_nested, leaves_only)


def _set_path(node: NodeT, path: tuple[str, ...], full: tuple[str, ...], value: Any, op: str) -> NodeT:
    """``node`` (at ``full[:-len(path)]`` below the root edited) with ``value`` at ``path``: the nodes on
    the path rebuilt, each refused with LockedError naming ``op`` when Locked."""
    head = path[0]
    old = node._data
    _, batch_size, device, tags = node._meta
    if tags and Locked in tags:
        depth = len(full) - len(path)
        raise LockedError(op, display(full[:depth]) if depth else None)
    new = old.copy()  # not dict(old): dynamo traces that through a polyfill that adds guards
    if len(path) == 1:
        new[head] = entry(full, value, batch_size, device, type(node)._root)
    else:
        child = old.get(head)
        if child is None:
            new[head] = _chain(type(node), path[1:], full, value, batch_size, device)
        elif not isinstance(child, Node):
            depth = len(full) - len(path) + 1
            raise KeyCollisionError(f"cannot set {display(full)!r}: {display(full[:depth])!r} is a tensor, not a node")
        else:
            new[head] = _set_path(child, path[1:], full, value, op)
    keys = node._meta[0]
    if head not in old and keys and head < keys[-1]:
        # A new key before the last one went in last: moving the keys after it behind it, in their
        # (sorted) order, restores canonical order without sorting and rebuilding the whole dict.
        for k in keys:
            if k > head:
                new[k] = new.pop(k)
    if device is None:  # with a device, entry() moved the value there: nothing to settle
        new, device = settle_device(new, device)
    return make(type(node), new, batch_size, device)


def _chain(
    cls: type[Node],
    path: tuple[str, ...],
    full: tuple[str, ...],
    value: Any,
    batch_size: torch.Size,
    device: torch.device | None,
) -> Node:
    """New nodes, one per part of ``path``, holding ``value`` at its end: what ``_set_path`` makes below
    a missing key, built bottom up with one key per node (already sorted, the device found once)."""
    data = {path[-1]: entry(full, value, batch_size, device, cls._root)}
    # the parent's device, else the one settle_device finds for the value (the same at every level);
    # with a device, entry() moved the value there: nothing to settle
    dev = device
    if device is None:
        data, dev = settle_device(data, device)
    node: Any = data[path[-1]]
    untagged = NO_TAGS  # a local: read once per level
    # a reversed slice, not reversed(): dynamo traces reversed() through a polyfill iterator and guards on it
    for part in path[::-1]:
        node = with_meta(cls, {part: node}, ((part,), batch_size, dev, untagged))
    return node


@tag_rule
def set_entry(node: NodeT, key: NestedKey, value: Any) -> NodeT:
    """A new node with ``value`` at ``key``; missing intermediate nodes are created.

    Refused on a Locked node, or one whose sub-node on the path to ``key`` is
    Locked (LockedError naming it). Tags: kept only when ``value`` uses a storage
    the node already used (the rule); a node given as ``value`` is put in untagged
    and the rule decides the whole result.
    """
    path = as_path(key)
    return _set_path(node, path, path, value, "set")


@tag_rule
def set_path(node: NodeT, path: tuple[str, ...], value: Any) -> NodeT:
    """:func:`set_entry` for a ``path`` already checked by ``as_path`` (a module's out key): the same
    node, tags and errors.
    """
    return _set_path(node, path, path, value, "set")


@tag_rule
def setdefault(node: NodeT, key: NestedKey, default: Any) -> NodeT:
    """The node itself when ``key`` exists, else ``set(key, default)``. Refused on a Locked node."""
    check_unlocked(node, "setdefault")
    path = as_path(key)
    if get(node, path, _ABSENT) is not _ABSENT:
        return node
    return _set_path(node, path, path, default, "setdefault")


def _update(node: NodeT, source: Mapping[str, Any] | Node, prefix: tuple[str, ...]) -> NodeT:
    old = node._data
    _, batch_size, device, tags = node._meta
    if tags:
        check_unlocked(node, "update", prefix)
    # A node with this batch size and device was checked against both when it was built (and holds
    # untagged sub-nodes): its entries fit as they are, so entry() would find nothing to do.
    trusted = False
    if isinstance(source, Node):
        trusted = source._meta[1] == batch_size and source._meta[2] == device
        source = source._data
    new = old.copy()
    for k, v in source.items():
        current = old.get(k)
        if isinstance(current, Node) and isinstance(v, (Node, Mapping)):
            new[k] = _update(current, v if isinstance(v, Node) else nest(v), (*prefix, k))
        elif trusted:
            # a sub-node goes in untagged, as entry() puts it (the rule decides the result's tags)
            new[k] = retag(v, NO_TAGS) if isinstance(v, Node) else v
        else:
            new[k] = entry((*prefix, k), v, batch_size, device, type(node)._root)
    new, device = settle_device(sorted_data(new), device)
    return make(type(node), new, batch_size, device)


@tag_rule
def update(node: NodeT, other: Mapping[Any, Any] | Node) -> NodeT:
    """A new node with the entries of ``other`` set; nested mappings merge into existing sub-nodes.

    Refused on a Locked node, or one with a Locked sub-node that a nested mapping merges into
    (LockedError naming it). Tags follow the rule, with the nodes in ``other`` among its inputs.
    """
    return _update(node, other if isinstance(other, Node) else nest(other), ())


def _trie(paths: tuple[Any, ...]) -> dict[str, Any]:
    """The paths as a trie: nested dicts of keys, ``_ALL`` where a whole entry is named. A path is a
    checked tuple of str or a key (a str is told inline, a nested key checked by ``as_path``)."""
    trie: dict[str, Any] = {}
    for path in paths:
        if type(path) is str:  # a top-level key names its whole entry: no tuple to make and walk
            trie[path] = _ALL
            continue
        path = as_path(path)
        level = trie
        for part in path[:-1]:
            nxt = level.get(part)
            if nxt is _ALL:
                break
            if nxt is None:
                nxt = level[part] = {}
            level = nxt
        else:
            level[path[-1]] = _ALL
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
        return _not_found(path, len(path) - 1, level)
    return NotANodeKeyError(display((*path, next(iter(sub)))), display(path))


def _select(node: NodeT, trie: dict[str, Any], strict: bool, trail: _Trail) -> NodeT:
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
    _, batch_size, device, _ = node._meta
    # one key is in order: a deep key selects one key per level, and sorting them was a fifth of select
    return make(type(node), sorted_data(data) if len(data) > 1 else data, batch_size, device)


@tag_rule
def select(node: NodeT, *keys: NestedKey, strict: bool = True) -> NodeT:
    """A node with only ``keys`` (a union: a key and its sub-keys keep the whole key).

    Missing keys raise KeyNotFoundError when ``strict``, else are ignored.
    Tags are kept (no data is made).
    """
    if not keys:
        return make(type(node), {}, node._meta[1], node._meta[2])
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


@tag_rule
def exclude(node: NodeT, *keys: NestedKey, strict: bool = True) -> NodeT:
    """A node without ``keys``; sub-nodes left empty are kept. Tags are kept."""
    return _exclude(node, _trie(keys), strict, ())


@tag_rule
def exclude_paths(node: NodeT, paths: list[tuple[str, ...]]) -> NodeT:
    """``exclude(node, *paths, strict=False)`` for paths already checked by ``as_path`` (the keys a
    module chain drops): the same node, tags kept.
    """
    return _exclude(node, _trie(tuple(paths)), False, ())


@tag_rule
def rename(node: NodeT, mapping: Mapping[NestedKey, NestedKey]) -> NodeT:
    """A node with each key ``old`` of ``mapping`` moved to ``new``.

    A ``new`` key that exists and is not renamed away raises KeyCollisionError.
    Refused on a Locked node, or one with a Locked sub-node on a path it edits.
    """
    moves = [(as_path(old), as_path(new)) for old, new in mapping.items()]
    check_unlocked(node, "rename")  # an empty mapping too: every editor call on a Locked node is refused
    for old, _ in moves:
        _check_path_unlocked(node, old, "rename")
    moved = [(new, get(node, old)) for old, new in moves]
    targets = [new for new, _ in moved]
    if len(set(targets)) != len(targets):
        raise KeyCollisionError(f"rename: two keys are renamed to the same key in {dict(mapping)!r}")
    out = _exclude(node, _trie(tuple(old for old, _ in moves)), True, ())
    for new, value in moved:
        if get(out, new, _ABSENT) is not _ABSENT:
            raise KeyCollisionError(f"rename: {display(new)!r} already exists; exclude it first")
        out = _set_path(out, new, new, value, "rename")
    return out


@tag_rule
def flatten_keys(node: NodeT, sep: str = ".") -> NodeT:
    """A flat node whose keys join the nested keys with ``sep``; empty sub-nodes stay as entries.

    Leaves move to the root's batch size (extra batch dims of sub-nodes are not
    recorded). Two keys that join to the same name raise KeyCollisionError.
    """
    out: dict[str, Any] = {}
    origin: dict[str, NestedKey] = {}

    def visit(level: Node, path: tuple[str, ...]) -> None:
        for k, v in level._data.items():
            full = (*path, k)
            if isinstance(v, Node) and v._data:
                visit(v, full)
                continue
            name = sep.join(full)
            if name in out:
                raise KeyCollisionError(f"flatten_keys: {display(full)!r} and {origin[name]!r} both become {name!r}")
            out[name] = v
            origin[name] = display(full)

    visit(node, ())
    _, batch_size, device, _ = node._meta
    return make(type(node), sorted_data(out), batch_size, device)


class _Pending:
    """A node being assembled by unflatten_keys."""

    __slots__ = ("data", "batch_size", "device")

    def __init__(self, data: dict[str, Any], batch_size: torch.Size, device: torch.device | None) -> None:
        self.data, self.batch_size, self.device = data, batch_size, device


def _unflatten(node: NodeT, sep: str) -> NodeT:
    _, batch_size, device, _ = node._meta
    top = _Pending({}, batch_size, device)
    # Levels by their joined prefix, so each key finds its parent in one lookup.
    levels: dict[str, _Pending] = {}

    def level_of(prefix: str, key: str) -> _Pending:
        if not prefix:
            return top
        found = levels.get(prefix)
        if found is not None:
            return found
        head, _, name = prefix.rpartition(sep)
        parent = level_of(head, key)
        nxt = parent.data.get(name)
        if nxt is None:
            nxt = _Pending({}, parent.batch_size, parent.device)
        elif isinstance(nxt, Node):
            nxt = _Pending(dict(nxt._data), nxt._meta[1], nxt._meta[2])
        else:
            raise KeyCollisionError(f"unflatten_keys: {prefix!r} is a leaf and {key!r} needs it to be a node")
        parent.data[name] = levels[prefix] = nxt
        return nxt

    for k, v in node._data.items():
        if isinstance(v, Node):
            v = _unflatten(v, sep)
        prefix, _, last = k.rpartition(sep)
        level = level_of(prefix, k)
        if level.batch_size != batch_size and isinstance(v, torch.Tensor):
            # Only a sub-node that existed before, with extra batch dims, can refuse the leaf.
            if v.shape[: len(level.batch_size)] != level.batch_size:
                raise BatchSizeError(
                    f"unflatten_keys: {k!r} has shape {tuple(v.shape)}, which does not start with "
                    f"the batch_size {tuple(level.batch_size)} of {prefix!r}"
                )
        existing = level.data.get(last)
        if existing is None:
            level.data[last] = v
        elif isinstance(existing, _Pending) and isinstance(v, Node):
            for sub_key, sub_value in v._data.items():
                if sub_key in existing.data:
                    raise KeyCollisionError(f"unflatten_keys: {k!r} and its dotted keys both set {sub_key!r}")
                existing.data[sub_key] = sub_value
        else:
            raise KeyCollisionError(f"unflatten_keys: {k!r} is a leaf and other keys need it to be a node")
    cls = type(node)

    def finish(p: _Pending) -> NodeT:
        data = {k: finish(v) if isinstance(v, _Pending) else v for k, v in p.data.items()}
        return make(cls, sorted_data(data), p.batch_size, p.device)

    return finish(top)


@tag_rule
def unflatten_keys(node: NodeT, sep: str = ".") -> NodeT:
    """The inverse of :func:`flatten_keys`: keys split on ``sep`` become nested keys. Tags are kept.

    A leaf ``"a"`` beside a key ``"a.b"`` raises KeyCollisionError naming both.
    """
    return _unflatten(node, sep)


def to_dict(node: Node) -> dict[str, Any]:
    """Nested plain dicts of the node's tensors (the same tensor objects)."""
    return {k: to_dict(v) if isinstance(v, Node) else v for k, v in node._data.items()}


def _common_prefix(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    if not shapes:
        return ()
    prefix = shapes[0]
    for shape in shapes[1:]:
        n = 0
        while n < min(len(prefix), len(shape)) and prefix[n] == shape[n]:
            n += 1
        prefix = prefix[:n]
    return prefix


def _leaf_shapes(data: Mapping[str, Any]) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    for v in data.values():
        if isinstance(v, torch.Tensor):
            shapes.append(tuple(v.shape))
        elif isinstance(v, Node):
            shapes.extend(tuple(t.shape) for _, t in walk(v, True, True))
        elif isinstance(v, Mapping):
            shapes.extend(_leaf_shapes(nest(v)))
    return shapes


def _auto(root: type[NodeT], data: Mapping[str, Any], parent: torch.Size, device: torch.device | None) -> NodeT:
    shapes = _leaf_shapes(data)
    batch_size = torch.Size(_common_prefix(shapes)) if shapes else parent
    resolved = {
        k: _auto(root, nest(v), batch_size, device) if isinstance(v, Mapping) and not isinstance(v, Node) else v
        for k, v in data.items()
    }
    return build(root, resolved, batch_size, device)


def from_dict(root: type[NodeT], data: Mapping[Any, Any], batch_size: Any = None, device: Any = None) -> NodeT:
    """A validated node from nested mappings.

    ``batch_size=None`` infers, at each level, the longest common prefix of the
    shapes of the leaves below it (a single leaf: its whole shape).
    """
    dev = as_device(device)
    if batch_size is None:
        return _auto(root, nest(data), torch.Size(()), dev)
    return build(root, nest(data), as_batch_size(batch_size), dev)
