"""The structure check every exchange starts with, and the choice of mode.

Every process starts an exchange with a *header* of five int64 values
``[MAGIC, fingerprint, consolidated, nbytes, op]`` (``op`` says which function
it called). Headers agree when the first four are equal and the ops pair up
(``send`` with ``recv``; in a collective, and for a :class:`~._channel.Channel`'s
creation, the same op everywhere). When they do not, every side knows it, so all of
them go on to swap their full descriptions (JSON bytes, never pickles) and
raise the same :class:`~tdtree.errors.StructureMismatchError` naming what
differs. A channel's later messages start with ``CHANNEL_MAGIC`` instead; a
plain receiver refuses them.

Point to point, each side posts its first message and a receive for the
other's at once, so the check costs no round trip. A side's first message is
its header, followed, for a consolidated sender of at most ``EARLY_BYTES``, by
the node's bytes: small nodes travel in that one message. Every first message
is received into a buffer of ``HEADER_BYTES + EARLY_BYTES``, so it always fits
(gloo aborts the process on a message larger than its receive buffer). A
sender posts the rest of its data at once too, so that transfers in both
directions between two processes (a swap, a ring) always make progress; a
receiver posts its receives, each of the size the agreed structure gives, only
once the headers agree. On a refused transfer the receiver drains what the
sender posted, so no message is left for a later transfer. Three tags keep the
streams apart (:func:`tags`). A received small node is copied out of the first
buffer into one of its own size (a few microseconds), so it does not hold
64 KiB; larger nodes are received straight into their buffer and unpacked as
views.

Collectives all-gather the headers, then move data only when all agree.

A process that fails before the exchange (its value is not a node, a leaf cannot be
packed) still takes part in it: it sends a *failure header* (op ``ABORT``) in place of its
own, and its error text where the others send their descriptions, then raises its own
error; the others raise :class:`~tdtree.errors.PeerFailedError` naming its rank and that
text, rather than waiting for its data until the process group's timeout. The marker rides
the header every exchange sends anyway, so an exchange that goes well costs nothing more.

Mode: ``consolidated=None`` picks the consolidated buffer when the messages it
saves cost more than the copy it makes (see :func:`choose`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
import torch.distributed as dist

from ..errors import PeerFailedError, StructureMismatchError
from ._layout import Layout, differences

__all__ = [
    "CHANNEL_MAGIC",
    "EARLY_BYTES",
    "HEADER_BYTES",
    "MAGIC",
    "OPS",
    "choose",
    "is_early",
    "message",
    "header",
    "device_of",
    "same_device",
    "check_peer",
    "check_group",
    "abort_peer",
    "fallback_device",
    "reason",
    "tags",
]

MAGIC = 0x7464747265650001  # "tdtree" and a protocol version
CHANNEL_MAGIC = 0x7464747265650002  # starts every message a Channel sends once agreed (see ._channel)
HEADER_BYTES = 5 * 8
EARLY_BYTES = 64 * 1024
OPS = {
    "send": 1,
    "recv": 2,
    "recv_": 2,
    "broadcast": 3,
    "all_reduce": 4,
    "all_gather": 5,
    "reduce_scatter": 6,
    "channel": 7,
}
ABORT = 8  # the op of a failure header: the sender failed before the exchange
_OP_NAMES = {1: "send", 2: "recv", 3: "broadcast", 4: "all_reduce", 5: "all_gather", 6: "reduce_scatter", 7: "Channel"}
_PARTNERS = {1: 2, 2: 1}  # the op a point-to-point peer must have called; any other op pairs with itself
_MODES = {0: "per-leaf", 1: "consolidated"}

# Measured with bench/distributed.py on the 2-core dev machine (gloo, loopback, other jobs running):
# per-leaf round trips of 10 small leaves took ~2.0 ms against ~0.9 ms packed, so one message costs
# about 60 us; 64 MB packed took ~180 ms against ~100 ms per leaf, so packing (into a new buffer,
# page faults included) costs about 0.6 ns per byte. A message saved pays for ~95 KB of copying;
# 64 KiB leans towards per-leaf, which copies nothing.
BYTES_PER_MESSAGE = 64 * 1024


def choose(layout: Layout, consolidated: bool | None) -> bool:
    """The mode to use: ``consolidated`` when given, else whether packing is the cheaper way.

    Packing makes one message out of ``len(leaves)`` and costs a copy of every byte on the
    sending side (the receiving side unpacks as views, no copy): it wins when
    ``nbytes < (len(leaves) - 1) * BYTES_PER_MESSAGE``. A node of one leaf never packs.
    Both sides compute this from the structure alone, so they agree whenever their structures do.
    """
    if consolidated is not None:
        return bool(consolidated)
    return layout.nbytes < (len(layout.shapes) - 1) * BYTES_PER_MESSAGE


def is_early(consolidated: bool, nbytes: int) -> bool:
    """Whether a sender of this mode and size puts the node's bytes in its first message."""
    return consolidated and 0 < nbytes <= EARLY_BYTES


def message(nbytes: int, device: torch.device) -> torch.Tensor:
    """A ``uint8`` buffer of ``HEADER_BYTES + nbytes`` whose bytes after the header start 16-aligned.

    The header is 40 bytes, so a buffer starting at 0 would put the node at offset 40, where a
    ``complex128`` group cannot be viewed; 8 bytes of slack before the header fix that.
    """
    return torch.empty(8 + HEADER_BYTES + nbytes, dtype=torch.uint8, device=device)[8:]


def device_of(leaves: list[torch.Tensor]) -> torch.device:
    """The device messages travel from: the leaves' device, or the CPU for a node without leaves."""
    return leaves[0].device if leaves else torch.device("cpu")


def same_device(leaves: list[torch.Tensor]) -> bool:
    return all(x.device == leaves[0].device for x in leaves)


def header(layout: Layout, consolidated: bool, op: str, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """The header as a tensor and as values, cached on the layout (the tensor is only ever read)."""
    key = (consolidated, op, device)
    cached = layout.headers.get(key)
    if cached is None:
        values = [MAGIC, layout.fingerprint, int(consolidated), layout.nbytes, OPS[op]]
        cached = layout.headers[key] = (torch.tensor(values, dtype=torch.int64, device=device), values)
    return cached


def _encode(description: Any, device: torch.device) -> torch.Tensor:
    raw = json.dumps(description).encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)


def _decode(buf: torch.Tensor) -> Any:
    return json.loads(bytes(buf.cpu().tolist()).decode())


def _mode_line(mine: list[int], theirs: list[int], me: str, them: str) -> list[str]:
    if mine[2] == theirs[2]:
        return []
    return [
        f"the mode is {_MODES[mine[2]]} on {me} and {_MODES[theirs[2]]} on {them} "
        "(pass the same consolidated= everywhere, or leave it None)"
    ]


def _op_line(mine: list[int], theirs: list[int], me: str, them: str) -> list[str]:
    if theirs[4] == _PARTNERS.get(mine[4], mine[4]):
        return []
    return [f"{me} called {_OP_NAMES.get(mine[4], mine[4])} and {them} called {_OP_NAMES.get(theirs[4], theirs[4])}"]


def _explain(mine: Any, theirs: Any, hdr_mine: list[int], hdr_theirs: list[int], me: str, them: str) -> list[str]:
    lines = differences(mine, theirs, me, them) + _mode_line(hdr_mine, hdr_theirs, me, them)
    lines += _op_line(hdr_mine, hdr_theirs, me, them)
    return lines or [f"the structure fingerprints differ between {me} and {them}"]


def tags(op: str, tag: int) -> tuple[int, int, int]:
    """The tags one point-to-point side uses: (first message out, first message in, data).

    ``3 * tag`` carries the sender's first message, ``3 * tag + 1`` the receiver's, and
    ``3 * tag + 2`` the sender's other data. Separate streams keep transfers in opposite
    directions between the same two processes (a swap, a ring) from taking each other's
    messages; the price is that two processes that both call ``send`` to each other wait (until
    the process group's timeout), as two plain ``torch.distributed.send`` calls would.
    """
    if OPS[op] == OPS["send"]:
        return 3 * tag, 3 * tag + 1, 3 * tag + 2
    return 3 * tag + 1, 3 * tag, 3 * tag + 2


def _message_sizes(header: list[int], description: Any) -> list[int]:
    """The sizes of the data messages a sender with this header and description posted after its first."""
    if is_early(bool(header[2]), header[3]):
        return []
    if header[2]:
        return [header[3]] if header[3] else []
    sizes = []
    for entry in description:
        if entry[0] == "leaf":
            n = math.prod(entry[2]) * getattr(torch, entry[3]).itemsize
            if n:
                sizes.append(n)
    return sizes


def check_peer(
    op: str,
    mine: list[int],
    theirs: list[int],
    layout: Layout,
    device: torch.device,
    peer: int,
    group: Any,
    tags: tuple[int, int, int],
    sent: list[Any],
) -> None:
    """Return when the swapped headers agree (and the peer called the partner op); else settle and raise.

    Settling: the two sides swap descriptions; a side facing a sender then receives, into scratch
    buffers, the data messages the sender posted (their sizes follow from the sender's header and
    description), and a sender waits for those (``sent``) to go, so no message is left for a
    later transfer.
    """
    if mine[:4] == theirs[:4] and theirs[4] == _PARTNERS.get(mine[4], mine[4]):
        return
    me, them = f"this rank ({dist.get_rank()})", f"rank {peer}"
    if theirs[0] == CHANNEL_MAGIC:
        raise StructureMismatchError(op, [f"{them} sent a message of a Channel on these tags, not a {op} header"])
    if theirs[0] != MAGIC:
        raise StructureMismatchError(op, [f"{them} sent a message that is not a tdtree header: {theirs}"])
    other = _swap_json(layout.description, device, peer, group, tags)
    described = _settle(op, theirs, other, device, peer, group, tags, sent)
    if theirs[4] == ABORT:
        raise PeerFailedError(op, peer, str(described[1]))
    raise StructureMismatchError(op, _explain(layout.description, described, mine, theirs, me, them))


def _settle(
    op: str,
    theirs: list[int],
    other: torch.Tensor,
    device: torch.device,
    peer: int,
    group: Any,
    tags: tuple[int, int, int],
    sent: list[Any],
) -> Any:
    """The peer's description (``other``, decoded), after no message of this transfer is left:
    a sender waits for its data messages (``sent``) to go, a side facing a sender receives them."""
    described = _decode(other)
    if OPS[op] == OPS["send"]:
        for w in sent:
            w.wait()
    elif theirs[4] == OPS["send"]:
        for n in _message_sizes(theirs, described):
            dist.recv(torch.empty(n, dtype=torch.uint8, device=device), peer, group=group, tag=tags[2])
    return described


def reason(err: BaseException) -> str:
    """What a failure header's sender tells the others about ``err``."""
    return f"{type(err).__name__}: {err}"


def fallback_device(group: Any) -> torch.device:
    """The device a failure header travels from when the node gave none: the CPU, or for nccl the
    current CUDA device (nccl moves nothing else)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _failure_header(device: torch.device) -> torch.Tensor:
    return torch.tensor([MAGIC, 0, 0, 0, ABORT], dtype=torch.int64, device=device)


def abort_peer(op: str, why: str, peer: int, group: Any, tag: int, device: torch.device) -> None:
    """Take this side's part in a point-to-point exchange it failed to prepare: swap a failure
    header for the peer's first message, then descriptions (``why`` for this side's), and
    receive what a sending peer posted, so the peer raises PeerFailedError and no message is
    left for a later transfer. The caller raises its own error after."""
    ends = tags(op, tag)
    first = message(0 if OPS[op] == OPS["send"] else EARLY_BYTES, device)
    _swap(_failure_header(device).view(torch.uint8), first, peer, group, ends)
    theirs = first[:HEADER_BYTES].view(torch.int64).tolist()
    if theirs[0] != MAGIC:
        return  # not a tdtree header: the peer raises on ours, and sends nothing more
    other = _swap_json(["failed", why], device, peer, group, ends)
    _settle(op, theirs, other, device, peer, group, ends, [])


def _swap_json(value: Any, device: torch.device, peer: int, group: Any, tags: tuple[int, int, int]) -> torch.Tensor:
    """Send ``value`` (JSON) to ``peer`` and receive its own: the length first, then the bytes."""
    own = _encode(value, device)
    size = torch.empty(1, dtype=torch.int64, device=device)
    _swap(torch.tensor([own.numel()], dtype=torch.int64, device=device), size, peer, group, tags)
    other = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _swap(own, other, peer, group, tags)
    return other


def _swap(out: torch.Tensor, into: torch.Tensor, peer: int, group: Any, tags: tuple[int, int, int]) -> None:
    works: list[Any] = [
        dist.isend(out, peer, group=group, tag=tags[0]),
        dist.irecv(into, peer, group=group, tag=tags[1]),
    ]
    for w in works:
        w.wait()


def check_group(
    op: str,
    layout: Layout | None,
    consolidated: bool,
    device: torch.device,
    group: Any,
    ref: int,
    failure: str | None = None,
) -> None:
    """All-gather the headers; return when every rank's equals rank ``ref``'s (a group rank), else raise
    on every rank the same error naming, for each differing rank, how it differs from ``ref``.

    ``failure``: this rank failed to prepare (``layout`` may be None); it sends a failure header and
    this text, and returns once the others know (the caller raises its own error). When some rank
    failed, the others raise PeerFailedError naming the first such rank.
    """
    mine = (
        _failure_header(device)
        if failure is not None or layout is None
        else header(layout, consolidated, op, device)[0]
    )
    world = dist.get_world_size(group)
    table = torch.empty(world * 5, dtype=torch.int64, device=device)
    dist.all_gather_single(table, mine, group=group)
    rows = table.view(world, 5).tolist()
    if all(row == rows[ref] for row in rows):
        return
    failed = [r for r, row in enumerate(rows) if row[4] == ABORT]
    if failed:
        texts = _gather_json(["failed", failure] if failure is not None else [], device, group, world)
        if failure is not None:
            return
        rank = failed[0] if group is None else dist.get_global_rank(group, failed[0])
        raise PeerFailedError(op, rank, str(texts[failed[0]][1]))
    ops = {row[4] for row in rows}
    if len(ops) > 1:
        calls = ", ".join(f"rank {r} called {_OP_NAMES.get(row[4], row[4])}" for r, row in enumerate(rows))
        raise StructureMismatchError(op, [f"the ranks called different collectives: {calls}"])
    assert layout is not None  # a rank without a layout sends a failure header
    described = _gather_json(layout.description, device, group, world)
    lines = []
    for r, row in enumerate(rows):
        if row != rows[ref]:
            lines += _explain(described[r], described[ref], row, rows[ref], f"rank {r}", f"rank {ref}")
    raise StructureMismatchError(op, lines)


def _gather_json(value: Any, device: torch.device, group: Any, world: int) -> list[Any]:
    """Every rank's ``value`` (JSON), by group rank: two all-gathers, the lengths then the bytes."""
    own = _encode(value, device)
    sizes = torch.empty(world, dtype=torch.int64, device=device)
    dist.all_gather_single(sizes, torch.tensor([own.numel()], dtype=torch.int64, device=device), group=group)
    longest = int(sizes.max().item())
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: own.numel()] = own
    everyone = torch.empty(world * longest, dtype=torch.uint8, device=device)
    dist.all_gather_single(everyone, padded, group=group)
    return [_decode(everyone[r * longest : r * longest + int(sizes[r])]) for r in range(world)]
