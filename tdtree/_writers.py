"""The in-place writers: ``update_``, ``copy_``, ``zero_``, ``fill_``.

Each one pairs every value with its leaf and checks both (``_inplace``'s checks)
before it writes anything, so a refused call leaves the node untouched; it
returns the node it was called on (tags kept: it is not subject to the rule).
What is accepted and refused is written in ``_inplace``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optree
import torch
from torch import Tensor

from ._base import Node, NodeT
from ._foreach import foreach
from ._inplace import (
    Writes,
    checked,
    each_writable,
    leaf_kinds_writable,
    math_bits,
    refuse_kinds,
    refused,
    same_device,
    targets_writable,
)
from ._keys import NestedKey, as_path, display
from ._lookup import MISSING, get, walk
from ._pytree import NAMESPACE
from ._validate import CPU, nest
from .errors import KeyMismatchError, KeyNotFoundError, WriteError

__all__ = ["update_", "copy_", "zero_", "fill_"]


def _update_pairs(node: Node, source: Mapping[str, Any], prefix: tuple[str, ...], same: bool, out: Writes) -> None:
    data = node._data
    add_dst, add_src = out.dst.append, out.src.append
    # a node's device, when set, is every leaf's: on the CPU a value's is_cpu tells all (a mapping's values)
    cpu = not same and node._meta[2] == CPU
    for k, v in source.items():
        current = data.get(k, MISSING)
        if (
            isinstance(v, Tensor)
            and isinstance(current, Tensor)
            and v.dtype == current.dtype
            and v.shape == current.shape
            and (same or (v.is_cpu if cpu else v.device == current.device))
            and current.is_contiguous()
        ):
            add_dst(current)
            add_src(v)
            continue
        path = (*prefix, k)
        if current is MISSING:
            raise KeyNotFoundError(display(path), [display((*prefix, j)) for j in data])
        if isinstance(current, Node):
            if isinstance(v, Node):
                _update_pairs(current, v._data, path, same_device(current, v), out)
            elif isinstance(v, Mapping):
                _update_pairs(current, nest(v), path, False, out)
            else:
                raise WriteError(
                    f"update_: {display(path)!r} is a node; give it a mapping or a node, not a {type(v).__name__}"
                )
        elif isinstance(v, (Node, Mapping)):
            raise WriteError(
                f"update_: {display(path)!r} is a tensor and the value is a {type(v).__name__}; in-place "
                "writes never change the structure: use update() on an unlocked node"
            )
        else:
            out.add(current, checked("update_", path, current, v))


def update_(node: NodeT, other: Mapping[Any, Any] | Node) -> NodeT:
    """Write the values of ``other`` into the leaves at their keys, in place; works on Locked nodes.

    Args:
        node: the node written (``self`` as a method).
        other: a node or mapping whose keys all exist in ``node`` (nested mappings and nodes
            address sub-nodes); each value is a tensor broadcasting to its leaf's shape or a number.

    Returns:
        ``node`` itself (same object, tags kept).

    Raises:
        KeyNotFoundError: a key of ``other`` is not in the node.
        WriteError: a value's dtype, device or shape does not fit its leaf, a value is a sparse,
            nested, quantized or mkldnn tensor (``WriteTypeError``), a leaf cannot be written, or a
            value would change the structure; nothing was written.

    Example:
        >>> import torch, tdtree as tt
        >>> td = tt.TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]).lock()
        >>> td.update_({"x": torch.ones(3)})["x"].sum().item()
        6.0
    """
    source = other._data if isinstance(other, Node) else nest(other)
    writes = Writes("update_", node)
    try:
        _update_pairs(node, source, (), same_device(node, other), writes)
    except (WriteError, RuntimeError) as exc:
        # a leaf of a kind torch cannot tell the strides or contiguity of is named with its kind, and
        # so is a value whose shape torch cannot tell (a strided nested tensor)
        leaf_kinds_writable("update_", node, _targets(node, source))
        if isinstance(exc, RuntimeError):
            refuse_kinds("update_", _named(source, ()))
        raise
    writes.run()
    return node


def _targets(node: Node, source: Mapping[str, Any]) -> list[Tensor]:
    """The leaves of ``node`` that the values of ``source`` (nested) would write."""
    out: list[Tensor] = []
    for path, _ in _named(source, ()):
        try:
            leaf = get(node, path, MISSING)
        except KeyError:  # a path through a leaf
            continue
        if isinstance(leaf, Node):
            out.extend(t for _, t in walk(leaf, True, True))
        elif leaf is not MISSING:
            out.append(leaf)
    return out


def _named(source: Mapping[str, Any], prefix: tuple[str, ...]) -> Any:
    """(path, value) of every value in ``source``, a nested mapping or node data, depth first."""
    for k, v in source.items():
        if isinstance(v, Node):
            yield from _named(v._data, (*prefix, k))
        elif isinstance(v, Mapping):
            yield from _named(nest(v), (*prefix, k))
        else:
            yield (*prefix, k), v


def _copy_pairs(node: Node, other: Node, prefix: tuple[str, ...], same: bool, out: Writes) -> None:
    if node._meta[0] != other._meta[0]:
        raise KeyMismatchError(
            "copy_" if not prefix else f"copy_ at {display(prefix)!r}",
            [display((*prefix, k)) for k in node._meta[0]],
            [display((*prefix, k)) for k in other._meta[0]],
        )
    add_dst, add_src = out.dst.append, out.src.append
    # equal keys, both in canonical order: the values pair up in order
    for k, leaf, value in zip(node._meta[0], node._data.values(), other._data.values()):
        if (
            isinstance(value, Tensor)
            and isinstance(leaf, Tensor)
            and value.dtype == leaf.dtype
            and value.shape == leaf.shape
            and (same or value.device == leaf.device)
            and leaf.is_contiguous()
        ):
            add_dst(leaf)
            add_src(value)
            continue
        path = (*prefix, k)
        if isinstance(leaf, Node) and isinstance(value, Node):
            _copy_pairs(leaf, value, path, same_device(leaf, value), out)
        elif isinstance(leaf, Node) or isinstance(value, Node):
            kinds = ("a node", "a tensor") if isinstance(leaf, Node) else ("a tensor", "a node")
            raise WriteError(f"copy_: {display(path)!r} is {kinds[0]} here and {kinds[1]} in the source")
        else:
            out.add(leaf, checked("copy_", path, leaf, value, exact_shape=True))


def copy_(node: NodeT, other: Node) -> NodeT:
    """Write every leaf of ``other`` into the leaf at the same key, in place; works on Locked nodes.

    Args:
        node: the node written (``self`` as a method).
        other: a node with the same keys (at every level) whose leaves have the same shapes and
            devices and dtypes that cast to the leaves' (``torch.can_cast``).

    Returns:
        ``node`` itself (same object, tags kept).

    Raises:
        TypeError: ``other`` is not a node.
        KeyMismatchError: the key sets differ (the message lists the differences).
        WriteError: a leaf's shape, dtype or device differs, or a leaf cannot be written; nothing was written.
    """
    if not isinstance(other, Node):
        raise TypeError(f"copy_ takes a node, got {type(other).__name__}; use update_ for a mapping")
    writes = Writes("copy_", node)
    try:
        _copy_pairs(node, other, (), same_device(node, other), writes)
    except (WriteError, RuntimeError):  # a leaf of a kind torch cannot tell the strides of is named
        leaf_kinds_writable("copy_", node, [t for _, t in walk(node, True, True)])
        raise
    writes.run()
    return node


def zero_(node: NodeT) -> NodeT:
    """Set every leaf to zero in place; works on Locked nodes.

    Args:
        node: the node written (``self`` as a method).

    Returns:
        ``node`` itself (same object, tags kept).

    Raises:
        WriteError: a leaf cannot be written (see the module docstring); nothing was written.
    """
    # optree's stub is wrong here: it types a tree as PyTree[T], a union optree builds at runtime,
    # which mypy reads as a class that no actual tree (tuple, node) is an instance of
    leaves: list[torch.Tensor] = optree.tree_leaves(node, namespace=NAMESPACE)  # type: ignore[arg-type]
    if leaves:
        leaf_kinds_writable("zero_", node, leaves)
        if not targets_writable(leaves):
            each_writable("zero_", node, leaves, fill=True)
        try:
            foreach(torch._foreach_zero_)(leaves)
        except RuntimeError:
            refused("zero_", node, leaves, fill=True)
            if not math_bits(leaves):
                raise
            for leaf in leaves:
                leaf.zero_()
    return node


def fill_(node: NodeT, key: NestedKey, value: Any) -> NodeT:
    """Fill the leaf at ``key`` (every leaf below it, for a sub-node) with ``value``, in place.

    Args:
        node: the node written (``self`` as a method); Locked nodes are accepted.
        key: a str or tuple of str naming a leaf or a sub-node.
        value: a Python number or a 0-dim tensor that fits the leaves' dtype and device.

    Returns:
        ``node`` itself (same object, tags kept).

    Raises:
        KeyNotFoundError: ``key`` is not in the node.
        TypeError: ``key`` is not a str or tuple of str.
        WriteError: ``value`` does not fit a leaf's dtype or device, is not 0-dim, or a leaf
            cannot be written; nothing was written.
    """
    path = as_path(key)
    target = get(node, path)
    if isinstance(value, torch.Tensor) and value.dim() != 0:
        raise WriteError(
            f"fill_: {display(path)!r}: the value has shape {tuple(value.shape)}; fill_ takes a number or a "
            "0-dim tensor (use update_ to write a tensor)"
        )
    if not isinstance(target, Node):
        leaf_kinds_writable("fill_", node, [target])
        target.fill_(checked("fill_", path, target, value, fill=True))
        return node
    named = [((*path, *as_path(k)), t) for k, t in walk(target, True, True)]
    leaf_kinds_writable("fill_", node, [leaf for _, leaf in named])
    values = [(leaf, checked("fill_", p, leaf, value, fill=True)) for p, leaf in named]
    for leaf, v in values:
        leaf.fill_(v)
    return node
