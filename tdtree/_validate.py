"""Validation at the public boundary: the constructors and values taken in by the editors.

Everything a user hands in passes here once; results of operations never do.
The TensorDict constructor (:func:`construct`) and a tensorclass's
(:func:`tdtree._fields.record`, which binds the fields first) run the same checks:
the keys (str, tuple keys nested), the batch size (:func:`as_batch_size`), the
device (:func:`as_device`, inferred as :func:`common_device` says), and every
entry's shape and device (:func:`checked_data`). Nested plain dicts are checked in one walk
from an explicit stack and their nodes made in one factory call (:func:`_plain_levels`); any other
mapping, and a tree holding something to move, convert or refuse, level by level (:func:`_built`),
which names the key in its errors. Both reach any depth a nested dict does.
Errors name the key or field, the batch size expected and the shape found, and are
raised before anything is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ._base import NO_TAGS, Node, fill, from_levels, make
from ._keys import as_path, display
from ._kinds import refuse
from ._tags import retag
from .errors import BatchSizeError, KeyCollisionError

__all__ = [
    "NO_BATCH",
    "CPU",
    "as_batch_size",
    "as_device",
    "nest",
    "construct",
    "build",
    "checked_data",
    "shape_bound",
    "entry",
    "put_fitting",
    "settle_device",
    "common_device",
    "dim_index",
]


_Size = torch.Size  # a module global: ``torch.Size`` is an attribute read off the torch module on every use
NO_BATCH = _Size(())  # immutable, so one object serves every node without batch dims


def as_batch_size(batch_size: int | Sequence[int] | torch.Size | None) -> torch.Size:
    """``batch_size`` as a ``torch.Size``: None is ``()``, an int is one dimension."""
    size: Any = batch_size
    if type(size) is not _Size:  # a Size is taken as it is: making it again costs as much as a list
        if size is None:
            return NO_BATCH
        try:
            size = _Size(size)
        except TypeError:
            # an int is one dimension: told here, not before, so a sequence pays no isinstance check
            if not isinstance(batch_size, int):
                raise TypeError(f"batch_size must be a sequence of ints, got {batch_size!r}") from None
            size = _Size((batch_size,))
    # a loop over the few dims of a batch costs half of min()
    for dim in size:
        if dim < 0:
            raise ValueError(f"batch_size {tuple(size)} has a negative dimension")
    return size


def dim_index(dim: object, n: int) -> int | None:
    """``dim`` as an index into ``n`` dims when it is an int in ``[-n, n)`` (counted as torch counts
    dims), else None: the one normalisation of a batch dim, whose callers raise naming what it is for."""
    if isinstance(dim, int) and -n <= dim < n:
        return dim + n if dim < 0 else dim
    return None


def as_device(device: Any) -> torch.device | None:
    """``device`` as the ``torch.device`` a tensor put there reports; None stays None.

    An accelerator device named without an index (``"cuda"``) is the current one of its type
    (``cuda:0``), as ``torch.zeros(1, device="cuda").device`` is: a node records the device its
    leaves report, so ``node.device == leaf.device`` holds.
    """
    if device is None:
        return None
    if type(device) is str and device == "cpu":  # the common name, without parsing it
        return CPU
    dev = device if type(device) is torch.device else torch.device(device)
    # dev.type builds a new str on every read: the CPU is told by equality
    if dev.index is None and dev != CPU:
        current = torch.accelerator.current_accelerator()
        if current is not None and current.type == dev.type:
            dev = torch.device(dev.type, torch.accelerator.current_device_index())
    return dev


_Tensor = torch.Tensor
_DATA = (torch.Tensor, Node)
# The device found on CPU leaves is always this one object, so that a leaf is checked against it by
# ``is_cpu`` alone, which costs less than reading the leaf's device and comparing it.
CPU = torch.device("cpu")


def _owned(level: dict[str, Any], part: str, made: set[int]) -> dict[str, Any] | None:
    """The dict at ``level[part]``, replaced by a copy first unless :func:`nest` made it, so that
    merging tuple keys never writes into a mapping or node the caller passed; None for a tensor."""
    current = level[part]
    if id(current) in made:
        return current
    if isinstance(current, Node):
        current = dict(current._data)
    elif isinstance(current, Mapping):
        current = nest(current)
    else:
        return None
    level[part] = current
    made.add(id(current))
    return current


def _put(level: dict[str, Any], path: tuple[str, ...], value: Any, made: set[int]) -> None:
    """Set ``value`` at ``path[-1]`` of ``level``; mappings given at one key from two places merge
    key by key, anything else given twice is a KeyCollisionError naming the key."""
    last = path[-1]
    if last not in level:
        level[last] = value
        return
    merged = _owned(level, last, made) if isinstance(value, (Mapping, Node)) else None
    if merged is None:
        raise KeyCollisionError(f"key {display(path)!r} is given twice")
    for key, sub in nest(value._data if isinstance(value, Node) else value).items():
        _put(merged, (*path, key), sub, made)


def nest(source: Mapping[Any, Any], copy: bool = True) -> Mapping[str, Any]:
    """A new dict of ``source`` with tuple keys expanded into nested dicts (str keys checked);
    ``source`` and the mappings in it are never changed. ``copy=False``: ``source`` itself when every
    key is a str, for a caller that only reads it."""
    # a loop costs less than a set of the key types, at 2 keys as at 100
    for key in source:
        if type(key) is not str:
            break
    else:
        if not copy:
            return source
        return {**source}  # not dict(source): dynamo traces that through a polyfill that adds guards
    out: dict[str, Any] = {}
    made = {id(out)}
    for key, value in source.items():
        if type(key) is str and key not in out:  # nothing there to merge with or collide with
            out[key] = value
            continue
        path = as_path(key)
        level = out
        for depth, part in enumerate(path[:-1]):
            nxt: dict[str, Any] | None
            if part not in level:
                nxt = level[part] = {}
                made.add(id(nxt))
            else:
                nxt = _owned(level, part, made)
                if nxt is None:
                    raise KeyCollisionError(
                        f"key {display(path)!r} needs {display(path[: depth + 1])!r} to be a node, "
                        "but a tensor is given for it"
                    )
            level = nxt
        _put(level, path, value, made)
    return out


def _check_prefix(path: tuple[str, ...], shape: Sequence[int], batch_size: torch.Size, what: str) -> None:
    n = len(batch_size)
    if n < 3:
        # index by index, as checked_data compares (a slice makes a new Size: half the cost of an editor's set)
        if len(shape) >= n and (n == 0 or shape[0] == batch_size[0]) and (n < 2 or shape[1] == batch_size[1]):
            return
    elif shape[:n] == batch_size:
        return
    if len(shape) < n or tuple(shape[:n]) != tuple(batch_size):
        raise BatchSizeError(
            f"{what} {display(path)!r} has shape {tuple(shape)}, which does not start with the "
            f"batch_size {tuple(batch_size)}"
        )


def entry(path: tuple[str, ...], value: Any, batch_size: torch.Size, device: torch.device | None, root: type) -> Any:
    """``value`` checked and made ready to sit at ``path`` in a node with ``batch_size`` / ``device``.

    Tensors move to ``device`` when one is set; nodes come back untagged; dicts
    become nodes with ``batch_size``.
    """
    # every shape starts with an empty batch: no prefix to check (most nodes have no batch dims)
    if isinstance(value, _Tensor):
        if batch_size:
            _check_prefix(path, value.shape, batch_size, "entry")
        # a CPU leaf is told by is_cpu alone, as checked_data tells it
        if device is not None and not (value.is_cpu if device is CPU else value.device == device):
            value = value.to(device)
        return value
    if isinstance(value, Node):
        if batch_size:
            _check_prefix(path, value._meta[1], batch_size, "nested node")
        if device is not None and value._meta[2] != device:
            return build(type(value)._root, value._data, value._meta[1], device, path)
        return retag(value, frozenset())
    if type(value) is dict:
        node = _plain_tree(root, value, batch_size, device)
        if node is not None:
            return node
    if type(value) is dict or isinstance(value, Mapping):  # a dict is told apart without the ABC check
        data = nest(value, False)  # build only reads it
        for v in data.values():
            if type(v) is dict or (not isinstance(v, _DATA) and isinstance(v, Mapping)):
                return _built(root, value, batch_size, device, path)  # mappings below: from a stack
        return build(root, data, batch_size, device, path)
    raise TypeError(
        f"entry {display(path)!r} is a {type(value).__name__}; entries are tensors, nodes or dicts "
        "(wrap numbers with torch.as_tensor)"
    )


def shape_bound(b: torch.Size) -> tuple[int, ...]:
    """The tuple ``hi`` for which a shape ``s`` of at least ``len(b)`` dims starts with ``b`` exactly
    when ``b <= s < hi``, as tuples compare: two comparisons in C stand for reading and comparing each
    batch dim. ``()`` for ``b == ()``, which every shape starts with (callers skip the test). One and
    two dims, the common batches, are spelled out: slicing a Size makes a new Size."""
    n = len(b)
    return (b[0], b[1] + 1) if n == 2 else (b[0] + 1,) if n == 1 else (*b[:-1], b[-1] + 1) if n else ()


def put_fitting(
    source: Mapping[str, Any], batch_size: torch.Size, device: torch.device | None, into: dict[str, Any]
) -> list[tuple[str, Any]]:
    """Put into ``into`` each value of ``source`` that :func:`entry` would return as it is: a tensor
    whose shape starts with ``batch_size``, on ``device`` when one is set. The other ``(key, value)``
    pairs, in ``source``'s order, are returned for the caller to pass to :func:`entry` (which moves,
    converts or refuses them) or to merge.

    One loop with :func:`checked_data`'s inline test, where a call of :func:`entry` per value cost as much as
    the rest of an update.
    """
    n = len(batch_size)
    hi = shape_bound(batch_size)
    cpu = device is CPU or (device is not None and device == CPU)
    rest = []
    for k, v in source.items():
        try:
            fits = (
                isinstance(v, _Tensor)
                and (not n or batch_size <= v.shape < hi)
                and (device is None or (v.is_cpu if cpu else v.device == device))
            )
        except RuntimeError:  # a strided nested tensor has no shape: entry() says what it says
            fits = False
        if fits:
            into[k] = v
        else:
            rest.append((k, v))
    return rest


def _has_leaves(node: Node) -> bool:
    return any(not isinstance(v, Node) or _has_leaves(v) for v in node._data.values())


def common_device(values: Any) -> torch.device | None:
    """The device every one of ``values`` (tensors and nodes) is on, else None. A sub-node without a
    device holding no leaves does not count; one holding leaves has them on different devices."""
    found: torch.device | None = None
    for v in values:
        if isinstance(v, Node):
            d = v._meta[2]
            if d is None:
                if _has_leaves(v):
                    return None  # its leaves disagree
                continue
        else:
            d = v.device
        if found is None:
            found = d
        elif d != found:
            return None
    return found


def construct(node: Node, source: Mapping[Any, Any] | None, batch_size: Any, device: Any) -> None:
    """Write the slots of ``node``, fresh from the constructor, from its arguments: the entries
    validated, untagged and in canonical order, the batch size and the device checked."""
    if isinstance(source, Node):
        source = source._data
    size = as_batch_size(batch_size)
    # A source that is not a mapping fails in nest() or checked_data (a list of pairs has no items(), a
    # tensor no truth value): told apart there, after the fact, so that a mapping pays no test for it.
    try:
        # as_device only for a device given (most nodes have none), and after nest() as errors are reported
        if not source:  # nothing to check, nothing to sort
            if source is not None and type(source) is not dict and not isinstance(source, Mapping):
                raise _not_a_mapping(source)
            fill(node, {}, ((), size, device if device is None else as_device(device), NO_TAGS))
            return
        # checked_data only reads the entries: the caller's mapping needs no copy
        data, dev = checked_data(
            node._root, nest(source, False), size, device if device is None else as_device(device), ()
        )
    except (AttributeError, TypeError, RuntimeError):
        if not isinstance(source, Mapping):
            raise _not_a_mapping(source) from None
        raise
    fill(node, data, (tuple(data), size, dev, NO_TAGS))


def _not_a_mapping(source: object) -> TypeError:
    # tensordict refuses a source that is not a mapping too; dict(pairs) is the one spelling of pairs
    return TypeError(
        f"TensorDict(source): source is a {type(source).__name__}; it is a mapping of keys to tensors, nodes "
        "or dicts, or a node (give (key, value) pairs as dict(pairs))"
    )


def build(
    root: type,
    data: Mapping[str, Any],
    batch_size: torch.Size,
    device: torch.device | None,
    prefix: tuple[str, ...] = (),
) -> Any:
    """A validated, untagged node of type ``root`` from a mapping with str keys."""
    data, device = checked_data(root, data, batch_size, device, prefix)
    return make(root, data, batch_size, device)


def _built(
    root: type, source: Mapping[Any, Any], batch_size: torch.Size, device: torch.device | None, path: tuple[str, ...]
) -> Any:
    """The node ``source``, a mapping at ``path``, becomes: the mappings nested in it found from an
    explicit stack and built deepest first, each level by :func:`build`, so that the depth a node
    reaches is bounded by memory, as a nested dict's is, not by Python's recursion limit.

    A level is built without its path, which only an error names (the paths of a chain cost the
    square of its depth): a level that fails is checked again with its path, which raises the same
    error naming the whole key."""
    levels: list[tuple[Any, Any, str, int]] = []  # (data, parent, key, parent's index)
    todo: list[tuple[Mapping[Any, Any], Any, str, int]] = [(source, None, "", -1)]
    while todo:
        mapping, parent, key, up = todo.pop()
        data = nest(mapping)  # a copy: the sub-nodes built go into it in place of the mappings
        here = len(levels)
        levels.append((data, parent, key, up))
        for k, v in data.items():
            if type(v) is dict or (not isinstance(v, _DATA) and isinstance(v, Mapping)):
                todo.append((v, data, k, here))
    node = None
    for i in range(len(levels) - 1, -1, -1):
        data, parent, key, _ = levels[i]
        try:
            node = build(root, data, batch_size, device, path if i == 0 else ())
        except Exception:
            if i:
                build(root, data, batch_size, device, _path_of(levels, i, path))
            raise
        if parent is not None:
            parent[key] = node
    return node


def _plain_tree(root: type[Node], source: dict[str, Any], batch_size: torch.Size, device: torch.device | None) -> Any:
    """The node the nested dicts ``source`` make, when :func:`_plain_levels` keeps every entry as it
    is; else None, for the general path (:func:`_built`), which decides and raises naming the key."""
    hi = shape_bound(batch_size)
    found = CPU if device is not None and device == CPU else device
    walked = _plain_levels(root, [(source, None, "")], batch_size, hi, device, found)
    return None if walked is None else from_levels(root, walked[0])


def _plain_levels(
    root: type[Node],
    todo: list[tuple[dict[str, Any], Any, str]],
    batch_size: torch.Size,
    hi: tuple[int, ...],
    device: torch.device | None,
    found: torch.device | None,
) -> tuple[list[tuple[Any, ...]], torch.device | None] | None:
    """For the nested dicts of ``todo`` (each ``(dict, parent, key)``: its node goes to ``parent[key]``),
    :func:`from_levels`' levels and the device found, when every entry is kept as it is: str keys,
    values that are tensors, dicts or untagged nodes of ``root`` with a device, each starting with
    ``batch_size`` (below ``hi``, as :func:`checked_data` compares), all on ``found`` (the leaves'
    device so far: None for none yet; ``device`` when one is given). None otherwise (a value to move,
    convert or refuse, a tuple key, a mapping that is not a dict, leaves on several devices).

    The checks :func:`checked_data` makes, in one walk from an explicit stack (any depth), each level's
    entries checked as they are copied; :func:`from_levels` puts each level's keys in canonical order.
    When the leaves agree on one device, every node takes it, sub-nodes holding no leaves too, as
    :func:`settle_device` settles them; without leaves, none has one.
    """
    n = len(batch_size)
    dev = device if device is not None else found  # the nodes' device: the one given, else the one found
    levels: list[tuple[Any, ...]] = []  # (data, parent, key, batch_size, device)
    unsettled = 0  # levels listed before a leaf told the device (the first ones)
    try:
        while todo:
            mapping, parent, name = todo.pop()
            data: dict[str, Any] = {}
            for k, v in mapping.items():
                if type(k) is not str:
                    return None
                if isinstance(v, _Tensor):
                    if n and not batch_size <= v.shape < hi:
                        return None
                    if found is CPU:
                        if not v.is_cpu:
                            return None
                    elif found is None:
                        found = dev = CPU if v.is_cpu else v.device
                    elif v.device != found:
                        return None
                elif type(v) is dict:
                    todo.append((v, data, k))  # from_levels puts its node here
                elif type(v) is root and (held := v._meta[2]) is not None and (not n or batch_size <= v._meta[1] < hi):
                    if found is None:
                        found = dev = CPU if held == CPU else held
                    elif held != found:
                        return None
                else:
                    return None
                data[k] = v
            if dev is None:
                unsettled += 1
            levels.append((data, parent, name, batch_size, dev))
    except RuntimeError:  # a strided nested tensor has no shape: entry() says what it says
        return None
    if unsettled and dev is not None:
        levels[:unsettled] = [(*level[:4], dev) for level in levels[:unsettled]]
    return levels, found


def _path_of(levels: list[tuple[Any, Any, str, int]], i: int, path: tuple[str, ...]) -> tuple[str, ...]:
    """The path of ``levels[i]``, below ``path`` (the path of ``levels[0]``)."""
    parts = []
    while i > 0:
        _, _, key, i = levels[i]
        parts.append(key)
    return (*path, *parts[::-1])


def checked_data(
    root: type[Node],
    data: Mapping[str, Any],
    batch_size: torch.Size,
    device: torch.device | None,
    prefix: tuple[str, ...],
    ordered: bool = False,
) -> tuple[dict[str, Any], torch.device | None]:
    """``data`` validated, in canonical key order (``ordered``: ``data``'s own order is that), and the
    node's device."""
    n = len(batch_size)
    checked: dict[str, Any] = {}
    plain = True  # every value a tensor or sub-node on one device: nothing for settle_device to do
    pending: list[tuple[dict[str, Any], dict[str, Any], str]] | None = None  # the dicts, (dict, checked, key)
    # The device leaves must be on: the one given, else the first leaf's (CPU as the one CPU object).
    found: torch.device | None = CPU if device is not None and device == CPU else device
    # shape_bound's two comparisons compare batch dims only, never a leaf's other dims: under
    # torch.compile with dynamic shapes each comparison of symbolic dims is a guard, and one on a leaf's
    # other dims would recompile for nothing.
    hi = shape_bound(batch_size)
    # Walking the keys sorted builds ``checked`` in canonical order at once: no second pass to sort it.
    k, v = "", None  # the entry being checked, for the except path
    try:
        for k in data if ordered else sorted(data):
            v = data[k]
            # The common case (a tensor that fits, on the device) is checked inline; entry() handles the rest
            # and the errors.
            if isinstance(v, _Tensor) and (not n or batch_size <= v.shape < hi):
                if found is CPU:
                    here = v.is_cpu
                elif found is None:  # the first leaf, no device given: its device is the node's
                    found = CPU if v.is_cpu else v.device
                    here = True
                else:
                    here = v.device == found
                if here:
                    checked[k] = v
                    continue
                if device is None:  # leaves on different devices: settle_device decides
                    plain = False
                    checked[k] = v
                    continue
            elif type(v) is root and v._meta[2] is not None and (not n or batch_size <= v._meta[1] < hi):
                # an untagged node of this type (its sub-nodes untagged too, by the tag invariant) with a
                # device: kept as it is, as _plain_record keeps it, without a walk of its tree (which a deep
                # one would not survive)
                held = v._meta[2]
                if found is None:
                    found = CPU if held == CPU else held
                if held == found:
                    checked[k] = v
                    continue
                if device is None:
                    plain = False
                    checked[k] = v
                    continue
            if type(v) is dict:
                # walked with the other dicts after the loop, in one go (the node goes in its place)
                if pending is None:
                    pending = []
                pending.append((v, checked, k))
                checked[k] = v
                continue
            try:
                checked[k] = v = entry((*prefix, k), v, batch_size, device, root)
            except Exception:
                if pending is not None:  # the dicts before ``k`` come first, as errors go in key order
                    for sub, _, before in pending:
                        entry((*prefix, before), sub, batch_size, device, root)
                raise
            if device is None and plain:
                # a sub-node with a device counts as a leaf on it; one without (empty, or leaves that
                # disagree) is left to settle_device
                on = v._meta[2] if isinstance(v, Node) else v.device
                if on is None or (found is not None and on != found):
                    plain = False
                elif found is None:
                    found = CPU if on == CPU else on
    except Exception as exc:
        # a leaf whose shape torch cannot tell (a nested tensor of strided layout) is named with its
        # kind and conversion; everything else fails as it did
        refuse("TensorDict", display((*prefix, k)), (v,), exc)
        raise
    if pending is not None:
        # the dicts' trees from one walk, when the level's entries agree on a device (a tree holding no
        # leaves takes it); else each from entry(), and settle_device decides
        walked = _plain_levels(root, pending, batch_size, hi, device, found) if plain else None
        if walked is None:
            for k, v in checked.items():  # the walk took the list; the dicts still hold their places
                if type(v) is dict:
                    checked[k] = entry((*prefix, k), v, batch_size, device, root)
            plain = False
        else:
            levels, found = walked
            from_levels(root, levels)
    if not plain:
        return settle_device(checked, device)
    return checked, found if device is None else device


def settle_device(data: dict[str, Any], device: torch.device | None) -> tuple[dict[str, Any], torch.device | None]:
    """The device of a node holding ``data``: ``device`` when set, else the one all leaves share.

    Sub-nodes holding no leaves have no device of their own; they take the one
    found, so a node's device is always its sub-nodes' device too.
    """
    if device is not None:
        return data, device
    device = common_device(data.values())
    if device is None:
        return data, None
    if not any(isinstance(v, Node) and v._meta[2] is None for v in data.values()):
        return data, device
    settled = {
        k: build(type(v)._root, v._data, v._meta[1], device) if isinstance(v, Node) and v._meta[2] is None else v
        for k, v in data.items()
    }
    return settled, device
