"""Leaf-wise maps over nodes, through optree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch

from ._base import Node, make
from ._pytree import NAMESPACE
from ._tags import tag_rule

__all__ = ["map_leaves", "clone"]


def map_leaves(fn: Callable[..., Any], node: Node, *others: Node) -> Any:
    """``fn`` applied to every leaf (and the matching leaves of ``others``); same structure."""
    return optree.tree_map(fn, node, *others, namespace=NAMESPACE)


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
