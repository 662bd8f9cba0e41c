"""Combining nodes (``stack``, ``cat``) and the ``torch.*`` functions that accept nodes.

``dim`` always counts batch dims: a negative dim counts from the end of the
root's batch dims, never from the end of a leaf's shape. Nodes combine by key
whatever their tags; every node must hold the same keys (KeyMismatchError) and
fitting batch sizes (BatchSizeError naming the shapes). A sub-node's extra
batch dims are kept. Results hold new storage, so the tag rule drops tags.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _ops
from ._base import Node
from ._maps import flat, map_leaves, paired_leaves, rebuild
from ._tags import tag_rule
from ._validate import dim_index
from .errors import BatchDimError

__all__ = ["stack", "cat", "zeros_like", "ones_like", "full_like", "empty_like", "torch_function"]


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


@tag_rule
def stack(nodes: Sequence[Node], dim: int = 0) -> Node:
    """The nodes stacked along a new batch dim ``dim`` (``-batch_ndim - 1 <= dim <= batch_ndim``).

    Every node must have the same keys and batch size. Returns a new node
    whose batch size has ``len(nodes)`` at ``dim``; tags dropped (new storage).

    Raises:
        KeyMismatchError: the key sets differ (the message names the keys).
        BatchSizeError: the batch sizes differ (the message names them).
        BatchDimError: ``dim`` is out of range.
    """
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
    out = iter([torch.stack(group, d) for group in zip(*columns)])
    return rebuild(first, lambda _: next(out), torch.Size((*batch_size[:d], len(nodes), *batch_size[d:])))


@tag_rule
def cat(nodes: Sequence[Node], dim: int = 0) -> Node:
    """The nodes concatenated along batch dim ``dim`` (``-batch_ndim <= dim < batch_ndim``).

    Every node must have the same keys, and batch sizes equal except at
    ``dim``. Returns a new node; tags dropped (new storage).

    Raises:
        KeyMismatchError: the key sets differ (the message names the keys).
        BatchSizeError: the batch sizes differ outside ``dim`` (the message names them).
        BatchDimError: ``dim`` is out of range (a node with batch_size () has no dim to cat along).
    """
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
    out = iter([torch.cat(group, d) for group in zip(*columns)])
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

_OVERRIDES: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.stack: stack,
    torch.cat: cat,
    torch.concat: cat,
    torch.concatenate: cat,
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
    constructors, and a tensor's binary operators with a node on the right.
    """
    impl = _OVERRIDES.get(func)
    if impl is not None:
        return impl(*args, **(kwargs or {}))
    flipped = _REFLECTED.get(func)
    if flipped is not None and not kwargs and len(args) == 2 and isinstance(args[1], Node):
        return flipped(args[1], args[0])
    return NotImplemented
