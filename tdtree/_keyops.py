"""The functional editors: set, update, rename, flatten/unflatten, and from_dict.

Every editor takes a node and returns a new one, copying only the nodes on the
path to what it changes and reusing every other sub-node and tensor. Values
handed in are validated here (``_validate.entry``); what comes out of the node
itself was validated when it entered and is reused as it is. Results are built
untagged by the factories of ``_base``; the ``tag_rule`` wrapper of each editor
decides their tags. Lookups, the key views and select / exclude live in
:mod:`tdtree._lookup`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ._base import NO_TAGS, Node, NodeT, chain, from_levels, insertion_point, make, rebuilt, sorted_data, with_meta
from ._keys import NestedKey, as_path, display
from ._lookup import get, path_nodes, walk, without
from ._tags import Locked, retag, tag_rule
from ._validate import as_batch_size, as_device, build, entry, nest, put_fitting, settle_device
from .errors import BatchSizeError, KeyCollisionError, LockedError

__all__ = [
    "check_unlocked",
    "check_unlocked_tree",
    "set_entry",
    "set_path",
    "setdefault",
    "update",
    "rename",
    "flatten_keys",
    "unflatten_keys",
    "from_dict",
]

_ABSENT: Any = object()


def check_unlocked(node: Node, op: str, path: tuple[str, ...] = ()) -> None:
    """Raise LockedError naming ``op`` (and ``path``, the node's key below the root edited) when
    ``node`` is Locked."""
    tags = node._meta[3]
    if tags and Locked in tags:
        raise LockedError(op, display(path) if path else None)


def check_unlocked_tree(node: Node, op: str, path: tuple[str, ...] = ()) -> None:
    """:func:`check_unlocked` for ``node`` and every sub-node of it (an editor that rebuilds them all)."""
    tags = node._meta[3]
    if tags and Locked in tags:  # told inline: a call per sub-node costs more than the test
        raise LockedError(op, display(path) if path else None)
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
        tags = level._meta[3]
        if tags and Locked in tags:  # told inline: the key is spelled only for the error
            raise LockedError(op, display(path[: depth + 1]))


def _set_path(node: NodeT, path: tuple[str, ...], full: tuple[str, ...], value: Any, op: str) -> NodeT:
    """``node`` (at ``full[:-len(path)]`` below the root edited) with ``value`` at ``path``: the nodes on
    the path rebuilt, each refused with LockedError naming ``op`` when Locked."""
    # A recursion, not a walk down and a loop back up: at the depths keys have, the walk's list, zip and
    # reversed slices cost more than the calls.
    head = path[0]
    old = node._data
    order, batch_size, device, tags = node._meta
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
    if device is None:  # with a device, entry() moved the value there: nothing to settle
        new, device = settle_device(new, device)
    if head in old:  # a replaced entry: the keys, and so the node's key tuple, are the same
        return with_meta(type(node), new, (order, batch_size, device, NO_TAGS))
    # The new key tuple is spliced from the old one (two slices cost less than reading the dict's keys).
    if not order or head > order[-1]:
        return with_meta(type(node), new, (order + (head,), batch_size, device, NO_TAGS))
    # A new key before the last one went in last: moving the keys after it behind it, in their (sorted)
    # order, restores canonical order without sorting and rebuilding the whole dict.
    i = insertion_point(order, head)
    for k in order[i:]:
        new[k] = new.pop(k)
    return with_meta(type(node), new, (order[:i] + (head,) + order[i:], batch_size, device, NO_TAGS))


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
    return chain(cls, path, data[path[-1]], batch_size, dev)


@tag_rule
def set_entry(node: NodeT, key: NestedKey, value: Any) -> NodeT:
    """A new node with ``value`` at ``key``; missing sub-nodes on the way are created.

    Args:
        node: The node (``self`` as a method).
        key: A str, or a tuple of str for a nested key.
        value: A tensor whose shape starts with the batch size of the node that holds it (moved to
            the node's device, when it has one), a node (put in untagged), or a dict (made a node).

    Returns:
        A new node; only the nodes on the path to ``key`` are new, every other entry is reused. Tags
        are kept only when ``value`` uses a storage the node already used (the rule).

    Raises:
        TypeError: ``key`` is not a key, or ``value`` is not a tensor, node or dict.
        BatchSizeError: ``value``'s shape does not start with the batch size where it goes.
        KeyCollisionError: a part of ``key`` before the last names a tensor.
        LockedError: the node, or a sub-node on the path to ``key``, is Locked (named).

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    >>> list(td.set(("b", "c"), torch.ones(2, 3)).keys(include_nested=True))
    ['a', 'b', ('b', 'c')]
    """
    path = as_path(key)
    return _set_path(node, path, path, value, "set")


@tag_rule
def set_path(node: NodeT, path: tuple[str, ...], value: Any) -> NodeT:
    """:meth:`~tdtree.TensorDict.set` for a ``path`` already checked by ``as_path`` (a module's out key): the same
    node, tags and errors.
    """
    return _set_path(node, path, path, value, "set")


@tag_rule
def setdefault(node: NodeT, key: NestedKey, default: Any) -> NodeT:
    """The node itself when ``key`` exists, else ``set(key, default)``.

    Args:
        node: The node (``self`` as a method).
        key: A str or tuple of str.
        default: The value to set when ``key`` is missing (as ``value`` in :meth:`~tdtree.TensorDict.set`).

    Returns:
        The node itself (tags kept), or a new node as :meth:`~tdtree.TensorDict.set` returns it.

    Raises:
        LockedError: the node is Locked (even when ``key`` exists).
        BatchSizeError, KeyCollisionError, TypeError: as :meth:`~tdtree.TensorDict.set`.
    """
    check_unlocked(node, "setdefault")
    path = as_path(key)
    if get(node, path, _ABSENT) is not _ABSENT:
        return node
    return _set_path(node, path, path, default, "setdefault")


def _update(node: NodeT, source: Mapping[str, Any] | Node, prefix: tuple[str, ...]) -> NodeT:
    # The sub-nodes a nested source merges into are found from an explicit stack and finished deepest
    # first, so that an update reaches the depth a node does, not Python's recursion limit.
    # A level: (node, its new data, its path, parent's level index, its key there).
    levels: list[tuple[Node, dict[str, Any], tuple[str, ...], int, str]] = []
    todo: list[tuple[Node, Mapping[str, Any] | Node, tuple[str, ...], int, str]] = [(node, source, prefix, -1, "")]
    while todo:
        at, src, path, up, key = todo.pop()
        here = len(levels)
        levels.append((at, _merged(at, src, path, todo, here), path, up, key))
    result: Any = None
    for at, new, _, up, key in levels[::-1]:  # a slice: dynamo guards on reversed()'s polyfill
        order, batch_size, device, _ = at._meta
        if device is None:  # with a device, entry() moved every value there (a trusted node's are on it)
            new, device = settle_device(new, device)
        if len(new) == len(order):  # only replaced entries: the node's key tuple serves
            result = with_meta(type(at), new, (order, batch_size, device, NO_TAGS))
        else:
            result = make(type(at), sorted_data(new), batch_size, device)
        if up >= 0:
            levels[up][1][key] = result
    return result


def _merged(
    node: Node,
    source: Mapping[str, Any] | Node,
    prefix: tuple[str, ...],
    todo: list[tuple[Node, Mapping[str, Any] | Node, tuple[str, ...], int, str]],
    here: int,
) -> dict[str, Any]:
    """The data of ``node`` with ``source``'s entries set, but for the nested mappings that merge into
    a sub-node: those go on ``todo`` (their result replaces the sub-node in the returned dict)."""
    old = node._data
    order, batch_size, device, tags = node._meta
    if tags:
        check_unlocked(node, "update", prefix)
    # A node with this batch size and device was checked against both when it was built (and holds
    # untagged sub-nodes): its entries fit as they are, so entry() would find nothing to do.
    trusted = False
    if isinstance(source, Node):
        trusted = source._meta[1] == batch_size and source._meta[2] == device
        source = source._data
    new = old.copy()
    # the tensors that fit as they are go in at once; the rest (sub-nodes, mappings, tensors to move,
    # convert or refuse) one by one below
    rest = source.items() if trusted else put_fitting(source, batch_size, device, new)
    for k, v in rest:
        current = old.get(k)
        if isinstance(current, Node) and isinstance(v, (Node, Mapping)):
            todo.append((current, v if isinstance(v, Node) else nest(v, False), (*prefix, k), here, k))
        elif trusted:
            # a sub-node goes in untagged, as entry() puts it (the rule decides the result's tags)
            new[k] = retag(v, NO_TAGS) if isinstance(v, Node) else v
        else:
            new[k] = entry((*prefix, k), v, batch_size, device, type(node)._root)
    return new


@tag_rule
def update(node: NodeT, other: Mapping[Any, Any] | Node) -> NodeT:
    """A new node with the entries of ``other`` set; nested mappings merge into existing sub-nodes.

    Args:
        node: The node (``self`` as a method).
        other: A node, or a mapping with str or tuple keys whose values :meth:`~tdtree.TensorDict.set` takes.

    Returns:
        A new node; entries ``other`` does not name are reused. Tags follow the rule, with the nodes
        in ``other`` among its inputs (a node's own leaves keep them, new storage drops them).

    Raises:
        TypeError: a key of ``other`` is not a key, or a value is not a tensor, node or dict.
        BatchSizeError: a value's shape does not start with the batch size where it goes.
        KeyCollisionError: ``other`` gives one key twice (``("a", "b")`` and ``{"a": {"b": ...}}``).
        LockedError: the node, or a sub-node a nested mapping merges into, is Locked (named).

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"a": torch.zeros(2), "b": {"c": torch.zeros(2)}}, batch_size=[2])
    >>> list(td.update({"b": {"d": torch.ones(2)}}).keys(include_nested=True, leaves_only=True))
    ['a', ('b', 'c'), ('b', 'd')]
    """
    return _update(node, other if isinstance(other, Node) else nest(other, False), ())


@tag_rule
def rename(node: NodeT, mapping: Mapping[NestedKey, NestedKey]) -> NodeT:
    """A node with the entry at each key ``old`` of ``mapping`` moved to its ``new`` key.

    Args:
        node: The node (``self`` as a method).
        mapping: ``{old: new}`` of keys; the moves happen at once, so two keys can swap.

    Returns:
        A new node holding the same leaves and sub-nodes; tags are kept (no data is made, so the rule keeps them).

    Raises:
        KeyNotFoundError: an ``old`` key names no entry.
        KeyCollisionError: two keys move to one ``new`` key, or ``new`` exists and is not moved away.
        BatchSizeError: an entry does not fit the batch size of the sub-node it moves into.
        LockedError: the node, or a sub-node on a path it edits, is Locked.
    """
    moves = [(as_path(old), as_path(new)) for old, new in mapping.items()]
    check_unlocked(node, "rename")  # an empty mapping too: every editor call on a Locked node is refused
    for old, _ in moves:
        _check_path_unlocked(node, old, "rename")
    moved = [(new, get(node, old)) for old, new in moves]
    if len(moves) == 1:
        return _move(node, *moves[0], moved[0][1])
    targets = [new for new, _ in moved]
    if len(set(targets)) != len(targets):
        raise KeyCollisionError(f"rename: two keys are renamed to the same key in {dict(mapping)!r}")
    out = without(node, [old for old, _ in moves])  # get() found each one
    for new, value in moved:
        out = _put_new(out, new, new, value)
    return out


def _move(node: NodeT, old: tuple[str, ...], new: tuple[str, ...], value: Any) -> NodeT:
    """``node`` with ``value``, its entry at ``old``, moved to ``new``: the two edits made below the node
    holding both keys' parents, and the nodes above it copied once, not once per edit."""
    common = 0
    limit = min(len(old), len(new)) - 1
    while common < limit and old[common] == new[common]:
        common += 1
    if not common:
        return _put_new(without(node, [old]), new, new, value)
    levels = path_nodes(node, old)
    if levels is None:  # get() found the entry
        raise AssertionError(f"{display(old)!r} was found, yet its path is not")
    inner = _put_new(without(levels[common], [old[common:]]), new[common:], new, value)
    return rebuilt(levels[:common], old, inner)


def _put_new(node: NodeT, path: tuple[str, ...], full: tuple[str, ...], value: Any) -> NodeT:
    """``node`` (at ``full[: -len(path)]``) with ``value`` at ``path``, which must name no entry yet."""
    if get(node, path, _ABSENT) is not _ABSENT:
        raise KeyCollisionError(f"rename: {display(full)!r} already exists; exclude it first")
    return _set_path(node, path, full, value, "rename")


@tag_rule
def flatten_keys(node: NodeT, sep: str = ".") -> NodeT:
    """A flat node whose keys join the nested keys with ``sep``; empty sub-nodes stay as entries.

    Args:
        node: The node (``self`` as a method).
        sep: The str put between the parts of a nested key.

    Returns:
        A node of the root's batch size (extra batch dims of sub-nodes are not recorded) holding the
        same leaves; tags are kept (the rule: no data is made).

    Raises:
        KeyCollisionError: two keys join to the same name (both named).
    """
    out: dict[str, Any] = {}
    name = _flat_into(node, sep, out)
    if name is not None:  # the keys behind a clash are found again only for the error
        clash = [key for key, x in walk(node, True, False) if _joined(key, sep) == name and not _expands(x)]
        raise KeyCollisionError(f"flatten_keys: {clash[-1]!r} and {clash[0]!r} both become {name!r}")
    _, batch_size, device, _ = node._meta
    return make(type(node), sorted_data(out), batch_size, device)


def _flat_into(node: Node, sep: str, out: dict[str, Any]) -> str | None:
    """Put the entries below ``node`` into ``out`` under their joined names; the first name two
    entries join to, else None. Names grow by the prefix of their level (a join of the whole key per
    leaf costs its depth). Walked from an explicit stack of the levels above, as ``_lookup.walk``
    walks: any depth a nested dict gets."""
    prefix = ""
    items = iter(node._data.items())
    above = []  # (prefix, items) of the levels above, each where it left off
    while True:
        for k, v in items:
            if isinstance(v, Node) and v._data:  # told inline, as _expands tells it
                above.append((prefix, items))
                prefix, items = prefix + k + sep, iter(v._data.items())
                break
            name = prefix + k
            if name in out:
                return name
            out[name] = v
        else:
            if not above:
                return None
            prefix, items = above.pop()


def _expands(value: Any) -> bool:
    """Whether flatten_keys puts ``value``'s entries in its place: a sub-node holding some (an empty one
    stays an entry)."""
    return isinstance(value, Node) and bool(value._data)


def _joined(key: NestedKey, sep: str) -> str:
    return key if type(key) is str else sep.join(key)


def _unflatten(node: NodeT, sep: str) -> NodeT:
    _, batch_size, device, _ = node._meta
    # The levels are plain dicts until the end. Each is found by its joined prefix in one lookup (a walk
    # part by part costs a lookup per part), and takes its parent's batch size and device; one opened
    # from a sub-node the node holds keeps that sub-node's (``sizes``, by prefix, holds the pair for
    # the levels at or below one). ``made`` lists every level after the level holding it, for the
    # factory that turns them into nodes bottom up.
    top: dict[str, Any] = {}
    levels: dict[str, dict[str, Any]] = {}
    made: list[tuple[Any, ...]] = [(top, None, "", batch_size, device)]
    sizes: dict[str, tuple[torch.Size, torch.device | None]] = {}

    def level_of(prefix: str, key: str) -> dict[str, Any]:
        """The level at ``prefix``, made (with the missing levels above it) when missing."""
        # up to the nearest level there (the top when none is), then down making the missing ones: a
        # loop, where a call per level cost more than the level's own work
        missing = []
        parent, above = top, None
        while True:
            head, cut, name = prefix.rpartition(sep)
            missing.append((prefix, name))
            if not cut:
                break
            found = levels.get(head)
            if found is not None:
                parent, above = found, head
                break
            prefix = head
        for prefix, name in missing[::-1]:
            nxt = parent.get(name)
            if nxt is None:
                nxt = parent[name] = {}
                inherited = sizes.get(above) if sizes and above is not None else None
                if inherited is None:
                    made.append((nxt, parent, name, batch_size, device))
                else:
                    sizes[prefix] = inherited
                    made.append((nxt, parent, name, *inherited))
            elif isinstance(nxt, Node):
                _, size, dev, _ = nxt._meta
                nxt = parent[name] = nxt._data.copy()
                sizes[prefix] = (size, dev)
                made.append((nxt, parent, name, size, dev))
            else:
                raise KeyCollisionError(f"unflatten_keys: {prefix!r} is a leaf and {key!r} needs it to be a node")
            levels[prefix] = parent = nxt
            above = prefix
        return parent

    for k, v in node._data.items():
        if isinstance(v, Node):
            v = _unflatten(v, sep)
        if sep in k:
            prefix, _, last = k.rpartition(sep)
            level = levels.get(prefix)
            if level is None:
                level = level_of(prefix, k)
            known = sizes.get(prefix) if sizes else None
            # only a sub-node that existed before, with extra batch dims, can refuse a leaf
            if known is not None and isinstance(v, torch.Tensor) and v.shape[: len(known[0])] != known[0]:
                raise BatchSizeError(
                    f"unflatten_keys: {k!r} has shape {tuple(v.shape)}, which does not start with "
                    f"the batch_size {tuple(known[0])} of {prefix!r}"
                )
        else:
            level, last = top, k
        existing = level.get(last)
        if existing is None:
            level[last] = v
        elif type(existing) is dict and isinstance(v, Node):
            for sub_key, sub_value in v._data.items():
                if sub_key in existing:
                    raise KeyCollisionError(f"unflatten_keys: {k!r} and its dotted keys both set {sub_key!r}")
                existing[sub_key] = sub_value
        else:
            raise KeyCollisionError(f"unflatten_keys: {k!r} is a leaf and other keys need it to be a node")
    return from_levels(type(node), made)


@tag_rule
def unflatten_keys(node: NodeT, sep: str = ".") -> NodeT:
    """The inverse of :func:`flatten_keys`: keys split on ``sep`` become nested keys.

    Args:
        node: The node (``self`` as a method).
        sep: The str the keys are split on (every occurrence: ``".a"`` is ``("", "a")``).

    Returns:
        A node holding the same leaves; a new sub-node takes its parent's batch size, a sub-node
        the node already held keeps its own. Tags are kept (the rule: no data is made).

    Raises:
        KeyCollisionError: a leaf ``"a"`` beside a key ``"a.b"`` (both named).
        BatchSizeError: a leaf does not fit the batch size of a sub-node it goes into.
    """
    return _unflatten(node, sep)


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
