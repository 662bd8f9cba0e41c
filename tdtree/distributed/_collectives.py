"""Collectives: ``broadcast``, ``all_reduce``, ``all_gather``, ``reduce_scatter``.

Each one first all-gathers the ranks' structure headers (see :mod:`._protocol`),
so ranks whose nodes differ all raise the same error before any data moves, and a
rank that fails before that (a value that is not a node, a leaf it cannot pack)
makes the others raise PeerFailedError instead of waiting for it. Leaves requiring
grad travel by value (their data), as torch.distributed moves a Parameter's.
Results are new, untagged nodes: the inputs are never written, not even on the
rank whose data everyone receives.
"""

from __future__ import annotations

from typing import Any

import optree
import torch
import torch.distributed as dist

from .._base import Node
from .._maps import rebuild
from ..errors import BatchSizeError
from ._layout import Layout, layout_of, pack, unpack, unpack_stacked
from ._protocol import check_group, choose, device_of, fallback_device, reason, same_device

__all__ = ["broadcast", "all_reduce", "all_gather", "reduce_scatter"]


Plan = tuple[Layout, list[torch.Tensor], bool, torch.device, torch.Tensor | None]


def _agree(op: str, td: Node, consolidated: bool | None, group: Any, ref: int, packs: bool) -> Plan:
    """The layout, leaves, mode, device and (with ``packs``, in consolidated mode) the packed buffer,
    once every rank's header agreed with group rank ``ref``'s (see :func:`._protocol.check_group`).

    Everything this rank could fail at comes before the header exchange: when it fails, the
    exchange carries a failure header instead, the other ranks raise PeerFailedError and this one
    its own error, and no rank waits for data that will not come.
    """
    try:
        layout, leaves = layout_of(td)
        mode, device = choose(layout, consolidated) and same_device(leaves), device_of(leaves)
        buf = None
        if mode and packs:
            buf = pack(layout, leaves, torch.empty(layout.nbytes, dtype=torch.uint8, device=device))
    except Exception as err:
        check_group(op, None, False, fallback_device(group), group, ref, failure=reason(err))
        raise
    check_group(op, layout, mode, device, group, ref)
    return layout, leaves, mode, device, buf


def _contiguous_copies(leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    return [x.clone(memory_format=torch.contiguous_format) for x in leaves]


def broadcast(td: Node, src: int, *, group: Any = None, consolidated: bool | None = None) -> Any:
    """Rank ``src``'s node, on every rank, as a new untagged node.

    On ``src``, ``td`` is the data; on the other ranks it is a template giving keys, shapes,
    dtypes and devices (its values are not read). No rank's ``td`` is changed.

    Args:
        td: the node (on ``src``) or a template of it (elsewhere).
        src: the sending rank (a global rank).
        group: the process group (None: the default one).
        consolidated: True: the leaves travel packed, one buffer per dtype; False: one collective per
            leaf; None: the faster for the structure (the same on every rank).

    Returns:
        A new, untagged node equal to ``src``'s ``td`` (on ``src`` too: a copy).

    Raises:
        TypeError: ``td`` is not a node.
        StructureMismatchError: on every rank, when some rank's ``td`` differs from ``src``'s.
    """
    ref = src if group is None else dist.get_group_rank(group, src)
    mine = dist.get_rank() == src
    layout, leaves, mode, device, buf = _agree("broadcast", td, consolidated, group, ref, mine)
    if mode:
        if buf is None:
            buf = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
        if layout.nbytes:
            dist.broadcast(buf, src, group=group)
        return unpack(layout, buf)
    if mine:
        out = _contiguous_copies(leaves)
    else:
        out = [torch.empty(s, dtype=d, device=x.device) for s, d, x in zip(layout.shapes, layout.dtypes, leaves)]
    for t in out:
        if t.numel():
            dist.broadcast(t, src, group=group)
    return optree.tree_unflatten(layout.spec, out)


def all_reduce(td: Node, op: Any = dist.ReduceOp.SUM, *, group: Any = None, consolidated: bool | None = None) -> Any:
    """The reduction ``op`` (a ``torch.distributed.ReduceOp``) of every rank's node, leaf by leaf.

    A new untagged node on every rank; ``td`` is not changed. In consolidated mode the leaves
    travel as one buffer per dtype (one all_reduce per dtype) and the result's leaves are views
    of it. Dtypes and ops the backend refuses raise its error (gloo: no int16).

    Args:
        td: this rank's node (every rank's has the same keys, shapes and dtypes).
        op: a ``torch.distributed.ReduceOp``.
        group: the process group (None: the default one).
        consolidated: True: the leaves travel packed, one buffer per dtype; False: one collective per
            leaf; None: the faster for the structure (the same on every rank).

    Returns:
        A new, untagged node of the reduced values, the same on every rank.

    Raises:
        TypeError: ``td`` is not a node.
        StructureMismatchError: on every rank, when the ranks' nodes differ.
    """
    layout, leaves, mode, device, buf = _agree("all_reduce", td, consolidated, group, 0, True)
    if buf is not None:
        for g in layout.groups:
            if g.nbytes:
                dist.all_reduce(buf[g.start : g.start + g.nbytes].view(g.dtype), op, group=group)
        return unpack(layout, buf)
    out = _contiguous_copies(leaves)
    for t in out:
        if t.numel():
            dist.all_reduce(t, op, group=group)
    return optree.tree_unflatten(layout.spec, out)


def _with_batch(layout: Layout, leaves: list[torch.Tensor], batch_size: torch.Size) -> Any:
    # the spec's batch sizes are the input's; rebuild rewrites them at every level
    node: Node = optree.tree_unflatten(layout.spec, leaves)  # type: ignore[assignment]
    return rebuild(node, lambda x: x, batch_size)


def all_gather(td: Node, *, group: Any = None, consolidated: bool | None = None) -> Any:
    """Every rank's node stacked on a new leading batch dim: entry ``i`` comes from group rank ``i``.

    The result (batch size ``(world_size, *td._meta[1])``, untagged) is what
    ``tdtree.stack([node of rank 0, node of rank 1, ...])`` would give, in the layout of
    ``torch.distributed.all_gather_single``; ``result.unbind(0)`` gives the list. ``td``
    is not changed. In consolidated mode the leaves are views of the one gathered buffer.

    Args:
        td: this rank's node (every rank's has the same keys, shapes and dtypes).
        group: the process group (None: the default one).
        consolidated: True: the leaves travel packed, one buffer per dtype; False: one collective per
            leaf; None: the faster for the structure (the same on every rank).

    Returns:
        A new, untagged node with batch size ``(world_size, *td.batch_size)``.

    Raises:
        TypeError: ``td`` is not a node.
        StructureMismatchError: on every rank, when the ranks' nodes differ.
    """
    layout, leaves, mode, device, buf = _agree("all_gather", td, consolidated, group, 0, True)
    world = dist.get_world_size(group)
    if buf is not None:
        gathered = torch.empty(world * layout.nbytes, dtype=torch.uint8, device=device)
        if layout.nbytes:
            dist.all_gather_single(gathered, buf, group=group)
        out = unpack_stacked(layout, gathered, world)
    else:
        out = []
        for x in leaves:
            t = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)
            if x.numel():
                dist.all_gather_single(t.view(-1), x.contiguous().view(-1), group=group)
            out.append(t)
    return _with_batch(layout, out, torch.Size((world, *td._meta[1])))


def reduce_scatter(td: Node, op: Any = dist.ReduceOp.SUM, *, group: Any = None) -> Any:
    """Entry ``rank`` of the reduction ``op`` over every rank's node; ``td`` has a leading batch dim of
    size ``world_size``.

    The result is what ``all_reduce(td, op)[rank]`` would give (batch size ``td._meta[1][1:]``,
    untagged), at a ``world_size``-th of the traffic: one ``reduce_scatter_single`` per leaf (gloo
    and nccl both have it; there is no consolidated mode here). ``td`` is not changed.

    Args:
        td: this rank's node, batch size ``(world_size, ...)``.
        op: a ``torch.distributed.ReduceOp``.
        group: the process group (None: the default one).

    Returns:
        A new, untagged node with batch size ``td.batch_size[1:]``.

    Raises:
        TypeError: ``td`` is not a node.
        StructureMismatchError: on every rank, when the ranks' nodes differ.
        BatchSizeError: on every rank, when ``td``'s first batch dim is not the world size.
    """
    layout, leaves, _, _, _ = _agree("reduce_scatter", td, False, group, 0, False)
    world = dist.get_world_size(group)
    if not td._meta[1] or td._meta[1][0] != world:
        raise BatchSizeError(
            f"reduce_scatter: the node's batch_size is {tuple(td._meta[1])}; its first dim must be the "
            f"world size {world}, one entry per rank"
        )
    out = []
    for x in leaves:
        t = torch.empty(x.shape[1:], dtype=x.dtype, device=x.device)
        if x.numel():
            dist.reduce_scatter_single(t.view(-1), x.contiguous().view(-1), op, group=group)
        out.append(t)
    return _with_batch(layout, out, torch.Size(td._meta[1][1:]))
