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
