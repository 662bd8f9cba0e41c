"""Validation at the public boundary: the constructor and values taken in by the editors.

Everything a user hands in passes here once; results of operations never do.
Errors name the key, the batch size expected and the shape found, and are raised
before anything is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ._base import Node, make
from ._keys import as_path, display
from ._tags import retag
from .errors import BatchSizeError, KeyCollisionError

__all__ = ["NO_BATCH", "as_batch_size", "as_device", "nest", "construct", "build", "entry", "settle_device"]


NO_BATCH = torch.Size(())  # immutable, so one object serves every node without batch dims


def as_batch_size(batch_size: int | Sequence[int] | torch.Size | None) -> torch.Size:
    """``batch_size`` as a ``torch.Size``: None is ``()``, an int is one dimension."""
    if batch_size is None:
        return NO_BATCH
    size = batch_size
    if type(size) is not torch.Size:  # a Size is taken as it is: making it again costs as much as a list
        if isinstance(size, int):
            size = (size,)
        try:
            size = torch.Size(size)
        except TypeError:
            raise TypeError(f"batch_size must be a sequence of ints, got {batch_size!r}") from None
    # a loop over the few dims of a batch costs half of min()
    for dim in size:
        if dim < 0:
            raise ValueError(f"batch_size {tuple(size)} has a negative dimension")
    return size


def as_device(device: Any) -> torch.device | None:
    return None if device is None else torch.device(device)


_STR = {str}
_Tensor = torch.Tensor


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
    if {*map(type, source)} <= _STR:
        return {**source}  # not dict(source): dynamo traces that through a polyfill that adds guards
    out: dict[str, Any] = {}
    made = {id(out)}
    for key, value in source.items():
        path = as_path(key)
        level = out
        for depth, part in enumerate(path[:-1]):
            if part not in level:
                level[part] = {}
                made.add(id(level[part]))
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
    if shape[:n] == batch_size:
        return
    if len(shape) < n or tuple(shape[:n]) != tuple(batch_size):
        raise BatchSizeError(
            f"{what} {display(path)!r} has shape {tuple(shape)}, which does not start with the "
            f"batch_size {tuple(batch_size)}"
        )


def entry(
    path: tuple[str, ...], value: Any, batch_size: torch.Size, device: torch.device | None, root: type
) -> Any:
    """``value`` checked and made ready to sit at ``path`` in a node with ``batch_size`` / ``device``.

    Tensors move to ``device`` when one is set; nodes come back untagged; dicts
    become nodes with ``batch_size``.
    """
    # every shape starts with an empty batch: no prefix to check (most nodes have no batch dims)
    if isinstance(value, torch.Tensor):
        if batch_size:
            _check_prefix(path, value.shape, batch_size, "entry")
        if device is not None and value.device != device:
            value = value.to(device)
        return value
    if isinstance(value, Node):
        if batch_size:
            _check_prefix(path, value._meta[1], batch_size, "nested node")
        if device is not None and value._meta[2] != device:
            return build(type(value)._root, value._data, value._meta[1], device, path)
        return retag(value, frozenset())
    if isinstance(value, Mapping):
        return build(root, nest(value), batch_size, device, path)
    raise TypeError(
        f"entry {display(path)!r} is a {type(value).__name__}; entries are tensors, nodes or dicts "
        "(wrap numbers with torch.as_tensor)"
    )


def _has_leaves(node: Node) -> bool:
    return any(not isinstance(v, Node) or _has_leaves(v) for v in node._data.values())


def _common_device(values: Any) -> torch.device | None:
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


def construct(
    cls: type[Node], source: Mapping[Any, Any] | None, batch_size: Any, device: Any
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The ``_data`` and ``_meta`` of a node of type ``cls`` made by the constructor (validated, untagged leaves)."""
    if isinstance(source, Node):
        source = source._data
    size = as_batch_size(batch_size)
    if not source:  # nothing to check, nothing to sort
        dev = as_device(device)
        return {}, ((), size, dev, cls._tags)
    data, dev = _checked(cls._root, nest(source), size, as_device(device), ())
    return data, (tuple(data), size, dev, cls._tags)


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
    found: torch.device | None = None  # that device, when none is given
    # Indexing a torch.Size costs less than slicing it (a new Size): batches of up to two dims compare by index
    # (batch () needs no shape at all).
    short = n <= 2
    b0, b1 = (*batch_size, 0, 0)[:2]
    # Walking the keys sorted builds ``checked`` in canonical order at once: no second pass to sort it.
    for k in sorted(data):
        v = data[k]
        # The common case (a tensor that fits) is checked inline; entry() handles the rest and the errors.
        if isinstance(v, _Tensor) and (
            (n == 0 or len(s := v.shape) >= n and s[0] == b0 and (n < 2 or s[1] == b1))
            if short
            else v.shape[:n] == batch_size
        ):
            d = v.device
            if device is None:
                if found is None:
                    found = d
                elif plain and d != found:
                    plain = False
                checked[k] = v
                continue
            if d == device:
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
                found = on
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
    device = _common_device(data.values())
    if device is None:
        return data, None
    if not any(isinstance(v, Node) and v._meta[2] is None for v in data.values()):
        return data, device
    settled = {
        k: build(type(v)._root, v._data, v._meta[1], device) if isinstance(v, Node) and v._meta[2] is None else v
        for k, v in data.items()
    }
    return settled, device
