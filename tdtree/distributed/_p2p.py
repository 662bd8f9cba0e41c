"""Point to point: ``send``, ``recv``, ``recv_``, ``isend``, ``irecv``.

Every transfer is one :class:`Transfer`. Each side posts its first message and
a receive for the other's at once (the header, and for a small consolidated
node the node's bytes too; see ``tdtree.distributed._protocol``). A sender posts the rest of
its data at once too, so transfers in flight in both directions (a swap, a
ring) always make progress; a receiver posts its receives once the headers
agree. The blocking functions are the asynchronous ones followed by ``wait()``,
so both run the same code. A side that fails before it posts anything (a value that is
not a node, a leaf it cannot pack) sends a failure header instead (see :mod:`._protocol`),
so its peer raises PeerFailedError rather than waiting for it.
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
from ._protocol import (
    EARLY_BYTES,
    HEADER_BYTES,
    abort_peer,
    check_peer,
    choose,
    device_of,
    fallback_device,
    header,
    is_early,
    message,
    reason,
    same_device,
    tags,
)

__all__ = ["Transfer", "send", "recv", "recv_", "isend", "irecv"]

# posts a receiver's data receives once the headers agree; returns their works and what builds the result
Post = Callable[[], tuple[list[Any], Callable[[], Any]]]


class Transfer:
    """A node in flight between two processes, returned by :func:`isend` and :func:`irecv`.

    ``wait()`` finishes it and returns the received node (``irecv``) or None (``isend``);
    it raises :class:`~tdtree.errors.StructureMismatchError` when the two sides' nodes differ.
    There is no ``is_completed()``: gloo's point-to-point works report completion only from
    their own ``wait()``, so it could never say True.
    """

    def __init__(
        self,
        op: str,
        layout: Layout,
        mine: tuple[torch.Tensor, list[int]],
        first: torch.Tensor,
        peer: int,
        group: Any,
        tags: tuple[int, int, int],
        data: list[torch.Tensor],
        post: Post | None,
    ) -> None:
        """Made by :func:`isend` / :func:`irecv`: posts the first messages at once."""
        self._op, self._layout, self._peer, self._group, self._tags = op, layout, peer, group, tags
        self._mine, self._values = mine
        # a receiver's first message is its header alone; a sender's may carry a small node
        self._first = message(0 if tags[0] % 3 == 0 else EARLY_BYTES, self._mine.device)
        self._pg, self._rank = resolve(peer, group)
        self._works: list[Any] = [
            self._pg.send([first], self._rank, tags[0]),
            self._pg.recv([self._first], self._rank, tags[1]),
        ]
        self._sent: list[Any] = [self._pg.send([wire(x)], self._rank, tags[2]) for x in data]
        self._post = post
        self._done = False
        self._result: Any = None

    def post_recv(self, into: torch.Tensor) -> Any:
        """Post a receive of the sender's data into ``into`` (used by the receiving side's ``wait``).

        Args:
            into: a contiguous tensor the data message lands in.

        Returns:
            The process group's work for the receive.
        """
        return self._pg.recv([wire(into)], self._rank, self._tags[2])

    def first_bytes(self, n: int) -> torch.Tensor:
        """The ``n`` bytes after the header in the first message received (a small node's data).

        Args:
            n: the number of bytes.

        Returns:
            A uint8 view of the first message's buffer.
        """
        return self._first[HEADER_BYTES : HEADER_BYTES + n]

    def wait(self) -> Any:
        """Block until the transfer is done; may be called again (returns the same result).

        Returns:
            The received node (``irecv``: new and untagged), ``into`` (``recv_``), or None (``isend``).

        Raises:
            StructureMismatchError: the two sides' nodes differ (raised on both sides).
        """
        if self._done:
            return self._result
        for w in self._works:
            w.wait()
        theirs = self._first[:HEADER_BYTES].view(torch.int64).tolist()
        check_peer(
            self._op,
            self._values,
            theirs,
            self._layout,
            self._mine.device,
            self._peer,
            self._group,
            self._tags,
            self._sent,
        )
        works, finish = self._post() if self._post is not None else (self._sent, _nothing)
        for w in works:
            w.wait()
        self._result = finish()
        self._done = True
        return self._result


def resolve(peer: int, group: Any) -> tuple[Any, int]:
    """The process group to post on and ``peer``'s rank in it.

    Posting on the process group itself skips ``dist.isend``'s per-call checks (a few
    microseconds each, four or more calls a transfer); a transfer resolves them once.
    """
    if group is not None:
        return group, dist.get_group_rank(group, peer)  # raises for a rank outside the group
    world = dist.group.WORLD
    if world is None:
        raise ValueError(
            "tdtree.distributed: the default process group is not initialized; call "
            "torch.distributed.init_process_group first"
        )
    # the process group itself does not check ranks (gloo crashes on one out of range)
    if not 0 <= peer < world.size():
        raise ValueError(f"peer rank {peer} is not in the default group of {world.size()} processes")
    return world, peer


def wire(x: torch.Tensor) -> torch.Tensor:
    """What a backend moves for ``x``: backends move real dtypes only (``dist.isend`` makes the same view)."""
    return torch.view_as_real(x) if x.is_complex() else x


def mode_of(node: Node, layout: Layout, leaves: list[torch.Tensor], consolidated: bool | None) -> bool:
    """The mode ``node`` travels in: :func:`._protocol.choose`, on one device only."""
    # a node with a device has every leaf there; only device-less nodes need the look
    return choose(layout, consolidated) and (node._meta[2] is not None or same_device(leaves))


def _nothing() -> None:
    return None


def outgoing(layout: Layout, leaves: list[torch.Tensor], mode: bool, device: torch.device) -> list[torch.Tensor]:
    """The data messages of a node whose bytes do not travel in its first message."""
    if mode:
        return (
            [pack(layout, leaves, torch.empty(layout.nbytes, dtype=torch.uint8, device=device))]
            if layout.nbytes
            else []
        )
    return [x.contiguous() for x in leaves if x.numel()]


def delivered(layout: Layout, buf: torch.Tensor, leaves: list[torch.Tensor], into: Node | None) -> Any:
    """The node packed in ``buf``: a new one of views (``into`` None), or ``into`` after copying it in."""
    if into is None:
        return unpack(layout, buf)
    if leaves:
        torch._foreach_copy_(leaves, optree.tree_leaves(unpack(layout, buf), namespace=NAMESPACE))
    return into


def incoming(
    layout: Layout,
    leaves: list[torch.Tensor],
    mode: bool,
    device: torch.device,
    into: Node | None,
    post: Callable[[torch.Tensor], Any],
    devices: list[torch.device] | None = None,
) -> tuple[list[Any], Callable[[], Any]]:
    """Post (with ``post``) the receives of the data messages :func:`outgoing` makes; their works and
    what returns the node once they are done (see :func:`delivered`). ``leaves`` are ``into``'s, or
    those of the template a new node takes its leaves' devices from (or ``devices`` gives them)."""
    if mode:
        buf = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
        return ([post(buf)] if layout.nbytes else []), lambda: delivered(layout, buf, leaves, into)
    if into is None:
        places = devices if devices is not None else [x.device for x in leaves]
        targets = [torch.empty(s, dtype=d, device=p) for s, d, p in zip(layout.shapes, layout.dtypes, places)]
    else:
        targets = [
            x if x.is_contiguous() else torch.empty_like(x, memory_format=torch.contiguous_format) for x in leaves
        ]
    works = [post(t) for t in targets if t.numel()]

    def finish() -> Any:
        if into is None:
            return optree.tree_unflatten(layout.spec, targets)
        pairs = [(x, t) for x, t in zip(leaves, targets) if x is not t]
        if pairs:
            torch._foreach_copy_([x for x, _ in pairs], [t for _, t in pairs])
        return into

    return works, finish


def isend(td: Node, dst: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Transfer:
    """Start sending ``td`` to rank ``dst``; ``wait()`` on the result returns None once it has left.

    The receiver calls :func:`irecv`, :func:`recv` or :func:`recv_` with a node of the same keys,
    shapes and dtypes (tags and values may differ). ``td`` is not changed, and must not be written
    in place before ``wait()`` returns. ``consolidated`` picks the mode (None: the faster one for
    this structure, the same choice on both sides; see the README); both sides must agree.
    A transfer uses the tags ``3 * tag`` to ``3 * tag + 2`` (``tdtree.distributed._protocol.tags``).

    Args:
        td: the node to send (leaves on one device or several; any tags).
        dst: the receiver's rank.
        group: the process group (None: the default one); ranks are global ranks.
        tag: tells apart transfers between the same two processes (the receiver passes the same).
        consolidated: True: every leaf packed into one buffer per message; False: one message per
            leaf; None: the faster for the structure (the same choice on both sides). Both sides agree.

    Returns:
        A :class:`Transfer`; its ``wait()`` returns None, and raises StructureMismatchError when
        the receiver's node differs.

    Raises:
        TypeError: ``td`` is not a node.
        ValueError: there is no default process group, or ``dst`` is not a rank of it.
    """
    resolve(dst, group)  # a wrong rank or no process group: nobody to tell
    try:
        layout, leaves = layout_of(td)
        mode = mode_of(td, layout, leaves, consolidated)
        device = device_of(leaves)
        mine = header(layout, mode, "send", device)
        data: list[torch.Tensor] = []
        if is_early(mode, layout.nbytes):
            first = message(layout.nbytes, device)
            first[:HEADER_BYTES].view(torch.int64).copy_(mine[0])
            pack(layout, leaves, first[HEADER_BYTES:])
        else:
            first = mine[0].view(torch.uint8)
            data = outgoing(layout, leaves, mode, device)
    except Exception as err:
        abort_peer("send", reason(err), dst, group, tag, fallback_device(group))
        raise
    return Transfer("send", layout, mine, first, dst, group, tags("send", tag), data, None)


def _irecv(
    op: str, like: Node, src: int, group: Any, tag: int, consolidated: bool | None, into: Node | None
) -> Transfer:
    resolve(src, group)  # a wrong rank or no process group: nobody to tell
    try:
        layout, leaves = layout_of(like)
        mode = mode_of(like, layout, leaves, consolidated)
        device = device_of(leaves)
        mine = header(layout, mode, op, device)
    except Exception as err:
        abort_peer(op, reason(err), src, group, tag, fallback_device(group))
        raise

    def post() -> tuple[list[Any], Callable[[], Any]]:
        if is_early(mode, layout.nbytes):
            data = transfer.first_bytes(layout.nbytes)
            # a copy the node's size, so a small node does not hold the whole first buffer
            return [], lambda: delivered(layout, data if into is not None else data.clone(), leaves, into)
        return incoming(layout, leaves, mode, device, into, transfer.post_recv)

    transfer = Transfer(op, layout, mine, mine[0].view(torch.uint8), src, group, tags(op, tag), [], post)
    return transfer


def irecv(like: Node, src: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Transfer:
    """Start receiving a node shaped like ``like`` from rank ``src``; ``wait()`` returns it.

    The result is a new, untagged node with ``like``'s keys, batch sizes, shapes and dtypes, on
    ``like``'s devices; ``like``'s values are not read and ``like`` is not changed. In consolidated
    mode every leaf of the result is a view of one buffer: the received one for nodes over
    64 KiB (no copy), a copy of the first message's bytes for smaller ones (see ``tdtree.distributed._protocol``).

    Args:
        like: a template node with the sender's keys, shapes and dtypes (values and tags may differ).
        src: the sender's rank.
        group: the process group (None: the default one); ranks are global ranks.
        tag: as the sender's.
        consolidated: True: every leaf packed into one buffer per message; False: one message per
            leaf; None: the faster for the structure (the same choice on both sides). Both sides agree.

    Returns:
        A :class:`Transfer`; its ``wait()`` returns the received node, and raises
        StructureMismatchError when the sender's node differs.

    Raises:
        TypeError: ``like`` is not a node.
        ValueError: there is no default process group, or ``src`` is not a rank of it.
    """
    return _irecv("recv", like, src, group, tag, consolidated, None)


def send(td: Node, dst: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> None:
    """Send ``td`` to rank ``dst`` and return once it has left; ``td`` is not changed.

    Args:
        td, dst, group, tag, consolidated: as in :func:`isend`.

    Returns:
        None.

    Raises:
        TypeError, ValueError: as :func:`isend`.
        StructureMismatchError: the receiver's node differs in keys, shapes, dtypes or mode
            (the receiver raises it too, and uses none of the data).
    """
    isend(td, dst, group=group, tag=tag, consolidated=consolidated).wait()


def recv(like: Node, src: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None) -> Any:
    """A new node shaped like ``like``, received from rank ``src``; see :func:`irecv`.

    Args:
        like, src, group, tag, consolidated: as in :func:`irecv`.

    Returns:
        A new, untagged node with ``like``'s keys, batch sizes, shapes, dtypes and devices.

    Raises:
        TypeError, ValueError: as :func:`irecv`.
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

    Args:
        into: the node written; it gives the keys, shapes and dtypes the sender's node must have.
        src, group, tag, consolidated: as in :func:`irecv`.

    Returns:
        ``into`` itself (same object, tags kept).

    Raises:
        TypeError, ValueError: as :func:`irecv`.
        StructureMismatchError: the sender's node differs in keys, shapes, dtypes or mode (the
            sender raises it too); nothing is written.
    """
    return _irecv("recv_", into, src, group, tag, consolidated, into).wait()
