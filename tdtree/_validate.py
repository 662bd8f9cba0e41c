"""Validation at the public boundary: the constructor and values taken in by the editors.

Everything a user hands in passes here once; results of operations never do.
Errors name the key, the batch size expected and the shape found, and are raised
before anything is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ._base import NO_TAGS, Node, fill, make
from ._keys import as_path, display
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
    "entry",
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
    return None if device is None else torch.device(device)


_Tensor = torch.Tensor
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


def nest(source: Mapping[Any, Any]) -> dict[str, Any]:
    """A new dict of ``source`` with tuple keys expanded into nested dicts (str keys checked);
    ``source`` and the mappings in it are never changed."""
    # a loop costs less than a set of the key types, at 2 keys as at 100
    for key in source:
        if type(key) is not str:
            break
    else:
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
        # index by index, as _checked compares (a slice makes a new Size: half the cost of an editor's set)
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
        # a CPU leaf is told by is_cpu alone, as _checked tells it
        if device is not None and not (value.is_cpu if device is CPU else value.device == device):
            value = value.to(device)
        return value
    if isinstance(value, Node):
        if batch_size:
            _check_prefix(path, value._meta[1], batch_size, "nested node")
        if device is not None and value._meta[2] != device:
            return build(type(value)._root, value._data, value._meta[1], device, path)
        return retag(value, frozenset())
    if type(value) is dict or isinstance(value, Mapping):  # a dict is told apart without the ABC check
        return build(root, nest(value), batch_size, device, path)
    raise TypeError(
        f"entry {display(path)!r} is a {type(value).__name__}; entries are tensors, nodes or dicts "
        "(wrap numbers with torch.as_tensor)"
    )


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
    # as_device only for a device given (most nodes have none), and after nest() as errors are reported
    if not source:  # nothing to check, nothing to sort
        fill(node, {}, ((), size, device if device is None else as_device(device), NO_TAGS))
        return
    data, dev = _checked(node._root, nest(source), size, device if device is None else as_device(device), ())
    fill(node, data, (tuple(data), size, dev, NO_TAGS))


def build(
    root: type,
    data: Mapping[str, Any],
    batch_size: torch.Size,
    device: torch.device | None,
    prefix: tuple[str, ...] = (),
) -> Any:
    """A validated, untagged node of type ``root`` from a mapping with str keys."""
    data, device = _checked(root, data, batch_size, device, prefix)
    return make(root, data, batch_size, device)


def _checked(
    root: type, data: Mapping[str, Any], batch_size: torch.Size, device: torch.device | None, prefix: tuple[str, ...]
) -> tuple[dict[str, Any], torch.device | None]:
    """``data`` validated, in canonical key order, and the node's device."""
    n = len(batch_size)
    checked = {}
    plain = True  # every value a tensor or sub-node on one device: nothing for settle_device to do
    # The device leaves must be on: the one given, else the first leaf's (CPU as the one CPU object).
    found = CPU if device is not None and device == CPU else device
    # Batches of up to two dims compare by index (a slice makes a new Size); batch () needs no shape.
    # Only batch dims are compared, never a whole shape with another leaf's: under torch.compile with
    # dynamic shapes each comparison of symbolic dims is a guard, and one between leaves' other dims
    # would recompile for nothing.
    b0 = batch_size[0] if n else 0
    b1 = batch_size[1] if n > 1 else 0
    # Walking the keys sorted builds ``checked`` in canonical order at once: no second pass to sort it.
    for k in sorted(data):
        v = data[k]
        # The common case (a tensor that fits, on the device) is checked inline; entry() handles the rest
        # and the errors.
        if isinstance(v, _Tensor) and (
            not n
            or (
                len(s := v.shape) >= n and s[0] == b0 and (n == 1 or s[1] == b1) if n < 3 else v.shape[:n] == batch_size
            )
        ):
            if v.is_cpu if found is CPU else (d := v.device) == found:
                checked[k] = v
                continue
            if found is None:  # the first leaf, no device given
                found = CPU if d == CPU else d
                checked[k] = v
                continue
            if device is None:  # leaves on different devices: settle_device decides
                plain = False
                checked[k] = v
                continue
        checked[k] = v = entry((*prefix, k), v, batch_size, device, root)
        if device is None and plain:
            # a sub-node with a device counts as a leaf on it; one without (empty, or leaves that
            # disagree) is left to settle_device
            on = v._meta[2] if isinstance(v, Node) else v.device
            if on is None or (found is not None and on != found):
                plain = False
            elif found is None:
                found = CPU if on == CPU else on
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
