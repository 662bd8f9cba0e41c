"""A node's tree as memmap directories and save files describe it: flat JSON, one item per node and
leaf in depth-first canonical order (:func:`describe`), and the node rebuilt from it, every fact
checked (:func:`assemble`). Flat, and read from an explicit stack, so that neither JSON's reader
and writer nor this module recurse once per level: a file holds a node as deep as a nested dict
gets. The nested form of earlier format versions is read too (:func:`flat_tree`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from ._base import Node, make
from ._files import MAX_BYTES, checked_size
from ._keys import display
from ._validate import build
from .errors import BatchSizeError, KeyCollisionError

__all__ = ["LeafFn", "assemble", "describe", "dtype_name", "dtype_named", "flat_tree"]


def dtype_named(name: object) -> torch.dtype | None:
    """The torch dtype spelled ``name`` (``"float32"``), or None."""
    dtype = getattr(torch, name, None) if type(name) is str else None
    return dtype if isinstance(dtype, torch.dtype) else None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(node: Node, cpu: bool) -> tuple[list[dict[str, Any]], list[tuple[tuple[str, ...], torch.Tensor]]]:
    """The JSON-able tree of ``node`` and its leaves as (path, tensor), index by index.

    The tree is flat, so that no JSON reader or writer recurses once per level: one item per node
    and leaf in depth-first canonical order, each but the root's naming its ``key`` in the node
    before it that holds it; a node's item gives its ``batch_size``, ``device`` and number of
    ``entries`` (the items that follow it, each with what nests below it), a leaf's its ``leaf``
    index, ``dtype`` and ``shape``. With ``cpu`` a node's device is written as ``"cpu"`` (None
    stays None): the leaves will live in host memory.
    """
    leaves: list[tuple[tuple[str, ...], torch.Tensor]] = []
    items = [_node_item(node, cpu)]
    todo: list[tuple[tuple[str, ...], Any]] = [((), iter(node._data.items()))]
    while todo:
        path, entries = todo[-1]
        for key, value in entries:
            if isinstance(value, Node):
                item = _node_item(value, cpu)
                item["key"] = key
                items.append(item)
                todo.append(((*path, key), iter(value._data.items())))
                break
            items.append(
                {"key": key, "leaf": len(leaves), "dtype": dtype_name(value.dtype), "shape": list(value.shape)}
            )
            leaves.append(((*path, key), value))
        else:
            todo.pop()
    return items, leaves


def _node_item(x: Node, cpu: bool) -> dict[str, Any]:
    _, batch_size, device, _ = x._meta
    shown = None if device is None else ("cpu" if cpu else str(device))
    return {"batch_size": list(batch_size), "device": shown, "entries": len(x._data)}


def flat_tree(tree: object, nested: bool, corrupt: Callable[[str], Exception]) -> list[Any]:
    """The flat tree (see :func:`describe`) of ``tree``: in the flat form (``tree`` itself, which must
    be a list) or, ``nested``, in the form of earlier versions (a node: ``{"batch_size", "device",
    "entries": [[key, child], ...]}``), unrolled from an explicit stack. Only the nesting is checked
    here, the rest by :func:`assemble`."""
    if not nested:
        if type(tree) is not list:
            raise corrupt(f"its tree is not a list of nodes and leaves but a {type(tree).__name__}")
        return tree
    items: list[Any] = []
    todo: list[tuple[object, str | None, tuple[str, ...]]] = [(tree, None, ())]
    while todo:
        obj, key, path = todo.pop()
        if key is not None and not (type(obj) is dict and "entries" in obj):  # a leaf
            if type(obj) is not dict:
                raise corrupt(f"leaf {display(path)!r} is malformed")
            items.append({**obj, "key": key})
            continue
        if type(obj) is not dict or type(obj.get("entries")) is not list:
            raise corrupt(f"{_where(path)} has no list of entries")
        entries = obj["entries"]
        items.append({**obj, "entries": len(entries)} if key is None else {**obj, "entries": len(entries), "key": key})
        for entry in entries:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str:
                raise corrupt(f"{_where(path)} has a malformed entry {str(entry)[:80]}")
        # pre-order: each entry in order, a node followed by what nests below it
        todo.extend((child, k, (*path, k)) for k, child in reversed(entries))
    return items


def _where(path: tuple[str, ...]) -> str:
    return f"node {display(path)!r}" if path else "the root node"


def _sizes(value: object) -> list[int] | None:
    if type(value) is list and all(type(d) is int and 0 <= d <= MAX_BYTES for d in value):
        return value
    return None


LeafFn = Callable[[int, torch.dtype, torch.Size, tuple[str, ...]], torch.Tensor]


def assemble(
    tree: object,
    nested: bool,
    root: type,
    leaf_fn: LeafFn,
    corrupt: Callable[[str], Exception],
    device: Callable[[str | None], torch.device | None],
) -> Any:
    """The node described by ``tree`` (from :func:`describe`; ``nested``: in the nested form of earlier
    versions, see :func:`flat_tree`), leaves made by ``leaf_fn``; read from an explicit stack, so
    that a file holds a node as deep as memory allows, not Python's recursion limit.

    Everything read is checked: ``corrupt(reason)`` makes the error for a
    malformed tree, ``device(name)`` turns a recorded device into the node's
    device (or raises). Leaf shapes are validated against batch sizes by the
    public constructor's validation; a node gets the device recorded for it
    (its leaves must be there), as the original node had it.
    """
    items = flat_tree(tree, nested, corrupt)
    if not items:
        raise corrupt("the root node has no list of entries")
    counter = itertools.count()
    # one frame per node being read: (its data, entries still to read, its item, its path); a node is
    # built once its entries are read, and takes its place in its parent's data (its key reserved there)
    frames: list[tuple[dict[str, Any], list[int], dict[str, Any], tuple[str, ...]]] = []
    frames.append(({}, [_entry_count(items[0], (), corrupt)], items[0], ()))
    done: Any = None
    i = 1
    while frames:
        data, left, item, path = frames[-1]
        if not left[0]:
            frames.pop()
            done = _built(root, data, item, path, corrupt, device)
            if frames:
                frames[-1][0][path[-1]] = done
            continue
        left[0] -= 1
        where = _where(path)
        if i == len(items):
            raise corrupt(f"the tree ends before the last of the {item.get('entries')} entries of {where}")
        entry = items[i]
        i += 1
        if type(entry) is not dict or type(entry.get("key")) is not str:
            raise corrupt(f"{where} has a malformed entry {str(entry)[:80]}")
        key = entry["key"]
        if key in data:
            raise corrupt(f"{where} holds the key {key!r} twice")
        if "entries" in entry:
            data[key] = None  # its place, in order
            below = (*path, key)
            frames.append(({}, [_entry_count(entry, below, corrupt)], entry, below))
        else:
            data[key] = _leaf(entry, (*path, key), next(counter), leaf_fn, corrupt)
    if i < len(items):
        raise corrupt(f"it holds {len(items) - i} items after the root node's entries")
    return done


def _entry_count(item: object, path: tuple[str, ...], corrupt: Callable[[str], Exception]) -> int:
    count = item.get("entries") if type(item) is dict else None
    if type(count) is not int or count < 0:
        raise corrupt(f"{_where(path)} has no list of entries")
    return count


def _built(
    root: type,
    data: dict[str, Any],
    item: dict[str, Any],
    path: tuple[str, ...],
    corrupt: Callable[[str], Exception],
    device: Callable[[str | None], torch.device | None],
) -> Any:
    """The node of ``item`` holding ``data`` (its entries, made), checked against what ``item`` records."""
    where = _where(path)
    batch_size = _sizes(item.get("batch_size"))
    if batch_size is None:
        raise corrupt(f"{where} has a malformed batch_size {item.get('batch_size')!r}")
    dev = item.get("device")
    if dev is not None and type(dev) is not str:
        raise corrupt(f"{where} has a malformed device {dev!r}")
    try:
        built = build(root, data, torch.Size(batch_size), None)
    except (BatchSizeError, KeyCollisionError, TypeError) as err:
        raise corrupt(str(err)) from None
    recorded = device(dev)
    if recorded is None or built._meta[2] == recorded:
        return built
    for key, value in data.items():
        if isinstance(value, torch.Tensor) and value.device != recorded:
            raise corrupt(f"{where} is on {recorded} but its leaf {key!r} is on {value.device}")
    # The device as recorded, not as inferred: an empty sub-node of a cpu node may say None.
    return make(root, built._data, built._meta[1], recorded)


def _leaf(
    item: dict[str, Any], path: tuple[str, ...], index: int, leaf_fn: LeafFn, corrupt: Callable[[str], Exception]
) -> torch.Tensor:
    where = f"leaf {display(path)!r}"
    if item.get("leaf") != index or type(item.get("leaf")) is not int:
        raise corrupt(f"{where} should be leaf {index}, found {item.get('leaf')!r}")
    shape = _sizes(item.get("shape"))
    if shape is None:
        raise corrupt(f"{where} has a malformed shape {item.get('shape')!r}")
    dtype = dtype_named(item.get("dtype"))
    if dtype is None:
        raise corrupt(f"{where} has an unknown dtype {item.get('dtype')!r}")
    checked_size(shape, dtype, corrupt, path)
    return leaf_fn(index, dtype, torch.Size(shape), path)
