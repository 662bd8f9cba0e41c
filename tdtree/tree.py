"""optree's tree functions with the ``"tdtree"`` namespace passed for you.

``tdtree.tree.map(fn, tree)`` is ``optree.tree_map(fn, tree, namespace="tdtree")``;
signatures and argument order are optree's. Two differences, both about tags:

* ``map`` and ``map_with_path`` apply the tag rule with every tree argument as
  an input: the result keeps the common tags only when every leaf reuses an
  input's storage (``map(lambda x: x, sh)`` keeps ``sh``'s tags, ``map(lambda
  x: x + 1, sh)`` carries none), and they pair trees whose nodes differ only in
  tags, as binary node operations do.
* ``unflatten`` has no inputs, so it builds untagged nodes, whatever tags the
  structure was flattened with (DESIGN 3.1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree

from ._base import NO_TAGS, Holder, Node
from ._pytree import NAMESPACE
from ._tags import holds_tagged, retag, tag_rule

__all__ = ["map", "flatten", "unflatten", "leaves", "structure", "flatten_with_path", "map_with_path"]


def _untagged_node(x: Any) -> Any:
    if isinstance(x, Holder):
        return x._wrap(retag(x._td, NO_TAGS))
    return retag(x, NO_TAGS)


def _untagged(tree: Any) -> Any:
    """``tree`` with every node in it untagged (the same leaves): a structure that pairs with
    trees whose nodes carry other tags."""
    return optree.tree_map(
        _untagged_node,
        tree,
        is_leaf=lambda x: isinstance(x, (Node, Holder)),
        namespace=NAMESPACE,  # type: ignore[arg-type]
    )


def _paired(
    how: Callable[..., Any],
    func: Callable[..., Any],
    tree: Any,
    rests: tuple[Any, ...],
    is_leaf: Any,
    none_is_leaf: bool,
) -> Any:
    if rests and any(holds_tagged(t) for t in (tree, *rests)):
        # trees whose nodes differ only in tags pair, as binary node operations pair them
        tree, rests = _untagged(tree), tuple(_untagged(r) for r in rests)
    return how(func, tree, *rests, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


@tag_rule
def map(
    func: Callable[..., Any],
    tree: Any,
    /,
    *rests: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    none_is_leaf: bool = False,
) -> Any:  # noqa: A001
    """``func`` applied to each leaf of ``tree`` (and the matching leaves of ``rests``, paired whatever
    their nodes' tags).

    Tags follow the rule with every tree as an input: kept only when every leaf of the
    result reuses a storage of the inputs.

    >>> import torch, tdtree
    >>> sh = tdtree.TensorDict({"x": torch.zeros(2)}).share_memory()
    >>> map(lambda x: x, sh).tags == sh.tags, map(lambda x: x + 1, sh).tags
    (True, frozenset())
    """
    return _paired(optree.tree_map, func, tree, rests, is_leaf, none_is_leaf)


@tag_rule
def map_with_path(
    func: Callable[..., Any],
    tree: Any,
    /,
    *rests: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    none_is_leaf: bool = False,
) -> Any:
    """``func(path, leaf, ...)`` for each leaf; the path is a tuple of keys. Tags and pairing as in :func:`map`."""
    return _paired(optree.tree_map_with_path, func, tree, rests, is_leaf, none_is_leaf)


def flatten(
    tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False
) -> tuple[list[Any], optree.PyTreeSpec]:
    """The leaves of ``tree`` and its structure."""
    return optree.tree_flatten(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def flatten_with_path(
    tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False
) -> tuple[list[Any], list[Any], optree.PyTreeSpec]:
    """The paths, leaves and structure of ``tree``."""
    return optree.tree_flatten_with_path(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def unflatten(treespec: optree.PyTreeSpec, leaves: Any, /) -> Any:
    """The tree of structure ``treespec`` holding ``leaves``; its nodes are untagged (no inputs to compare with)."""
    return optree.tree_unflatten(treespec, leaves)


def leaves(tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False) -> list[Any]:
    """The leaves of ``tree`` in canonical order."""
    return optree.tree_leaves(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def structure(
    tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False
) -> optree.PyTreeSpec:
    """The structure of ``tree`` (tags and batch sizes included)."""
    return optree.tree_structure(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)
