"""Devices, dtypes, layout and memory size.

``Tensor.to`` and ``Tensor.contiguous`` return the very tensor when nothing
changes, and so do ``to`` / ``cpu`` / ``cuda`` / ``contiguous`` here with the
node: the same device (told by the node's device alone), every leaf already of
that dtype or contiguous (told by reading each leaf's dtype or layout, nothing
built). The node keeps its tags, which the rule would keep too (same storages).
Otherwise the result is a new node, and a real move or copy drops the tags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._base import Node, NodeT, make
from ._maps import flat, leaves, map_leaves, refuse_first
from ._tags import storage_key, tag_rule
from ._validate import as_device

__all__ = ["to", "cast", "cpu", "cuda", "pin_memory", "contiguous", "nbytes"]

_DEVICE_LIKE = (torch.device, str, int)


def _parse(args: tuple[Any, ...], device: Any, dtype: Any) -> tuple[torch.device | None, torch.dtype | None]:
    for arg in args:
        if isinstance(arg, torch.dtype) and dtype is None:
            dtype = arg
        elif isinstance(arg, _DEVICE_LIKE) and not isinstance(arg, bool) and device is None:
            device = arg
        else:
            raise TypeError(f"to() takes a device and/or a dtype (positionally or as device=/dtype=), got {arg!r}")
    if isinstance(device, int):
        device = torch.device("cuda", device)
    return as_device(device), dtype


def _moved(node: NodeT, device: torch.device, leaf_fn: Any) -> NodeT:
    data = {}  # a loop, not a dict comprehension: the comprehension is a call of its own (before Python 3.12)
    for k, v in node._data.items():
        data[k] = _moved(v, device, leaf_fn) if isinstance(v, Node) else leaf_fn(v)
    return make(type(node), data, node._meta[1], device)


def _all_of(dtype: torch.dtype, node: Node) -> bool:
    """Whether every leaf of ``node`` has ``dtype``: a read of each leaf's dtype, nothing built."""
    # a loop, not a map of an attrgetter: dynamo traces the loop
    for leaf in leaves(node):
        if leaf.dtype != dtype:
            return False
    return True


def to(
    node: NodeT, *args: Any, device: Any = None, dtype: torch.dtype | None = None, non_blocking: bool = False
) -> NodeT:
    """Every leaf through ``Tensor.to(device, dtype, non_blocking)`` (``td.to("cuda")``, ``td.to(torch.float16)``).

    Args:
        node: the node (``self`` as a method).
        *args: a device and/or a dtype, positionally (``to(device)``, ``to(dtype)``,
            ``to(device, dtype)``); an int device means that CUDA device.
        device: the device, as a keyword.
        dtype: the dtype, as a keyword.
        non_blocking: passed to ``Tensor.to``.

    Returns:
        ``node`` itself, tags kept, when nothing would change (the node's device is ``device``,
        every leaf has ``dtype``), as ``Tensor.to`` returns the tensor itself. Otherwise a new
        node whose ``device`` (and every sub-node's) is ``device`` when one is given; tags follow
        the rule: kept when every leaf is reused, dropped when one moves or changes dtype.

    Raises:
        TypeError: an argument is neither a device nor a dtype, or one is given twice.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.zeros(2)}, batch_size=[2]).lock()
    >>> td.to("cpu").tags == td.tags, td.to(torch.float16).tags, td.to(torch.float16)["x"].dtype
    (True, frozenset(), torch.float16)
    """
    dev, dt = _parse(args, device, dtype)
    # a node's device, when it has one, is every leaf's and every sub-node's: no leaf to visit
    if (dev is None or dev == node._meta[2]) and (dt is None or _all_of(dt, node)):
        return node
    return _to(node, dev, dt, non_blocking)


@tag_rule
def _to(node: NodeT, dev: torch.device | None, dt: torch.dtype | None, non_blocking: bool) -> NodeT:
    if dev is None:
        return map_leaves(lambda x: x.to(dtype=dt, non_blocking=non_blocking), node)
    return _moved(node, dev, lambda x: x.to(device=dev, dtype=dt, non_blocking=non_blocking))


def cast(dtype: torch.dtype, name: str) -> Callable[[NodeT], NodeT]:
    """The method ``name`` (``double``, ``half``, ...): ``to(dtype)``."""

    def method(node: NodeT) -> NodeT:
        return to(node, dtype)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``to({dtype})``: a new node, or the same leaves (tags kept) when already so."
    return method


def cpu(node: NodeT) -> NodeT:
    """``to("cpu")``.

    Args:
        node: the node (``self`` as a method).

    Returns:
        ``node`` itself when its device is the CPU; else a node on the CPU (tags by the rule, kept
        only when every leaf was there already).
    """
    return to(node, _CPU)


_CPU = torch.device("cpu")


def cuda(node: NodeT, device: int | torch.device | str | None = None, non_blocking: bool = False) -> NodeT:
    """``to(device)`` for a CUDA ``device``.

    Args:
        node: the node (``self`` as a method).
        device: a CUDA device, or its index; None: ``"cuda"``, the current one.
        non_blocking: passed to ``Tensor.to``.

    Returns:
        ``node`` itself when its device is that one; else a node on it (tags by the rule: kept
        only when every leaf was there already).

    torch raises (RuntimeError, or AssertionError in a build without CUDA) when the device is not there.
    """
    if device is None:
        device = torch.device("cuda")
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    return to(node, device, non_blocking=non_blocking)


@tag_rule
def pin_memory(node: NodeT) -> NodeT:
    """Every leaf in page-locked memory (``Tensor.pin_memory``); needs an accelerator.

    Args:
        node: the node (``self`` as a method).

    Returns:
        A new node on the same device; tags dropped (pinning copies), unless every leaf was
        already pinned (pinned leaves are reused). torch raises RuntimeError without an accelerator.
    """
    return map_leaves(lambda x: x if x.is_pinned() else x.pin_memory(), node)


def contiguous(node: NodeT) -> NodeT:
    """Every leaf contiguous: contiguous leaves are reused, others copied.

    Args:
        node: the node (``self`` as a method).

    Returns:
        ``node`` itself, tags kept, when every leaf already is contiguous, as ``Tensor.contiguous``
        returns the tensor itself; else a new node, tags dropped when a copy holds data.
    """
    try:
        for leaf in leaves(node):
            if not leaf.is_contiguous():
                return _contiguous(node)
    except Exception as exc:
        refuse_first("contiguous", node, torch.Tensor.is_contiguous, exc)
        raise
    return node


@tag_rule
def _contiguous(node: NodeT) -> NodeT:
    return map_leaves(torch.Tensor.contiguous, node)


def nbytes(node: Node) -> int:
    """The bytes of the distinct storages the leaves use: views of one storage count once,
    and a storage counts whole even when a leaf views only part of it."""
    seen: set[int] = set()
    total = 0
    try:
        for leaf in flat(node)[0]:
            key = storage_key(leaf)
            if key is not None and key not in seen:
                seen.add(key)
                total += leaf.untyped_storage().nbytes()
    except Exception as exc:
        refuse_first("nbytes", node, storage_key, exc)
        raise
    return total
