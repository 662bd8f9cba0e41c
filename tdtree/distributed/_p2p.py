"""Point to point: ``send``, ``recv``, ``recv_``, ``isend``, ``irecv``.

Every transfer is one :class:`Transfer`: it posts the header swap at once
(see :mod:`._protocol`), and once the headers agree posts the data: one
message in consolidated mode, one per leaf with data otherwise. The blocking
functions are the asynchronous ones followed by ``wait()``, so both run the
same code.
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
from ._protocol import check_peer, choose, device_of, header, same_device

__all__ = ["Transfer", "send", "recv", "recv_", "isend", "irecv"]


class Transfer:
    """A node in flight between two processes, returned by :func:`isend` and :func:`irecv`.

    ``wait()`` finishes it and returns the received node (``irecv``) or None (``isend``);
    it raises :class:`~tdtree.errors.StructureMismatchError` when the two sides' nodes differ.
    ``is_completed()`` tells without blocking, and posts the data as soon as the header swap
    has finished: the data moves at the first ``is_completed()`` or ``wait()`` after that.
    """

    def __init__(
        self,
        op: str,
        layout: Layout,
        mine: torch.Tensor,
        peer: int,
        group: Any,
        tag: int,
        post: Callable[[], tuple[list[Any], Callable[[], Any]]],
    ) -> None:
        self._op, self._layout, self._peer, self._group, self._tag = op, layout, peer, group, tag
        self._mine = mine
        self._theirs = torch.empty_like(mine)
        self._works = [
            dist.isend(mine, peer, group=group, tag=tag),
            dist.irecv(self._theirs, peer, group=group, tag=tag),
        ]
        self._post: Callable[[], tuple[list[Any], Callable[[], Any]]] | None = post
        self._finish: Callable[[], Any] | None = None
        self._done = False
        self._result: Any = None

    def _start_data(self) -> None:
        check_peer(self._op, self._mine, self._theirs, self._layout, self._peer, self._group, self._tag)
        assert self._post is not None
        self._works, self._finish = self._post()
        self._post = None

    def is_completed(self) -> bool:
        """True once every message has arrived (``wait()`` then returns at once)."""
        if self._done:
            return True
        if not all(w.is_completed() for w in self._works):
            return False
        if self._post is not None:
            self._start_data()
            return self.is_completed()
        return True

    def wait(self) -> Any:
        """Block until the transfer is done; the received node (``irecv``) or None (``isend``)."""
        if self._done:
            return self._result
        for w in self._works:
            w.wait()
        if self._post is not None:
            self._start_data()
            for w in self._works:
                w.wait()
        assert self._finish is not None
        self._result = self._finish()
        self._done = True
        self._post = self._finish = None
        return self._result


def _mode(layout: Layout, leaves: list[torch.Tensor], consolidated: bool | None) -> bool:
    return choose(layout, consolidated) and same_device(leaves)


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

    def post() -> tuple[list[Any], Callable[[], Any]]:
        if mode:
            out = [pack(layout, leaves, device)] if layout.nbytes else []
        else:
            out = [x.contiguous() for x in leaves if x.numel()]
        return [dist.isend(x, dst, group=group, tag=tag) for x in out], lambda: None

    return Transfer("send", layout, header(layout, mode, device), dst, group, tag, post)


def _irecv(
    op: str, like: Node, src: int, group: Any, tag: int, consolidated: bool | None, into: Node | None
) -> Transfer:
    layout, leaves = layout_of(like)
    mode = _mode(layout, leaves, consolidated)
    device = device_of(leaves)

    def post() -> tuple[list[Any], Callable[[], Any]]:
        if mode:
            buf = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
            works = [dist.irecv(buf, src, group=group, tag=tag)] if layout.nbytes else []
            if into is None:
                return works, lambda: unpack(layout, buf)
            return works, lambda: _copy_into(into, leaves, unpack(layout, buf))
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

    return Transfer(op, layout, header(layout, mode, device), src, group, tag, post)


def _copy_into(into: Node, leaves: list[torch.Tensor], received: Node) -> Node:
    if leaves:
        torch._foreach_copy_(leaves, optree.tree_leaves(received, namespace=NAMESPACE))
    return into


def irecv(like: Node, src: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Transfer:
    """Start receiving a node shaped like ``like`` from rank ``src``; ``wait()`` returns it.

    The result is a new, untagged node with ``like``'s keys, batch sizes, shapes and dtypes, on
    ``like``'s devices; ``like``'s values are not read and ``like`` is not changed. In consolidated
    mode every leaf of the result is a view of the one received buffer (no copy).
    """
    return _irecv("recv", like, src, group, tag, consolidated, None)


def send(td: Node, dst: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> None:
    """Send ``td`` to rank ``dst`` and return once it has left; see :func:`isend`.

    Raises:
        StructureMismatchError: the receiver's node differs in keys, shapes, dtypes or mode
            (the receiver raises it too; nothing is sent).
    """
    isend(td, dst, group=group, tag=tag, consolidated=consolidated).wait()


def recv(like: Node, src: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Any:
    """A new node shaped like ``like``, received from rank ``src``; see :func:`irecv`.

    Raises:
        StructureMismatchError: the sender's node differs in keys, shapes, dtypes or mode
            (the sender raises it too; nothing is received).
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
