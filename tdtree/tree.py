"""optree's tree functions with the ``"tdtree"`` namespace passed for you.

``tdtree.tree.map(fn, tree)`` is ``optree.tree_map(fn, tree, namespace="tdtree")``;
signatures and argument order are optree's.
"""

from __future__ import annotations

from typing import Any, Callable

import optree

from ._pytree import NAMESPACE

__all__ = ["map", "flatten", "unflatten", "leaves", "structure", "flatten_with_path", "map_with_path"]


def map(func: Callable[..., Any], tree: Any, /, *rests: Any, is_leaf: Callable[[Any], bool] | None = None, none_is_leaf: bool = False) -> Any:  # noqa: A001
    """``func`` applied to each leaf of ``tree`` (and the matching leaves of ``rests``)."""
    return optree.tree_map(func, tree, *rests, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def map_with_path(func: Callable[..., Any], tree: Any, /, *rests: Any, is_leaf: Callable[[Any], bool] | None = None, none_is_leaf: bool = False) -> Any:
    """``func(path, leaf, ...)`` for each leaf; the path is a tuple of keys."""
    return optree.tree_map_with_path(func, tree, *rests, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def flatten(tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False) -> tuple[list[Any], optree.PyTreeSpec]:
    """The leaves of ``tree`` and its structure."""
    return optree.tree_flatten(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def flatten_with_path(tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False) -> tuple[list[Any], list[Any], optree.PyTreeSpec]:
    """The paths, leaves and structure of ``tree``."""
    return optree.tree_flatten_with_path(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def unflatten(treespec: optree.PyTreeSpec, leaves: Any, /) -> Any:
    """The tree of structure ``treespec`` holding ``leaves``."""
    return optree.tree_unflatten(treespec, leaves)


def leaves(tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False) -> list[Any]:
    """The leaves of ``tree`` in canonical order."""
    return optree.tree_leaves(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def structure(tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False) -> optree.PyTreeSpec:
    """The structure of ``tree`` (tags and batch sizes included)."""
    return optree.tree_structure(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)
