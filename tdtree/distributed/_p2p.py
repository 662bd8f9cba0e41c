"""Point to point: ``send``, ``recv``, ``recv_``, ``isend``, ``irecv``.

Every transfer is one :class:`Transfer`. It posts each side's first message at
once (the header, and for a small consolidated node the node's bytes too; see
:mod:`._protocol`), and once the headers agree posts the rest: one message in
consolidated mode, one per leaf with data otherwise. The blocking functions are
the asynchronous ones followed by ``wait()``, so both run the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch
import torch.distributed as dist

from .._base import Node
from .._pytree import NAMESPACE
from ._layout import Layout, layout_of, pack, unpack
from ._protocol import EARLY_BYTES, HEADER_BYTES, check_peer, choose, device_of, header, is_early, same_device

__all__ = ["Transfer", "send", "recv", "recv_", "isend", "irecv"]

# posts a transfer's data messages; returns their works and what builds the result once they are done
Post = Callable[[], tuple[list[Any], Callable[[], Any]]]


class Transfer:
    """A node in flight between two processes, returned by :func:`isend` and :func:`irecv`.

    ``wait()`` finishes it and returns the received node (``irecv``) or None (``isend``);
    it raises :class:`~tdtree.errors.StructureMismatchError` when the two sides' nodes differ.
    A small consolidated node moves with the headers, posted at once; other data is posted in
    ``wait()``, once the headers agree. There is no ``is_completed()``: gloo's point-to-point
    works report completion only from their own ``wait()``, so it could never say True.
    """

    def __init__(
        self,
        op: str,
        layout: Layout,
        mine: torch.Tensor,
        first: torch.Tensor,
        peer: int,
        group: Any,
        tag: int,
        post: Post,
    ) -> None:
        self._op, self._layout, self._peer, self._group, self._tag = op, layout, peer, group, tag
        self._mine = mine
        self.first = torch.empty(HEADER_BYTES + EARLY_BYTES, dtype=torch.uint8, device=mine.device)
        self._works = [
            dist.isend(first, peer, group=group, tag=tag),
            dist.irecv(self.first, peer, group=group, tag=tag),
        ]
        self._post = post
        self._done = False
        self._result: Any = None

    def wait(self) -> Any:
        """Block until the transfer is done; the received node (``irecv``) or None (``isend``).

        Raises:
            StructureMismatchError: the two sides' nodes differ (raised on both sides).
        """
        if self._done:
            return self._result
        for w in self._works:
            w.wait()
        theirs = self.first[:HEADER_BYTES].view(torch.int64).tolist()
        check_peer(self._op, self._mine.tolist(), theirs, self._layout, self._mine.device, self._peer, self._group, self._tag)
        works, finish = self._post()
        for w in works:
            w.wait()
        self._result = finish()
        self._done = True
        return self._result


def _mode(layout: Layout, leaves: list[torch.Tensor], consolidated: bool | None) -> bool:
    return choose(layout, consolidated) and same_device(leaves)


def _nothing() -> None:
    return None


def isend(td: Node, dst: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Transfer:
    """Start sending ``td`` to rank ``dst``; ``wait()`` on the result returns None once it has left.

    The receiver calls :func:`irecv`, :func:`recv` or :func:`recv_` with a node of the same keys,
    shapes and dtypes (tags and values may differ). ``td`` is not changed, and must not be written
    in place before ``wait()`` returns. ``consolidated`` picks the mode (None: the faster one for
    this structure, the same choice on both sides; see the README); both sides must agree.
    """
    layout, leaves = layout_of(td)
    mode = _mode(layout, leaves, consolidated)
    device = device_of(leaves)
    mine = header(layout, mode, "send", device)
    early = is_early(mode, layout.nbytes)
    if early:
        first = torch.empty(HEADER_BYTES + layout.nbytes, dtype=torch.uint8, device=device)
        first[:HEADER_BYTES].view(torch.int64).copy_(mine)
        pack(layout, leaves, first[HEADER_BYTES:])
    else:
        first = mine.view(torch.uint8)

    def post() -> tuple[list[Any], Callable[[], Any]]:
        if early:
            out = []
        elif mode:
            out = [pack(layout, leaves, torch.empty(layout.nbytes, dtype=torch.uint8, device=device))] if layout.nbytes else []
        else:
            out = [x.contiguous() for x in leaves if x.numel()]
        return [dist.isend(x, dst, group=group, tag=tag) for x in out], _nothing

    return Transfer("send", layout, mine, first, dst, group, tag, post)


def _irecv(
    op: str, like: Node, src: int, group: Any, tag: int, consolidated: bool | None, into: Node | None
) -> Transfer:
    layout, leaves = layout_of(like)
    mode = _mode(layout, leaves, consolidated)
    device = device_of(leaves)
    mine = header(layout, mode, op, device)

    def received(buf: torch.Tensor) -> Any:
        if into is None:
            return unpack(layout, buf)
        if leaves:
            torch._foreach_copy_(leaves, optree.tree_leaves(unpack(layout, buf), namespace=NAMESPACE))
        return into

    def post() -> tuple[list[Any], Callable[[], Any]]:
        if is_early(mode, layout.nbytes):
            data = transfer.first[HEADER_BYTES : HEADER_BYTES + layout.nbytes]
            return [], lambda: received(data if into is not None else data.clone())
        if mode:
            buf = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
            return ([dist.irecv(buf, src, group=group, tag=tag)] if layout.nbytes else []), lambda: received(buf)
        if into is None:
            targets = [torch.empty(s, dtype=d, device=x.device) for s, d, x in zip(layout.shapes, layout.dtypes, leaves)]
        else:
            targets = [x if x.is_contiguous() else torch.empty_like(x, memory_format=torch.contiguous_format) for x in leaves]
        works = [dist.irecv(t, src, group=group, tag=tag) for t in targets if t.numel()]

        def finish() -> Any:
            if into is None:
                return optree.tree_unflatten(layout.spec, targets)
            pairs = [(x, t) for x, t in zip(leaves, targets) if x is not t]
            if pairs:
                torch._foreach_copy_([x for x, _ in pairs], [t for _, t in pairs])
            return into

        return works, finish

    transfer = Transfer(op, layout, mine, mine.view(torch.uint8), src, group, tag, post)
    return transfer


def irecv(like: Node, src: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Transfer:
    """Start receiving a node shaped like ``like`` from rank ``src``; ``wait()`` returns it.

    The result is a new, untagged node with ``like``'s keys, batch sizes, shapes and dtypes, on
    ``like``'s devices; ``like``'s values are not read and ``like`` is not changed. In consolidated
    mode every leaf of the result is a view of one buffer: the received one for nodes over
    64 KiB (no copy), a copy of the first message's bytes for smaller ones (see :mod:`._protocol`).
    """
    return _irecv("recv", like, src, group, tag, consolidated, None)


def send(td: Node, dst: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> None:
    """Send ``td`` to rank ``dst`` and return once it has left; see :func:`isend`.

    Raises:
        StructureMismatchError: the receiver's node differs in keys, shapes, dtypes or mode
            (the receiver raises it too; no data is used).
    """
    isend(td, dst, group=group, tag=tag, consolidated=consolidated).wait()


def recv(like: Node, src: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Any:
    """A new node shaped like ``like``, received from rank ``src``; see :func:`irecv`.

    Raises:
        StructureMismatchError: the sender's node differs in keys, shapes, dtypes or mode
            (the sender raises it too; no data is used).
    """
    return irecv(like, src, group=group, tag=tag, consolidated=consolidated).wait()


def recv_(into: Node, src: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Node:
    """Receive a node from rank ``src`` into the leaves of ``into``, in place; returns ``into``.

    ``into`` keeps its type, tags and storages (a shared or memory-mapped node stays so, and
    other processes holding it see the values). Per-leaf mode receives straight into contiguous
    leaves; consolidated mode receives one buffer and copies it into the leaves. Works on Locked
    nodes, like the other in-place writers.
    """
    return _irecv("recv_", into, src, group, tag, consolidated, into).wait()
