"""Leaf-wise maps over nodes: flatten, unflatten and map by walking the nodes' ``_data``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import optree
import torch

from ._base import NO_TAGS, Node, NodeT, with_meta
from ._keys import display
from ._kinds import odd, refuse
from ._lookup import walk, walk_keys
from ._pytree import NAMESPACE
from ._tags import tag_rule
from ._torch_private import substitute_in_graph
from ._validate import as_batch_size
from .errors import BatchSizeError, KeyMismatchError

__all__ = [
    "map_leaves",
    "clone",
    "rebuild",
    "apply",
    "named_apply",
    "leaves",
    "flat",
    "unflat",
    "unflat_scalar",
    "flat_tree",
    "unflat_tree",
    "check_same_keys",
    "paired_leaves",
    "leafwise",
    "retried",
    "refuse_first",
]


# optree reaches a node's children through a Python callback and checks every tensor leaf
# against its registry (~0.35 us a leaf here); nodes hold only tensors and nodes, so the
# traversals below walk ``_data`` directly and keep the node itself as the structure. They walk
# from an explicit stack of the levels above, not by recursion: a node is as deep as a nested dict
# gets, at any recursion depth of the caller; a flat node never touches the stack.
#
# Compiled code runs traced twins of the walks (registered with substitute_in_graph), each one loop
# over a stack of plain lists: dynamo inlines every Python call as a frame of its own, a dozen
# interpreter frames deep, and the twins also build each result node with a fresh metadata tuple and
# the top's type, where reading them from a deep spec node makes dynamo emit code that reaches them
# by a path as deep as the tree.


def _rebuilt_traced(spec: Node, leaf_fn: Callable[[Any], Any], meta_of: Callable[[Node], tuple]) -> Node:
    """A node of ``spec``'s keys with ``leaf_fn(leaf)`` at every leaf, called in canonical order, and
    each node untagged with the metadata ``meta_of(node)``: the rebuilding walk's traced twin."""
    # one frame per node on the path being walked: [node, its entries, the next entry's index, new data]
    stack: list[list[Any]] = [[spec, list(spec._data.items()), 0, {}]]
    root = type(spec)._root
    while True:
        frame = stack[-1]
        entries, i = frame[1], frame[2]
        if i < len(entries):
            frame[2] = i + 1
            k, v = entries[i]
            if isinstance(v, Node):
                stack.append([v, list(v._data.items()), 0, {}])
            else:
                frame[3][k] = leaf_fn(v)
            continue
        stack.pop()
        node = frame[0]
        kind = type(node)._root
        built = with_meta(root if kind is root else kind, frame[3], meta_of(node))
        if not stack:
            return built
        parent = stack[-1]
        parent[3][parent[1][parent[2] - 1][0]] = built


def leaves(node: Node) -> list[Any]:
    """The node's leaves in canonical order (depth first, keys sorted): optree's order."""
    out: list[Any] = []
    values = iter(node._data.values())
    above = []  # the iterators of the levels above, each where it left off
    while True:
        for v in values:
            if isinstance(v, Node):
                above.append(values)
                values = iter(v._data.values())
                break
            out.append(v)
        else:
            if not above:
                return out
            values = above.pop()


@substitute_in_graph(leaves)
def _leaves_traced(node: Node) -> list[Any]:
    out: list[Any] = []
    stack: list[Any] = list(node._data.values())[::-1]
    while stack:
        v = stack.pop()
        if isinstance(v, Node):
            stack.extend(list(v._data.values())[::-1])
        else:
            out.append(v)
    return out


def flat(node: Node) -> tuple[list[Any], Node]:
    """The node's leaves in canonical order and its structure (the node itself, for :func:`unflat`)."""
    return leaves(node), node


def _refill(
    spec: Node,
    take: Callable[[], Any] | None,
    leaf_fn: Callable[[Any], Any] | None = None,
    root: torch.Size | None = None,
    n: int = 0,
) -> Any:
    """The one rebuilding walk: a node of ``spec``'s type, keys and metadata (untagged) holding
    ``take()`` at each leaf in leaf order (``leaf_fn(leaf)`` when ``take`` is None). With ``root``,
    ``spec`` has ``n`` batch dims and the result's root gets ``root`` in their place, each sub-node
    ``root`` followed by its own extra batch dims."""
    data: dict[str, Any] = {}
    items = iter(spec._data.items())
    above = []  # (spec, items, data, key) of the levels above, each where it left off
    k, v = "", None  # the key and leaf being mapped, for the except path
    try:
        while True:
            for k, v in items:
                if isinstance(v, Node):
                    above.append((spec, items, data, k))
                    spec, items, data = v, iter(v._data.items()), {}
                    break
                data[k] = leaf_fn(v) if take is None else take()  # type: ignore[misc]
            else:
                meta = spec._meta
                if root is not None:
                    keys, batch_size, device, _ = meta
                    size = root if len(batch_size) == n else torch.Size((*root, *batch_size[n:]))
                    meta = (keys, size, device, NO_TAGS)
                node = with_meta(type(spec), data, meta)
                if not above:
                    return node
                spec, items, data, k = above.pop()
                data[k] = node
    except Exception as exc:
        if take is None:  # leaf_fn(v) failed at key k: named when v is of a kind the operations are not made for
            refuse("", display((*(level[3] for level in above), k)), (v,), exc)
        raise


@substitute_in_graph(_refill)
def _refill_traced(
    spec: Node,
    take: Callable[[], Any] | None,
    leaf_fn: Callable[[Any], Any] | None = None,
    root: torch.Size | None = None,
    n: int = 0,
) -> Any:
    def meta_of(node: Node) -> tuple:
        keys, batch_size, device, _ = node._meta
        if root is not None:
            batch_size = root if len(batch_size) == n else torch.Size((*root, *batch_size[n:]))
        return (keys, batch_size, device, NO_TAGS)

    fn = leaf_fn if take is None else (lambda _: take())  # type: ignore[misc]
    return _rebuilt_traced(spec, fn, meta_of)  # type: ignore[arg-type]


def flat_tree(tree: Any) -> tuple[list[Any], Any]:
    """Any tree's leaves and structure (namespace ``"tdtree"``): a node by :func:`flat`, anything else by optree."""
    return flat(tree) if isinstance(tree, Node) else optree.tree_flatten(tree, namespace=NAMESPACE)


def unflat_tree(spec: Any, values: Iterable[Any]) -> Any:
    """The tree :func:`flat_tree` gave ``spec`` for, holding ``values``; its nodes untagged."""
    return unflat(spec, values) if isinstance(spec, Node) else optree.tree_unflatten(spec, values)


def unflat(spec: Node, values: Iterable[Any], batch_size: torch.Size | None = None) -> Any:
    """A node of ``spec``'s type, keys and metadata holding ``values`` in leaf order (optree's unflatten).

    With ``batch_size`` (a ``torch.Size``) the root gets it in place of ``spec``'s and every
    sub-node gets it followed by its own extra batch dims, as :func:`rebuild` gives them; the
    values must fit (nothing is checked). The result is untagged.
    """
    take = iter(values).__next__
    return _refill(spec, take) if batch_size is None else _refill(spec, take, None, batch_size, len(spec._meta[1]))


def unflat_scalar(spec: Node, values: Iterable[Any]) -> Any:
    """:func:`unflat` with batch size () at every level, sub-nodes included: a node of per-leaf
    values whose shapes are their own (a leaf's norm). Untagged."""
    # an n past every batch size, so that no sub-node keeps batch dims of its own
    return _refill(spec, iter(values).__next__, None, torch.Size(), sys.maxsize)


def map_leaves(fn: Callable[..., Any], node: Node, *others: Node) -> Any:
    """``fn`` applied to every leaf (and the matching leaves of ``others``); same structure."""
    if others:
        # optree's stub is wrong here: it types a tree as PyTree[T], a union optree builds at runtime,
        # which mypy reads as a class that no actual tree (tuple, node) is an instance of
        return optree.tree_map(fn, node, *others, namespace=NAMESPACE)  # type: ignore[arg-type]
    return _refill(node, None, fn)


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
    left = set(walk_keys(a, True, True))
    right = set(walk_keys(b, True, True))
    if left == right:
        left = set(walk_keys(a, True, False))
        right = set(walk_keys(b, True, False))
    raise KeyMismatchError(what, left, right)


def _pair(a: Node, b: Node, out: list[Any], skip: int | None) -> bool:
    """Collect ``b``'s leaves into ``out`` while ``b`` has ``a``'s keys and batch sizes (which may
    differ at batch dim ``skip``); False at the first difference."""
    pairs = None
    above = []  # the pairs of the levels above, as leaves() walks
    while True:
        if pairs is None:  # entering a, b
            ma, mb = a._meta, b._meta
            if ma[0] != mb[0] or (ma[1] != mb[1] and (skip is None or not _fits(ma[1], mb[1], skip))):
                return False
            pairs = zip(a._data.values(), b._data.values())
        for a, b in pairs:
            if isinstance(a, Node):
                if not isinstance(b, Node):
                    return False
                above.append(pairs)
                pairs = None
                break
            if isinstance(b, Node):
                return False
            out.append(b)
        else:
            if not above:
                return True
            pairs = above.pop()


@substitute_in_graph(_pair)
def _pair_traced(a: Node, b: Node, out: list[Any], skip: int | None) -> bool:
    stack: list[tuple[Any, Any]] = [(a, b)]
    while stack:
        v, w = stack.pop()
        if not isinstance(v, Node):
            if isinstance(w, Node):
                return False
            out.append(w)
            continue
        if not isinstance(w, Node):
            return False
        mv, mw = v._meta, w._meta
        if mv[0] != mw[0] or (mv[1] != mw[1] and (skip is None or not _fits(mv[1], mw[1], skip))):
            return False
        stack.extend(list(zip(v._data.values(), w._data.values()))[::-1])
    return True


def paired_leaves(what: str, node: Node, other: Node, skip: int | None = None) -> list[Any]:
    """The leaves of ``other`` in the order of ``node``'s leaves.

    Raises as :func:`check_same_keys` when the two do not pair.
    """
    out: list[Any] = []
    if _pair(node, other, out, skip):
        return out
    check_same_keys(what, node, other, skip)
    return leaves(other)


@tag_rule
def clone(node: NodeT, recurse: bool = True) -> NodeT:
    """A copy of the node.

    Args:
        node: the node (``self`` as a method).
        recurse: clone every leaf (new storage); False: a new root node over the same leaves
            and sub-nodes.

    Returns:
        The copy. With ``recurse``, tags dropped (new storage); without it, tags kept.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.zeros(2)}).lock()
    >>> td.clone().tags, td.clone(recurse=False)["x"] is td["x"]
    (frozenset(), True)
    """
    if recurse:
        return map_leaves(torch.clone, node)
    # Nodes are immutable, so new sub-node objects could only differ by identity: sharing them makes the
    # shallow copy cost the same for 1 key or 1,000.
    return with_meta(type(node), node._data, node._meta)


def rebuild(node: Node, leaf_fn: Callable[[torch.Tensor], Any], root_batch: torch.Size) -> Any:
    """A node of the same keys with ``leaf_fn(leaf)`` for every leaf and batch size ``root_batch``.

    Sub-nodes get ``root_batch`` followed by their own extra batch dims, so an
    operation on the root's batch dims leaves a sub-node's extra dims alone.
    This is the one traversal for operations that change batch sizes
    (:func:`map_leaves` keeps metadata as it is).
    """
    root_size = root_batch if type(root_batch) is torch.Size else torch.Size(root_batch)
    return _refill(node, None, leaf_fn, root_size, len(node._meta[1]))


def leafwise(op: str, node: Node, fn: Callable[..., Any], *columns: Any) -> list[Any]:
    """``fn`` over the rows of ``columns`` (lists in ``node``'s leaf order, or iterables repeating one
    argument), in order: the list of results.

    Where ``fn`` fails on a row holding a tensor of a kind the operations are not made for (sparse,
    nested, quantized, mkldnn), LeafError naming ``op``, that row's key in ``node`` and the kind, with
    the failure chained; any other failure as it was.
    """
    out: list[Any] = []
    try:
        # list.extend keeps the results taken before a failure: their count is the failing row
        out.extend(map(fn, *columns))
    except Exception as exc:
        i = len(out)
        row = [c[i] for c in columns if type(c) is list or type(c) is tuple]
        refuse(op, walk_keys(node, True, True)[i], row, exc)
        raise
    return out


def retried(op: str, node: Node, fn: Callable[..., Any], *columns: Any) -> list[Any] | None:
    """In the ``except`` path of ``op``, which failed over the whole leaf list at once (a foreach
    kernel, a comprehension): :func:`leafwise` ``fn`` over the rows again when a leaf of ``columns``'
    lists is of a kind the operations are not made for, so that what torch computes leaf by leaf is
    given (a foreach kernel may refuse a kind its per-leaf op takes) and a leaf it fails on is named;
    None when no leaf is of such a kind (the caller re-raises its failure)."""
    if not any(odd(c) for c in columns if type(c) is list or type(c) is tuple):
        return None
    return leafwise(op, node, fn, *columns)


def refuse_first(op: str, node: Node, probe: Callable[[Any], Any], exc: BaseException) -> None:
    """In the ``except`` path of ``op``, which failed with ``exc`` reading ``node``'s leaves in a way
    that does not tell which one (a generator, a foreach kernel): LeafError naming the first leaf that
    ``probe(leaf)`` fails on, when it is of a kind the operations are not made for, chained to that
    failure. Returns otherwise (the caller re-raises ``exc``)."""
    for key, leaf in walk(node, True, True):
        try:
            probe(leaf)
        except Exception as err:  # noqa: BLE001 - whatever torch raises, refuse decides
            refuse(op, key, (leaf,), err)
            return


def _results(what: str, fn: Callable[..., Any], node: Node, others: tuple[Node, ...], named: bool) -> Any:
    values, spec = flat(node)
    columns = [paired_leaves(what, node, other) for other in others]
    if named:
        return spec, leafwise(what, node, fn, walk_keys(node, True, True), values, *columns)
    return spec, leafwise(what, node, fn, values, *columns)


def _finish(spec: Node, out: list[Any], batch_size: Any) -> Any:
    return unflat(spec, out, None if batch_size is None else as_batch_size(batch_size))


@tag_rule
def apply(node: NodeT, fn: Callable[..., torch.Tensor], *others: Node, batch_size: Any = None) -> NodeT:
    """A node with ``fn(leaf, *matching leaves of others)`` at every leaf.

    Args:
        node: the node (``self`` as a method).
        fn: called once per leaf with the leaf and the leaves at the same key in ``others``;
            returns a tensor.
        *others: nodes paired with ``node`` by key, whatever their tags.
        batch_size: the root's batch size of the result (sub-nodes keep their extra batch
            dims); None: ``node``'s.

    Returns:
        A node with ``node``'s keys and the results; ``fn``'s results are not checked, so each
        must start with the result's batch size. Tags follow the rule: kept when every result
        leaf reuses an input's storage (``fn = lambda x: x[...]``), else dropped.

    Raises:
        KeyMismatchError: a node of ``others`` holds other keys (the message lists them).
        BatchSizeError: a node of ``others`` has other batch sizes.
        TypeError, ValueError: ``batch_size`` is not a sequence of non-negative ints.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.ones(2, 3)}, batch_size=[2])
    >>> td.apply(lambda x, y: x * y, td + 1)["x"].sum().item(), td.apply(lambda x: x[..., 0])["x"].shape
    (12.0, torch.Size([2]))
    """
    spec, out = _results("apply", fn, node, others, False)
    return _finish(spec, out, batch_size)


@tag_rule
def named_apply(node: NodeT, fn: Callable[..., torch.Tensor], *others: Node, batch_size: Any = None) -> NodeT:
    """Like :func:`apply` with ``fn(key, leaf, *others' leaves)``.

    Args:
        node: the node (``self`` as a method).
        fn: called once per leaf with its key, spelled as in ``keys(include_nested=True)`` (a
            str at the top level, a tuple of str below it), the leaf and the matching leaves
            of ``others``; returns a tensor.
        *others: nodes paired with ``node`` by key, whatever their tags.
        batch_size: the root's batch size of the result; None: ``node``'s.

    Returns:
        A node with ``node``'s keys and the results; tags follow the rule, as in :func:`apply`.

    Raises:
        KeyMismatchError, BatchSizeError, TypeError, ValueError: as :func:`apply`.
    """
    spec, out = _results("named_apply", fn, node, others, True)
    return _finish(spec, out, batch_size)
