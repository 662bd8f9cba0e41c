"""Channels: two processes agree on a structure once, then each node travels as one message.

Plain ``send`` / ``recv`` check the structure on both sides for every transfer, which takes a
message from each side to the other (see ``tdtree.distributed._protocol``). A :class:`Channel` makes that
check once, when both sides create it (the same headers, swapped on tag ``3t + 1``, and the same
settling and error when they differ). After that each side checks locally that a node it
sends or receives into has the agreed structure (a cached-layout comparison), and a transfer is
the sender's messages only: for a consolidated node of at most 64 KiB, one message holding a
40-byte header and the node's bytes, on tag ``3t``; otherwise the header on ``3t`` and the
data on ``3t + 2``, as :func:`._p2p.isend` sends it.

The header, ``[CHANNEL_MAGIC, fingerprint, consolidated, channel, sequence]``, lets the
receiver refuse what its channel did not send rather than read it as data: a plain ``send`` on
the same tag (then both sides settle and raise, as a plain mismatch does), a message of an
earlier channel between the same processes on that tag (``channel`` numbers the channels
opened between two processes on a tag, agreed at creation), or a lost message (``sequence``
counts the channel's messages in each direction). Receives are checked in the order they were
posted, the order the backend matches messages in, whatever order ``wait()`` is called in.
What no receiver can see is a peer waiting on another tag (both wait for the process group's
timeout), and a plain ``recv`` that takes a channel's message fails only at that timeout (no
channel answers its header); the channel's next message then reports the gap.

Every receive of a header uses a buffer of ``HEADER_BYTES + EARLY_BYTES``, the largest first
message any tdtree sender posts, so a wrong message is refused rather than overflowing the
buffer (gloo aborts the process then). The channel keeps one such buffer, and one outgoing
message buffer, between transfers; a received node is copied out of it into a buffer of its
own size, so no node ever aliases a buffer the next transfer writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import optree
import torch

from .._base import Node
from .._pytree import NAMESPACE
from ..errors import StructureMismatchError
from ._layout import Layout, differences, layout_of, rows, unpack
from ._p2p import Transfer, incoming, mode_of, outgoing, resolve, wire
from ._protocol import (
    CHANNEL_MAGIC,
    EARLY_BYTES,
    HEADER_BYTES,
    MAGIC,
    OPS,
    check_peer,
    device_of,
    header,
    is_early,
    message,
    tags,
)

__all__ = ["Channel", "Pending"]

# the number of the last channel opened per (process group, peer's rank in it, tag); see Channel._number
_OPENED: dict[tuple[int, int, int], int] = {}


class _Box:
    """A message buffer kept by a channel: its header words (written and read in place) and views of
    the node's bytes after them, made once per buffer rather than once per transfer."""

    __slots__ = ("msg", "head", "data", "rows", "views")

    def __init__(self, nbytes: int, layout: Layout, device: torch.device) -> None:
        """A buffer for a header and ``nbytes`` more; views of ``layout``'s node when it fits."""
        self.msg = message(nbytes, device)
        words = self.msg[:HEADER_BYTES].view(torch.int64)
        # a NumPy view of CPU memory reads and writes a word in ~0.1 us, a tensor in ~1.5 us
        self.head: Any = words.numpy() if words.device.type == "cpu" else words
        self.data = self.msg[HEADER_BYTES : HEADER_BYTES + layout.nbytes]
        fits = layout.nbytes <= nbytes
        self.rows = rows(layout, self.data) if fits else None  # one stack fills it, when the leaves allow
        self.views: list[torch.Tensor] = (
            optree.tree_leaves(unpack(layout, self.data), namespace=NAMESPACE) if fits else []
        )

    def fill(self, leaves: list[torch.Tensor]) -> None:
        """Copy ``leaves`` into the node's bytes (what :func:`._layout.pack` does, on the cached views)."""
        if self.rows is not None:
            torch.stack(leaves, out=self.rows)
        else:
            torch._foreach_copy_(self.views, leaves)


class Pending:
    """A transfer on a :class:`Channel` in flight; ``wait()`` returns the node (receives) or None (sends).

    ``wait()`` may be called more than once and returns the same thing (or raises the same error).
    """

    def __init__(self, finish: Callable[[], Any], queue: deque[Pending] | None) -> None:
        """Made by :class:`Channel`: ``finish`` completes the transfer; receives queue in ``queue``."""
        self._finish, self._queue = finish, queue
        self._done = False
        self._result: Any = None
        self._error: Exception | None = None
        if queue is not None:
            queue.append(self)

    def wait(self) -> Any:
        """Block until the transfer is done.

        Returns:
            The received node (``irecv``: new and untagged), or None for a send.

        Raises:
            StructureMismatchError: the message received is not the next one the peer's end of
                this channel sent (see ``tdtree.distributed._channel``).
        """
        if self._queue is None:
            if not self._done:
                self._settle()
        else:
            while not self._done:  # receives posted earlier matched earlier messages: check those first
                self._queue.popleft()._settle()
        if self._error is not None:
            raise self._error
        return self._result

    def _settle(self) -> None:
        try:
            self._result = self._finish()
        except Exception as err:  # noqa: BLE001 - raised by wait() on this transfer, not on a later one's
            self._error = err
        self._done = True


class Channel:
    """Two processes' ends of a stream of nodes of one structure, checked once at creation.

    Create it on both processes, each naming the other as ``peer`` (a global rank, as in
    ``torch.distributed``, also within ``group``), with the same ``tag`` and ``consolidated`` and a
    node (or template: its values are not read, its tags do not matter) of the same keys, batch
    sizes, shapes and dtypes. Creation waits for the peer's; both ends may then send and receive.
    A channel with ``tag=t`` uses the tags ``3t`` to ``3t + 2``, those of plain transfers with
    ``tag=t``; channels between the same processes at the same time need different tags.
    ``consolidated`` picks the mode as for :func:`send` (None: by structure, see the README).

    Args:
        like: a node or template of the structure every message has.
        peer: the other process's global rank.
        group: the process group (None: the default one).
        tag: the channel's tag (it uses ``3 * tag`` to ``3 * tag + 2``).
        consolidated: the mode, as for :func:`send`; both ends pass the same.

    Raises:
        StructureMismatchError: the two sides' nodes or modes differ (raised on both sides).
        ValueError: ``peer`` is this process, or not in the group (or there is no default group).
        TypeError: ``like`` is not a node.
    """

    def __init__(
        self, like: Node, peer: int, *, group: Any = None, tag: int = 0, consolidated: bool | None = None
    ) -> None:
        layout, leaves = layout_of(like)
        self._mode = mode_of(like, layout, leaves, consolidated)
        self._device = device_of(leaves)
        self._devices = [x.device for x in leaves]  # where a received node's leaves go
        self._pg, self._rank = resolve(peer, group)
        if self._rank == self._pg.rank():
            raise ValueError(f"a Channel joins two processes, and rank {peer} is this one")
        self._layout, self._peer, self._group, self._tag = layout, peer, group, tag
        self._agreed = header(layout, self._mode, "channel", self._device)
        both = (3 * tag + 1, 3 * tag + 1, 3 * tag + 2)  # each side's header to the other on 3t + 1
        Transfer("channel", layout, self._agreed, self._agreed[0].view(torch.uint8), peer, group, both, [], None).wait()
        self._id = self._number(layout, both[0])
        self._first, _, self._data = tags("send", tag)
        self._early = is_early(self._mode, layout.nbytes)
        self._words = [CHANNEL_MAGIC, layout.fingerprint, int(self._mode), self._id]
        self._sent = self._received = 0
        self._outbox: _Box | None = None
        self._inbox: _Box | None = None
        self._queue: deque[Pending] = deque()

    def _number(self, layout: Layout, tag: int) -> int:
        """The channel's number, agreed with the peer: one past the larger of the two sides' last ones.

        Both sides usually count alike, but a process that joined later (or a process group
        whose ``id`` a new one reuses) would not; swapping the counts keeps the two ends' numbers equal.
        """
        key = (id(self._pg), self._rank, self._tag)
        mine = _OPENED.get(key, 0) + 1
        # a header-sized message, like every other on this tag
        out = torch.tensor(
            [CHANNEL_MAGIC, layout.fingerprint, int(self._mode), mine, 0], dtype=torch.int64, device=self._device
        )
        theirs = torch.empty_like(out)
        for w in [self._pg.send([out], self._rank, tag), self._pg.recv([theirs], self._rank, tag)]:
            w.wait()
        _OPENED[key] = max(mine, int(theirs[3]))
        return _OPENED[key]

    def _check(self, td: Node, op: str) -> tuple[Layout, list[torch.Tensor]]:
        layout, leaves = layout_of(td)
        if layout is not self._layout and layout.fingerprint != self._layout.fingerprint:
            lines = differences(layout.description, self._layout.description, f"the node given to {op}", "the channel")
            raise StructureMismatchError(f"Channel.{op}", lines or ["the structure fingerprints differ"])
        return layout, leaves

    def isend(self, td: Node) -> Pending:
        """Start sending ``td``; ``wait()`` on the result returns None once it has left.

        ``td`` is not changed, and must not be written in place before ``wait()`` returns.

        Args:
            td: a node of the channel's structure (any tags and values).

        Returns:
            A :class:`Pending` whose ``wait()`` returns None.

        Raises:
            StructureMismatchError: ``td``'s keys, batch sizes, shapes or dtypes differ from the
                channel's (checked here, locally; nothing is sent and the channel stays usable).
        """
        works, box = self._post_send(td)
        return Pending(lambda: self._sent_(works, box), None)

    def send(self, td: Node) -> None:
        """Send ``td`` and return once it has left; ``td`` is not changed.

        Args:
            td: a node of the channel's structure.

        Raises:
            StructureMismatchError: as :meth:`isend` (nothing is sent).
        """
        self._sent_(*self._post_send(td))

    def _post_send(self, td: Node) -> tuple[list[Any], _Box | None]:
        layout, leaves = self._check(td, "send")
        if self._early:
            box, self._outbox = self._outbox or self._box(layout.nbytes), None
            box.fill(leaves)
            box.head[4] = self._sent
            works = [self._pg.send([box.msg], self._rank, self._first)]
        else:
            box = None
            head = torch.tensor([*self._words, self._sent], dtype=torch.int64, device=self._device)
            data = outgoing(layout, leaves, self._mode, self._device)
            works = [self._pg.send([head.view(torch.uint8)], self._rank, self._first)]
            works += [self._pg.send([wire(x)], self._rank, self._data) for x in data]
        self._sent += 1
        return works, box

    def _sent_(self, works: list[Any], box: _Box | None) -> None:
        for w in works:
            w.wait()
        if box is not None:
            self._outbox = box

    def irecv(self) -> Pending:
        """Start receiving a node.

        Returns:
            A :class:`Pending` whose ``wait()`` returns a new, untagged node of the agreed structure,
            on the devices of the node the channel was made with, its leaves views of one buffer of
            its own (consolidated) or tensors of their own (per-leaf); ``wait()`` raises
            StructureMismatchError when the message is not the next one the peer's end sent.
        """
        return self._post(None, [])

    def recv(self) -> Any:
        """A new node of the agreed structure, received; see :meth:`irecv`.

        Returns:
            A new, untagged node.

        Raises:
            StructureMismatchError: the message is not the next one this channel's peer sent.
        """
        if self._queue:  # receives in flight come first
            return self._post(None, []).wait()
        return self._arrived(*self._post_recv(), None, [])

    def recv_(self, into: Node) -> Node:
        """Receive a node into the leaves of ``into``, in place; returns ``into``.

        ``into`` keeps its type, tags and storages, as with :func:`recv_`; Locked nodes work too.

        Args:
            into: a node of the channel's structure, written in place.

        Returns:
            ``into`` itself (same object, tags kept).

        Raises:
            StructureMismatchError: ``into`` differs from the channel's structure (checked before
                anything is received), or the message is not the next one this channel's peer sent.
        """
        _, leaves = self._check(into, "recv_")
        if self._queue:
            return self._post(into, leaves).wait()
        return self._arrived(*self._post_recv(), into, leaves)

    def _box(self, nbytes: int) -> _Box:
        box = _Box(nbytes, self._layout, self._device)
        box.msg[: 8 * len(self._words)].view(torch.int64).copy_(torch.tensor(self._words, dtype=torch.int64))
        return box

    def _post_recv(self) -> tuple[Any, _Box]:
        box, self._inbox = self._inbox or _Box(EARLY_BYTES, self._layout, self._device), None
        return self._pg.recv([box.msg], self._rank, self._first), box

    def _post(self, into: Node | None, leaves: list[torch.Tensor]) -> Pending:
        work, box = self._post_recv()
        return Pending(lambda: self._arrived(work, box, into, leaves), self._queue)

    def _arrived(self, work: Any, box: _Box, into: Node | None, leaves: list[torch.Tensor]) -> Any:
        work.wait()
        theirs = box.head.tolist()
        self._inbox = box  # free for the next receive once this one has read it (below, before returning)
        if theirs[:4] != self._words or theirs[4] != self._received:
            self._refuse(theirs)
        self._received += 1
        if self._early:
            if into is None:  # a copy out of the channel's buffer, which the next receive overwrites
                return unpack(self._layout, box.data.clone())
            torch._foreach_copy_(leaves, box.views)
            return into
        works, finish = incoming(self._layout, leaves, self._mode, self._device, into, self._recv_data, self._devices)
        for w in works:
            w.wait()
        return finish()

    def _recv_data(self, into: torch.Tensor) -> Any:
        return self._pg.recv([wire(into)], self._rank, self._data)

    def _refuse(self, theirs: list[int]) -> None:
        """Raise the error naming what arrived instead of this channel's next message."""
        them = f"rank {self._peer}"
        op = f"Channel(tag={self._tag}).recv"
        if theirs[0] == MAGIC and theirs[4] == OPS["send"]:
            # a plain send on this tag waits for a receiver's header: answer with the channel's, so
            # that both sides settle (the sender's data drained) and raise the same error
            self._pg.send([self._agreed[0].view(torch.uint8)], self._rank, self._first + 1).wait()
            check_peer(
                "channel",
                self._agreed[1],
                theirs,
                self._layout,
                self._device,
                self._peer,
                self._group,
                tags("recv", self._tag),
                [],
            )
        if theirs[0] != CHANNEL_MAGIC:
            raise StructureMismatchError(op, [f"{them} sent a message that is not a tdtree channel's: {theirs}"])
        if theirs[3] != self._id:
            raise StructureMismatchError(
                op,
                [
                    f"{them} sent a message of another channel on this tag (its channel {theirs[3]}, this one is "
                    f"{self._id}): each end of a channel must be received by the other end of the same channel"
                ],
            )
        if theirs[:4] != self._words:
            raise StructureMismatchError(op, [f"{them} sent a header that does not match this channel's: {theirs}"])
        expected, self._received = self._received, theirs[4] + 1  # later messages are in order again
        raise StructureMismatchError(
            op,
            [
                f"{them} sent message {theirs[4]} of this channel where {expected} was next: the ones between went "
                "to another receive on this tag (a plain recv?); this one is dropped"
            ],
        )
