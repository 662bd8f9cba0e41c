"""optree's tree functions with the ``"tdtree"`` namespace passed for you.

``tdtree.tree.map(fn, tree)`` is ``optree.tree_map(fn, tree, namespace="tdtree")``;
signatures and argument order are optree's. Two differences, both about tags:

* ``map`` and ``map_with_path`` apply the tag rule with every tree argument as
  an input: the result keeps the common tags only when every leaf reuses an
  input's storage (``map(lambda x: x, sh)`` keeps ``sh``'s tags, ``map(lambda
  x: x + 1, sh)`` carries none), and they pair trees whose nodes differ only in
  tags, as binary node operations do.
* ``unflatten`` has no inputs, so it builds untagged nodes, whatever tags the
  structure was flattened with (a node built from leaves alone claims nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree

from ._base import NO_TAGS, Holder, Node
from ._maps import map_leaves
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
    their nodes' tags): ``optree.tree_map`` in the ``"tdtree"`` namespace.

    Args:
        func: called with one leaf of each tree; returns the new leaf.
        tree: a pytree (nodes, tensorclasses, dicts, lists, tuples, ...) in the ``"tdtree"`` namespace.
        *rests: trees with ``tree``'s structure (their nodes may carry other tags).
        is_leaf: a predicate that stops the walk at the subtrees it accepts (they become leaves).
        none_is_leaf: treat None as a leaf rather than an empty subtree.

    Returns:
        A tree of ``tree``'s structure holding ``func``'s results. Tags follow the rule with every
        tree as an input: kept only when every leaf of the result reuses a storage of the inputs.

    Raises:
        ValueError: a tree of ``rests`` has another structure (optree's error).

    >>> import torch, tdtree
    >>> sh = tdtree.TensorDict({"x": torch.zeros(2)}).share_memory()
    >>> map(lambda x: x, sh).tags == sh.tags, map(lambda x: x + 1, sh).tags
    (True, frozenset())
    """
    if not rests and is_leaf is None and isinstance(tree, Node):
        # a node holds only tensors and nodes: its own walk gives optree's result (leaves in the same
        # order, nodes untagged with their metadata), and compiles at any depth, where dynamo inlines
        # optree's recursive flatten a frame per level
        return map_leaves(func, tree)
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
    """``func(path, leaf, *rest_leaves)`` for each leaf: ``optree.tree_map_with_path`` in the ``"tdtree"`` namespace.

    Args:
        func: called with the leaf's path (a tuple of keys: a node contributes its keys, a list
            its indices) and one leaf of each tree.
        tree: a pytree (nodes, tensorclasses, dicts, lists, tuples, ...) in the ``"tdtree"`` namespace.
        *rests: trees with ``tree``'s structure.
        is_leaf: a predicate that stops the walk at the subtrees it accepts (they become leaves).
        none_is_leaf: treat None as a leaf rather than an empty subtree.

    Returns:
        A tree of ``tree``'s structure holding ``func``'s results; tags and pairing as in :func:`map`.

    Raises:
        ValueError: a tree of ``rests`` has another structure (optree's error).
    """
    return _paired(optree.tree_map_with_path, func, tree, rests, is_leaf, none_is_leaf)


def flatten(
    tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False
) -> tuple[list[Any], optree.PyTreeSpec]:
    """The leaves of ``tree`` and its structure (``optree.tree_flatten`` in the ``"tdtree"`` namespace).

    Args:
        tree: a pytree (nodes, tensorclasses, dicts, lists, tuples, ...) in the ``"tdtree"`` namespace.
        is_leaf: a predicate that stops the walk at the subtrees it accepts (they become leaves).
        none_is_leaf: treat None as a leaf rather than an empty subtree.

    Returns:
        ``(leaves, treespec)``: the leaves in canonical order (node keys sorted) and the structure,
        which holds each node's keys, batch size, device and tags.

    >>> import torch, tdtree as tt
    >>> leaves, spec = tt.tree.flatten({"a": tt.TensorDict({"x": torch.zeros(1), "y": torch.ones(1)})})
    >>> leaves, spec.num_leaves
    ([tensor([0.]), tensor([1.])], 2)
    """
    return optree.tree_flatten(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def flatten_with_path(
    tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False
) -> tuple[list[Any], list[Any], optree.PyTreeSpec]:
    """The paths, leaves and structure of ``tree`` (``optree.tree_flatten_with_path``, ``"tdtree"`` namespace).

    Args:
        tree: a pytree (nodes, tensorclasses, dicts, lists, tuples, ...) in the ``"tdtree"`` namespace.
        is_leaf: a predicate that stops the walk at the subtrees it accepts (they become leaves).
        none_is_leaf: treat None as a leaf rather than an empty subtree.

    Returns:
        ``(paths, leaves, treespec)``: each leaf's path (a tuple of keys), the leaves in
        canonical order, and the structure.
    """
    return optree.tree_flatten_with_path(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def unflatten(treespec: optree.PyTreeSpec, leaves: Any, /) -> Any:
    """The tree of structure ``treespec`` holding ``leaves`` (``optree.tree_unflatten``).

    Args:
        treespec: a structure from :func:`flatten` or :func:`structure`.
        leaves: an iterable of as many leaves as ``treespec`` has, in its order.

    Returns:
        The tree. Its nodes are untagged, whatever tags ``treespec`` recorded: there are no
        inputs to check a claim against.

    Raises:
        ValueError: the number of leaves differs from ``treespec``'s (optree's error).
    """
    return optree.tree_unflatten(treespec, leaves)


def leaves(tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False) -> list[Any]:
    """The leaves of ``tree`` in canonical order (node keys sorted): ``optree.tree_leaves``, ``"tdtree"`` namespace.

    Args:
        tree: a pytree (nodes, tensorclasses, dicts, lists, tuples, ...) in the ``"tdtree"`` namespace.
        is_leaf: a predicate that stops the walk at the subtrees it accepts (they become leaves).
        none_is_leaf: treat None as a leaf rather than an empty subtree.

    Returns:
        A list of the leaves.
    """
    return optree.tree_leaves(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)


def structure(
    tree: Any, /, is_leaf: Callable[[Any], bool] | None = None, *, none_is_leaf: bool = False
) -> optree.PyTreeSpec:
    """The structure of ``tree``: ``optree.tree_structure`` in the ``"tdtree"`` namespace.

    Args:
        tree: a pytree (nodes, tensorclasses, dicts, lists, tuples, ...) in the ``"tdtree"`` namespace.
        is_leaf: a predicate that stops the walk at the subtrees it accepts (they become leaves).
        none_is_leaf: treat None as a leaf rather than an empty subtree.

    Returns:
        A ``PyTreeSpec`` holding each node's keys, batch size, device and tags: nodes that differ
        only in tags have different structures.
    """
    return optree.tree_structure(tree, is_leaf=is_leaf, none_is_leaf=none_is_leaf, namespace=NAMESPACE)
