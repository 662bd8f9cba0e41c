"""Leaf-wise maps over nodes, through optree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch

from ._base import Node, make
from ._keyops import walk
from ._keys import display
from ._pytree import NAMESPACE
from ._tags import tag_rule
from ._validate import as_batch_size
from .errors import BatchSizeError, KeyMismatchError

__all__ = [
    "map_leaves", "clone", "rebuild", "apply", "named_apply", "flat", "check_same_keys", "paired_leaves",
]


def map_leaves(fn: Callable[..., Any], node: Node, *others: Node) -> Any:
    """``fn`` applied to every leaf (and the matching leaves of ``others``); same structure."""
    return optree.tree_map(fn, node, *others, namespace=NAMESPACE)


def flat(node: Node) -> tuple[list[Any], optree.PyTreeSpec]:
    """The node's leaves in canonical order and its structure."""
    return optree.tree_flatten(node, namespace=NAMESPACE)


def _fits(a: torch.Size, b: torch.Size, skip: int | None) -> bool:
    if skip is None:
        return a == b
    return len(a) == len(b) and a[:skip] == b[:skip] and a[skip + 1 :] == b[skip + 1 :]


def _skeleton_mismatch(a: Node, b: Node, path: tuple[str, ...], skip: int | None) -> str | None:
    if not _fits(a._meta[1], b._meta[1], skip):
        where = f"at {display(path)!r}" if path else "at the root"
        outside = "" if skip is None else f" outside batch dim {skip}"
        return f"batch_size {tuple(a._meta[1])} {where} does not match {tuple(b._meta[1])}{outside}"
    if a._meta[0] != b._meta[0]:
        return "keys"
    for k, v in a._data.items():
        w = b._data[k]
        if isinstance(v, Node) != isinstance(w, Node):
            return "keys"
        if isinstance(v, Node):
            found = _skeleton_mismatch(v, w, (*path, k), skip)
            if found is not None:
                return found
    return None


def check_same_keys(what: str, a: Node, b: Node, skip: int | None = None) -> None:
    """Raise unless ``a`` and ``b`` pair leaf by leaf: KeyMismatchError naming the keys, or
    BatchSizeError naming the batch sizes (which may differ at batch dim ``skip`` when given)."""
    found = _skeleton_mismatch(a, b, (), skip)
    if found is None:
        return
    if found != "keys":
        raise BatchSizeError(f"{what}: {found}; nodes combined by key need fitting batch sizes")
    left = {k for k, _ in walk(a, True, True)}
    right = {k for k, _ in walk(b, True, True)}
    if left == right:
        left = {k for k, _ in walk(a, True, False)}
        right = {k for k, _ in walk(b, True, False)}
    raise KeyMismatchError(what, left, right)


def paired_leaves(what: str, node: Node, spec: optree.PyTreeSpec, other: Node, skip: int | None = None) -> list[Any]:
    """The leaves of ``other`` in the order of ``node``'s leaves (``spec`` is ``node``'s structure).

    Raises as :func:`check_same_keys` when the two do not pair.
    """
    leaves, other_spec = flat(other)
    if other_spec != spec or skip is not None:
        check_same_keys(what, node, other, skip)
    return leaves


def _copy_nodes(node: Node) -> Node:
    data = {k: _copy_nodes(v) if isinstance(v, Node) else v for k, v in node._data.items()}
    _, batch_size, device, _ = node._meta
    return make(type(node), data, batch_size, device)


@tag_rule
def clone(node: Node, recurse: bool = True) -> Node:
    """A copy: with ``recurse`` every leaf is cloned (tags dropped, new storage);
    without it only the node objects are new and the leaves are shared (tags kept)."""
    if recurse:
        return map_leaves(torch.clone, node)
    return _copy_nodes(node)


def rebuild(node: Node, leaf_fn: Callable[[torch.Tensor], Any], root_batch: torch.Size) -> Any:
    """A node of the same keys with ``leaf_fn(leaf)`` for every leaf and batch size ``root_batch``.

    Sub-nodes get ``root_batch`` followed by their own extra batch dims, so an
    operation on the root's batch dims leaves a sub-node's extra dims alone.
    This is the one traversal for operations that change batch sizes (optree's
    maps keep metadata as it is).
    """
    n = len(node._meta[1])

    def visit(x: Any) -> Any:
        if not isinstance(x, Node):
            return leaf_fn(x)
        data = {k: visit(v) for k, v in x._data.items()}
        _, batch_size, device, _ = x._meta
        return make(type(x), data, torch.Size((*root_batch, *batch_size[n:])), device)

    return visit(node)


def _results(what: str, fn: Callable[..., Any], node: Node, others: tuple[Node, ...], named: bool) -> Any:
    leaves, spec = flat(node)
    columns = [paired_leaves(what, node, spec, other) for other in others]
    if named:
        keys = [display(path) for path in optree.tree_paths(node, namespace=NAMESPACE)]
        return spec, [fn(*row) for row in zip(keys, leaves, *columns)]
    if columns:
        return spec, [fn(*row) for row in zip(leaves, *columns)]
    return spec, [fn(x) for x in leaves]


def _finish(node: Node, spec: optree.PyTreeSpec, out: list[Any], batch_size: Any) -> Any:
    if batch_size is None:
        return optree.tree_unflatten(spec, out)
    it = iter(out)
    return rebuild(node, lambda _: next(it), as_batch_size(batch_size))


@tag_rule
def apply(node: Node, fn: Callable[..., torch.Tensor], *others: Node, batch_size: Any = None) -> Node:
    """A node with ``fn(leaf, *matching leaves of others)`` at every leaf.

    ``others`` are nodes paired with ``node`` by key whatever their tags
    (KeyMismatchError naming the keys otherwise). The result has ``node``'s
    keys and batch sizes, or ``batch_size`` at the root when given (sub-nodes
    keep their extra batch dims). ``fn``'s results are not checked: each must
    start with the result's batch size. Tags follow the rule: kept when every
    result leaf reuses an input's storage (``fn = lambda x: x[...]``), else dropped.
    """
    spec, out = _results("apply", fn, node, others, False)
    return _finish(node, spec, out, batch_size)


@tag_rule
def named_apply(node: Node, fn: Callable[..., torch.Tensor], *others: Node, batch_size: Any = None) -> Node:
    """Like :func:`apply` with ``fn(key, leaf, *others' leaves)``.

    ``key`` is spelled as in ``keys(include_nested=True)``: a str at the top
    level, a tuple of str below it. Tags follow the rule.
    """
    spec, out = _results("named_apply", fn, node, others, True)
    return _finish(node, spec, out, batch_size)
