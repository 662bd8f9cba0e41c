"""Shape operations on the batch dims: view, reshape, permute, ..., unbind, split, chunk.

Every operation acts on the root's batch dims only: feature dims are never
touched, negative dims count from the end of the batch dims, and a nested node
with more batch dims than its parent keeps its extra ones. The new batch size
is computed once, by arithmetic, and each leaf then gets one torch call.
Single-result operations go through :func:`tdtree._maps.rebuild`;
``unbind``/``split``/``chunk`` build all their results in one walk.

Tags follow the rule: the view operations (``view``, ``permute``,
``transpose``, ``squeeze``, ``unsqueeze``, ``flatten``, ``unflatten``,
``expand``, ``unbind``, ``split``, ``chunk``) share storage and keep them;
``reshape`` keeps them exactly when torch returned views.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import methodcaller
from typing import Any

import torch

from ._base import NO_TAGS, Node, NodeT, alike, with_meta
from ._maps import rebuild, refuse_first
from ._tags import tag_rule
from ._validate import dim_index
from .errors import BatchDimError, BatchSizeError

__all__ = [
    "batch_dim",
    "view",
    "reshape",
    "permute",
    "transpose",
    "squeeze",
    "unsqueeze",
    "flatten",
    "unflatten",
    "expand",
    "unbind",
    "split",
    "chunk",
]

Shape = Sequence[int]


def batch_dim(node: Node, dim: int, op: str, extra: int = 0) -> int:
    """``dim`` as a non-negative batch dim of ``node``; ``extra`` widens the range (1 for unsqueeze)."""
    batch = node._meta[1]
    n = len(batch) + extra
    d = dim_index(dim, n)
    if d is None:
        raise BatchDimError(
            f"{op}: dim {dim} is out of range for the batch dims of a node with batch_size {tuple(batch)} "
            f"(expected a dim in [{-n}, {n - 1}]; feature dims cannot be used)"
        )
    return d


def _shape_arg(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """``f(3, 4)``, ``f((3, 4))`` and ``f(torch.Size([3, 4]))`` alike."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    return tuple([int(s) for s in shape])


def _infer(batch: torch.Size, shape: tuple[int, ...], op: str) -> torch.Size:
    """``shape`` with its -1 resolved so it holds as many elements as ``batch``."""
    holes = [i for i, s in enumerate(shape) if s == -1]
    if len(holes) > 1 or any(s < -1 for s in shape):
        raise BatchSizeError(f"{op}: shape {shape} is invalid: sizes are >= 0 with at most one -1")
    total = batch.numel()
    known = math.prod([s for s in shape if s != -1])
    if holes:
        if known == 0 or total % known:
            raise BatchSizeError(f"{op}: shape {shape} is invalid for the batch_size {tuple(batch)} ({total} elements)")
        shape = (*shape[: holes[0]], total // known, *shape[holes[0] + 1 :])
    elif known != total:
        raise BatchSizeError(f"{op}: shape {shape} is invalid for the batch_size {tuple(batch)} ({total} elements)")
    return torch.Size(shape)


@tag_rule
def view(node: NodeT, *shape: Any) -> NodeT:
    """The node with its batch dims viewed as ``shape`` (``td.view(2, -1)``).

    Args:
        node: the node (``self`` as a method).
        *shape: the new batch size, as ints or one sequence; one -1 is inferred. Feature dims stay.

    Returns:
        A new node whose leaves are views of the input's; tags kept.

    Raises:
        BatchSizeError: ``shape`` is invalid or holds another number of elements than the batch.

    torch raises RuntimeError for a leaf whose strides cannot be viewed so; :func:`reshape` copies it.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.zeros(6, 3)}, batch_size=[6]).lock()
    >>> v = td.view(2, -1)
    >>> v.batch_size, v["x"].shape, v.tags == td.tags
    (torch.Size([2, 3]), torch.Size([2, 3, 3]), True)
    """
    batch = node._meta[1]
    new = _infer(batch, _shape_arg(shape), "view")
    n = len(batch)
    return rebuild(node, lambda x: x.view(*new, *x.shape[n:]), new)


@tag_rule
def reshape(node: NodeT, *shape: Any) -> NodeT:
    """The node with its batch dims reshaped to ``shape``, as ``torch.reshape`` (views where it can).

    Args:
        node: the node (``self`` as a method).
        *shape: the new batch size, as ints or one sequence; one -1 is inferred.

    Returns:
        A new node; tags kept exactly when every leaf came back as a view, else dropped.

    Raises:
        BatchSizeError: ``shape`` is invalid or holds another number of elements than the batch.
    """
    batch = node._meta[1]
    new = _infer(batch, _shape_arg(shape), "reshape")
    n = len(batch)
    return rebuild(node, lambda x: x.reshape(*new, *x.shape[n:]), new)


@tag_rule
def permute(node: NodeT, *dims: Any) -> NodeT:
    """The node with its batch dims reordered as ``dims``; feature dims stay last.

    Args:
        node: the node (``self`` as a method).
        *dims: a permutation of the batch dims, as ints or one sequence (negative allowed).

    Returns:
        A new node whose leaves are views; tags kept.

    Raises:
        BatchDimError: a dim is out of range, or ``dims`` is not a permutation of the batch dims.
    """
    batch = node._meta[1]
    n = len(batch)
    order = tuple(batch_dim(node, d, "permute") for d in _shape_arg(dims))
    if sorted(order) != list(range(n)):
        raise BatchDimError(
            f"permute: dims {_shape_arg(dims)} are not a permutation of the {n} batch dims "
            f"of a node with batch_size {tuple(batch)}"
        )
    new = torch.Size([batch[d] for d in order])
    return rebuild(node, lambda x: x.permute(*order, *range(n, x.dim())), new)


@tag_rule
def transpose(node: NodeT, dim0: int, dim1: int) -> NodeT:
    """The node with batch dims ``dim0`` and ``dim1`` swapped.

    Args:
        node: the node (``self`` as a method).
        dim0: a batch dim (negative counts from the end of the batch dims).
        dim1: another batch dim.

    Returns:
        A new node whose leaves are views; tags kept.

    Raises:
        BatchDimError: a dim is out of range for the batch dims.
    """
    d0 = batch_dim(node, dim0, "transpose")
    d1 = batch_dim(node, dim1, "transpose")
    new = list(node._meta[1])
    new[d0], new[d1] = new[d1], new[d0]
    return rebuild(node, lambda x: x.transpose(d0, d1), torch.Size(new))


@tag_rule
def squeeze(node: NodeT, dim: int | Sequence[int] | None = None) -> NodeT:
    """The node without its batch dims of size 1.

    Args:
        node: the node (``self`` as a method).
        dim: None for every batch dim of size 1; else a batch dim or a sequence of them, of
            which those of size 1 are removed (others are left, as torch does).

    Returns:
        A new node whose leaves are views; tags kept.

    Raises:
        BatchDimError: a dim is out of range for the batch dims.
    """
    batch = node._meta[1]
    if dim is None:
        candidates: tuple[int, ...] = tuple(range(len(batch)))
    elif isinstance(dim, int):
        candidates = (batch_dim(node, dim, "squeeze"),)
    else:
        candidates = tuple(batch_dim(node, d, "squeeze") for d in dim)
    drop = tuple(d for d in candidates if batch[d] == 1)
    if not drop:
        return rebuild(node, lambda x: x.view(x.shape), batch)
    new = torch.Size([s for d, s in enumerate(batch) if d not in drop])
    # torch's int overload is ~0.5 us a leaf faster than its tuple one
    one = drop[0] if len(drop) == 1 else drop
    return rebuild(node, lambda x: x.squeeze(one), new)


@tag_rule
def unsqueeze(node: NodeT, dim: int) -> NodeT:
    """The node with a batch dim of size 1 inserted at ``dim``.

    Args:
        node: the node (``self`` as a method).
        dim: the new dim's place, in ``[-ndim - 1, ndim]`` of the batch dims.

    Returns:
        A new node whose leaves are views; tags kept.

    Raises:
        BatchDimError: ``dim`` is out of that range.
    """
    d = batch_dim(node, dim, "unsqueeze", extra=1)
    batch = node._meta[1]
    return rebuild(node, lambda x: x.unsqueeze(d), torch.Size((*batch[:d], 1, *batch[d:])))


@tag_rule
def flatten(node: NodeT, start_dim: int = 0, end_dim: int = -1) -> NodeT:
    """The node with batch dims ``start_dim``..``end_dim`` (inclusive) merged into one.

    As ``torch.flatten`` does for a 0-d tensor, a node with no batch dims gets
    one batch dim of size 1.

    Args:
        node: the node (``self`` as a method).
        start_dim: the first batch dim to merge.
        end_dim: the last batch dim to merge.

    Returns:
        A new node; tags kept when every leaf came back as a view (torch copies a leaf whose
        strides do not allow one), else dropped.

    Raises:
        BatchDimError: a dim is out of range, or ``start_dim`` comes after ``end_dim``.
    """
    batch = node._meta[1]
    if not batch:
        for d in (start_dim, end_dim):
            if d not in (0, -1):
                raise BatchDimError(f"flatten: dim {d} is out of range for a node with batch_size () (use 0 or -1)")
        return rebuild(node, lambda x: x.unsqueeze(0), torch.Size((1,)))
    s = batch_dim(node, start_dim, "flatten")
    e = batch_dim(node, end_dim, "flatten")
    if s > e:
        raise BatchDimError(
            f"flatten: start_dim {start_dim} comes after end_dim {end_dim} in batch_size {tuple(batch)}"
        )
    new = torch.Size((*batch[:s], math.prod(batch[s : e + 1]), *batch[e + 1 :]))
    return rebuild(node, lambda x: x.flatten(s, e), new)


@tag_rule
def unflatten(node: NodeT, dim: int, sizes: Shape) -> NodeT:
    """The node with batch dim ``dim`` split into the dims ``sizes``.

    Args:
        node: the node (``self`` as a method).
        dim: the batch dim to split.
        sizes: the new dims' sizes, whose product is that dim's size (one -1 is inferred).

    Returns:
        A new node whose leaves are views; tags kept.

    Raises:
        BatchDimError: ``dim`` is out of range for the batch dims.
        BatchSizeError: ``sizes`` is invalid or does not multiply to the dim's size.
    """
    d = batch_dim(node, dim, "unflatten")
    batch = node._meta[1]
    inner = _infer(batch[d : d + 1], _shape_arg((sizes,)), "unflatten")
    new = torch.Size((*batch[:d], *inner, *batch[d + 1 :]))
    return rebuild(node, lambda x: x.unflatten(d, inner), new)


@tag_rule
def expand(node: NodeT, *shape: Any) -> NodeT:
    """The node with its batch dims broadcast to ``shape``, as ``torch.Tensor.expand``.

    Args:
        node: the node (``self`` as a method).
        *shape: the new batch size, as ints or one sequence: at least as many dims as the
            batch size, new dims leading; -1 keeps a dim; a dim of size 1 may grow.

    Returns:
        A new node whose leaves are (expanded) views; tags kept. In-place writers refuse
        expanded leaves (several elements share one memory cell).

    Raises:
        BatchSizeError: ``shape`` has fewer dims than the batch size, or a dim cannot be expanded.
    """
    batch = node._meta[1]
    target = _shape_arg(shape)
    n, lead = len(batch), len(target) - len(batch)
    if lead < 0:
        raise BatchSizeError(
            f"expand: shape {target} has fewer dims than the batch_size {tuple(batch)}; "
            "expand acts on the batch dims only"
        )
    new = []
    for i, s in enumerate(target):
        old = batch[i - lead] if i >= lead else None
        if s == -1 and old is not None:
            s = old
        if s < 0 or (old is not None and old != 1 and old != s):
            raise BatchSizeError(
                f"expand: the batch_size {tuple(batch)} cannot be expanded to {target} (at dim {i}: {s})"
            )
        new.append(s)
    size = torch.Size(new)
    return rebuild(node, lambda x: x.expand(*size, *x.shape[n:]), size)


def _rebuild_many(
    node: NodeT, leaf_fn: Callable[[torch.Tensor], Sequence[torch.Tensor]], root_batches: list[torch.Size]
) -> tuple[NodeT, ...]:
    """One node per entry of ``root_batches`` (the root's batch size of each result), from one walk
    calling ``leaf_fn(leaf)`` once per leaf; sub-nodes keep their extra batch dims as in
    :func:`tdtree._maps.rebuild`.

    ``leaf_fn`` (an ``operator.methodcaller``: a C call, where a lambda would add a frame per leaf,
    that still calls a tensor subclass's own method) returns one tensor per result.
    """
    # results of one batch size (unbind's, equal sections') share one metadata tuple per level, and
    # one factory call makes them
    same = root_batches[0] if root_batches and root_batches.count(root_batches[0]) == len(root_batches) else None
    try:
        return tuple(_rebuild_level(node, leaf_fn, root_batches, same, len(node._meta[1])))
    except Exception as exc:
        refuse_first("", node, leaf_fn, exc)
        raise


def _rebuild_level(
    x: Node,
    leaf_fn: Callable[[torch.Tensor], Sequence[torch.Tensor]],
    root_batches: list[torch.Size],
    same: torch.Size | None,
    n: int,
) -> list[Any]:
    """:func:`_rebuild_many`'s results at the level of ``x`` (``same``: the one batch size of them all,
    else None; ``n``: the root's batch dims). A module function, not a closure: a closure calling itself
    holds itself through its cell, a cycle only the garbage collector frees."""
    keys, batch_size, device, _ = x._meta
    data = x._data
    count = len(root_batches)
    # each result's entries start as a copy of x's (same keys, same order), each then overwritten:
    # cheaper than building a dict per result from its keys and values
    datas = []  # a loop, not a list comprehension: the comprehension is a call of its own (before Python 3.12)
    for _ in range(count):
        datas.append(data.copy())
    for k, v in data.items():
        # leaves inline (a call per leaf less); a counter, not zip(datas, parts): one iterator less per entry
        i = 0
        for part in _rebuild_level(v, leaf_fn, root_batches, same, n) if isinstance(v, Node) else leaf_fn(v):
            datas[i][k] = part
            i += 1
    # the results differ from x only in batch size: x's keys and device make their metadata; a
    # sub-node's extra batch dims follow the root's new ones
    if same is not None:
        size = same if len(batch_size) == n else torch.Size((*same, *batch_size[n:]))
        return alike(type(x), datas, (keys, size, device, NO_TAGS))
    sizes = root_batches
    if len(batch_size) != n:
        extra = batch_size[n:]
        sizes = [torch.Size((*root, *extra)) for root in root_batches]
    cls = type(x)
    return [with_meta(cls, out, (keys, size, device, NO_TAGS)) for out, size in zip(datas, sizes)]


@tag_rule
def unbind(node: NodeT, dim: int = 0) -> tuple[NodeT, ...]:
    """The node cut into one node per index along batch dim ``dim``, without that dim.

    Args:
        node: the node (``self`` as a method).
        dim: the batch dim to unbind.

    Returns:
        A tuple of ``batch_size[dim]`` new nodes whose leaves are views; each keeps the tags.

    Raises:
        BatchDimError: ``dim`` is out of range for the batch dims.

    >>> import torch, tdtree as tt
    >>> a, b = tt.TensorDict({"x": torch.arange(4).view(2, 2)}, batch_size=[2]).unbind(0)
    >>> a["x"], b.batch_size
    (tensor([0, 1]), torch.Size([]))
    """
    d = batch_dim(node, dim, "unbind")
    batch = node._meta[1]
    # Size slices are Sizes; the first dim, the common one, is one slice
    rest = batch[1:] if d == 0 else batch[:d] + batch[d + 1 :]
    return _rebuild_many(node, methodcaller("unbind", d), [rest] * batch[d])


def _split_sizes(length: int, size: int, dim: int) -> list[int]:
    """The section sizes ``torch.split(t, size)`` makes along a dim of ``length``."""
    if size < 0 or (size == 0 and length != 0):
        raise BatchSizeError(f"split: split_size {size} is invalid for batch dim {dim} of size {length}")
    if size == 0:
        return [0]
    count = max(-(-length // size), 1)
    return [size] * (count - 1) + [length - size * (count - 1)]


def _sections(node: NodeT, d: int, sizes: Sequence[int]) -> tuple[NodeT, ...]:
    batch = node._meta[1]
    roots = [torch.Size((*batch[:d], s, *batch[d + 1 :])) for s in sizes]
    return _rebuild_many(node, methodcaller("split_with_sizes", sizes, d), roots)


@tag_rule
def split(node: NodeT, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[NodeT, ...]:
    """The node cut along batch dim ``dim`` as ``torch.split`` cuts a tensor.

    Args:
        node: the node (``self`` as a method).
        split_size_or_sections: the size of each part (the last may be smaller), or the list
            of the parts' sizes, which add up to the dim's size.
        dim: the batch dim to cut.

    Returns:
        A tuple of new nodes whose leaves are views; each keeps the tags.

    Raises:
        BatchDimError: ``dim`` is out of range for the batch dims.
        BatchSizeError: a negative or zero size (of a non-empty dim), or sections that do not add
            up to the dim's size.
    """
    d = batch_dim(node, dim, "split")
    length = node._meta[1][d]
    if isinstance(split_size_or_sections, int):
        sizes = _split_sizes(length, split_size_or_sections, dim)
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != length or any(s < 0 for s in sizes):
            raise BatchSizeError(
                f"split: sections {sizes} do not add up to the size {length} of batch dim {dim} "
                f"(batch_size {tuple(node._meta[1])})"
            )
    return _sections(node, d, sizes)


@tag_rule
def chunk(node: NodeT, chunks: int, dim: int = 0) -> tuple[NodeT, ...]:
    """The node cut into at most ``chunks`` parts along batch dim ``dim``, as ``torch.chunk`` does.

    Args:
        node: the node (``self`` as a method).
        chunks: the number of parts asked for (fewer come back when the dim is too short).
        dim: the batch dim to cut.

    Returns:
        A tuple of new nodes whose leaves are views; each keeps the tags.

    Raises:
        BatchDimError: ``dim`` is out of range for the batch dims.
        ValueError: ``chunks`` is less than 1.
    """
    d = batch_dim(node, dim, "chunk")
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be at least 1, got {chunks}")
    length = node._meta[1][d]
    size = -(-length // chunks)
    sizes = [0] * chunks if length == 0 else _split_sizes(length, size, dim)
    return _sections(node, d, sizes)
