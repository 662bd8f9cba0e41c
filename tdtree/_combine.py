"""Combining nodes and tensorclass instances (``tdtree.stack``, ``tdtree.cat``) and the ``torch.*``
functions that accept nodes.

``dim`` always counts batch dims: a negative dim counts from the end of the
root's batch dims, never from the end of a leaf's shape. Nodes combine by key
whatever their tags; every node must hold the same keys (KeyMismatchError) and
fitting batch sizes (BatchSizeError naming the shapes). A sub-node's extra
batch dims are kept. Tensorclass instances combine as their inner nodes do, when
they are of one class with equal static fields (their :func:`tdtree._base.layout`).
Results hold new storage, so the tag rule drops tags.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from . import _ops
from ._base import Holder, Node, layout
from ._maps import flat, leafwise, map_leaves, paired_leaves, rebuild
from ._tags import tag_rule
from ._torch_private import through_higher_order
from ._validate import dim_index
from .errors import BatchDimError

__all__ = ["stack", "cat", "COMBINING", "zeros_like", "ones_like", "full_like", "empty_like", "torch_function"]

T = TypeVar("T", bound="Node | Holder")


def _check_nodes(what: str, nodes: Sequence[Node]) -> None:
    if not isinstance(nodes, (list, tuple)) or not nodes:
        raise ValueError(f"{what} takes a non-empty list or tuple of nodes, got {nodes!r}")
    for i, node in enumerate(nodes):
        if not isinstance(node, Node):
            raise TypeError(f"{what}: item {i} is a {type(node).__name__}, not a node")


def _columns(what: str, nodes: Sequence[Node], skip: int | None) -> list[list[torch.Tensor]]:
    """The leaves of every node, paired by key with the first node's."""
    first = nodes[0]
    leaves, _ = flat(first)
    return [leaves, *(paired_leaves(what, first, node, skip) for node in nodes[1:])]


def _combined(what: str, fn: Callable[[Sequence[Node], int], Node], items: Sequence[Any], dim: int) -> Any:
    """``fn`` of the nodes ``items``, or of the inner nodes of the tensorclass instances ``items``
    rewrapped as the first (which needs one class and equal static fields)."""
    if not isinstance(items, (list, tuple)) or not items or not isinstance(items[0], Holder):
        return fn(items, dim)
    first = items[0]
    shape = layout(first)
    for i, item in enumerate(items):
        if type(item) is not type(first):
            raise TypeError(f"{what}: item {i} is a {type(item).__name__}, not a {type(first).__name__}")
        if layout(item) != shape:
            raise ValueError(
                f"{what}: item {i}'s static fields {layout(item)[1]} differ from item 0's {shape[1]}; "
                "instances combine only with equal static fields"
            )
    return first._wrap(fn([item._td for item in items], dim))


def stack(items: Sequence[T], dim: int = 0) -> T:
    """Nodes, or instances of one tensorclass with equal static fields, stacked along a new batch dim
    ``dim`` (``-batch_ndim - 1 <= dim <= batch_ndim``).

    Every node must have the same keys and batch size. Returns a new node (an
    instance of the class) whose batch size has ``len(items)`` at ``dim``; tags
    dropped (new storage).

    Raises:
        KeyMismatchError: the key sets differ (the message names the keys).
        BatchSizeError: the batch sizes differ (the message names them).
        BatchDimError: ``dim`` is out of range.
        TypeError: an item is not a node, or not of the first instance's class.
        ValueError: an instance's static fields differ from the first's.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    >>> tt.stack([td, td + 1], dim=1)["x"]
    tensor([[0., 1.],
            [0., 1.],
            [0., 1.]])
    """
    return _combined("stack", _stack, items, dim)  # type: ignore[no-any-return]


def cat(items: Sequence[T], dim: int = 0) -> T:
    """Nodes, or instances of one tensorclass with equal static fields, concatenated along batch dim
    ``dim`` (``-batch_ndim <= dim < batch_ndim``).

    Every node must have the same keys, and batch sizes equal except at
    ``dim``. Returns a new node (an instance of the class); tags dropped (new storage).

    Raises:
        KeyMismatchError: the key sets differ (the message names the keys).
        BatchSizeError: the batch sizes differ outside ``dim`` (the message names them).
        BatchDimError: ``dim`` is out of range (a node with batch_size () has no dim to cat along).
        TypeError: an item is not a node, or not of the first instance's class.
        ValueError: an instance's static fields differ from the first's.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    >>> tt.cat([td, td + 1])["x"]
    tensor([0., 0., 1., 1.])
    """
    return _combined("cat", _cat, items, dim)  # type: ignore[no-any-return]


@tag_rule
def _stack(nodes: Sequence[Node], dim: int = 0) -> Node:
    _check_nodes("stack", nodes)
    first = nodes[0]
    batch_size = first._meta[1]
    n = len(batch_size)
    d = dim_index(dim, n + 1)
    if d is None:
        raise BatchDimError(
            f"stack: dim {dim} is out of range for a new batch dim of batch_size {tuple(batch_size)} "
            f"(allowed: {-n - 1}..{n})"
        )
    columns = _columns("stack", nodes, None)
    out = iter(leafwise("stack", first, torch.stack, list(zip(*columns)), itertools.repeat(d)))
    return rebuild(first, lambda _: next(out), torch.Size((*batch_size[:d], len(nodes), *batch_size[d:])))


@tag_rule
def _cat(nodes: Sequence[Node], dim: int = 0) -> Node:
    _check_nodes("cat", nodes)
    first = nodes[0]
    batch_size = first._meta[1]
    n = len(batch_size)
    d = dim_index(dim, n)
    if d is None:
        raise BatchDimError(
            f"cat: dim {dim} is out of range for the batch_size {tuple(batch_size)}"
            + (f" (allowed: {-n}..{n - 1})" if n else "; stack nodes with batch_size () instead")
        )
    columns = _columns("cat", nodes, d)
    total = 0
    for node in nodes:
        total += node._meta[1][d]
    out = iter(leafwise("cat", first, torch.cat, list(zip(*columns)), itertools.repeat(d)))
    return rebuild(first, lambda _: next(out), torch.Size((*batch_size[:d], total, *batch_size[d + 1 :])))


def _like(name: str, torch_fn: Callable[..., torch.Tensor]) -> Callable[..., Node]:
    def fn(node: Node, *args: Any, **kwargs: Any) -> Node:
        if not args and not kwargs:  # torch_fn itself: no wrapper call per leaf
            return map_leaves(torch_fn, node)
        return map_leaves(lambda x: torch_fn(x, *args, **kwargs), node)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"``torch.{name}`` of every leaf (extra arguments passed on). Returns a new node with the same keys "
        "and batch sizes; tags dropped (new storage)."
    )
    return tag_rule(fn)


zeros_like = _like("zeros_like", torch.zeros_like)
ones_like = _like("ones_like", torch.ones_like)
full_like = _like("full_like", torch.full_like)
empty_like = _like("empty_like", torch.empty_like)

# torch's combining functions, for nodes and tensorclass instances alike (both answer them in
# ``__torch_function__``)
COMBINING: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.stack: stack,
    torch.cat: cat,
    torch.concat: cat,
    torch.concatenate: cat,
}
_OVERRIDES: dict[Callable[..., Any], Callable[..., Any]] = {
    **COMBINING,
    torch.zeros_like: zeros_like,
    torch.ones_like: ones_like,
    torch.full_like: full_like,
    torch.empty_like: empty_like,
}


_T = torch._C.TensorBase
# ``tensor OP node``: torch's operator hands the pair to __torch_function__ first; answering here
# (rather than declining and letting Python call node.__rOP__) is what dynamo can trace.
_REFLECTED: dict[Callable[..., Any], Callable[[Node, Any], Any]] = {
    _T.add: _ops.radd,
    _T.sub: _ops.rsub,
    _T.mul: _ops.rmul,
    _T.div: _ops.rtruediv,
    torch.Tensor.__floordiv__: _ops.rfloordiv,
    _T.remainder: _ops.rmod,
    torch.Tensor.__pow__: _ops.rpow,
    _T.eq: _ops.eq,
    _T.ne: _ops.ne,
    _T.lt: _ops.gt,
    _T.le: _ops.ge,
    _T.gt: _ops.lt,
    _T.ge: _ops.le,
}


def torch_function(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """The node version of ``func`` applied to ``args``, or NotImplemented for other torch functions.

    Handles ``torch.stack``/``cat``/``concat``/``concatenate`` and the ``*_like``
    constructors, and a tensor's binary operators with a node on the right. A higher-order
    operator (which only dynamo routes here) is handed back to torch, which takes the node as
    the pytree it is, as it takes a dict (DESIGN §5.1).
    """
    impl = _OVERRIDES.get(func)
    if impl is not None:
        return impl(*args, **(kwargs or {}))
    flipped = _REFLECTED.get(func)
    if flipped is not None and not kwargs and len(args) == 2 and isinstance(args[1], Node):
        return flipped(args[1], args[0])
    return through_higher_order(func, args, kwargs)
