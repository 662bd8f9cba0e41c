"""The structure check every exchange starts with, and the choice of mode.

Before any data moves, every process sends a *header*: four int64 values
``[MAGIC, fingerprint, consolidated, nbytes]``. Point to point, the two sides
swap headers at the same time (one ``isend`` and one ``irecv`` each, so the
check costs one message latency, not a round trip); in a collective, every
rank ``all_gather``s them. Headers are equal exactly when the structures and
modes agree. When they differ, every side knows it, so all of them go on to
swap their full descriptions (JSON bytes, never pickles) and raise the same
:class:`~tdtree.errors.StructureMismatchError` naming what differs. No data
message is ever sent for a mismatched exchange, so a later exchange between
the same processes starts clean.

Mode: ``consolidated=None`` picks the consolidated buffer when the messages it
saves cost more than the copy it makes (see :func:`choose`).
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from ..errors import StructureMismatchError
from ._layout import Layout, differences

__all__ = ["MAGIC", "choose", "header", "device_of", "check_peer", "check_group"]

MAGIC = 0x7464747265650001  # "tdtree" and a protocol version
_MODES = {0: "per-leaf", 1: "consolidated"}

# Measured with bench/distributed.py on the 2-core CI machine (gloo, loopback): one extra message
# costs about 60 us, copying into a new buffer about 1 ns per byte (page faults included). So one
# message saved pays for about 64 KiB copied.
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


def device_of(leaves: list[torch.Tensor]) -> torch.device:
    """The device messages travel from: the leaves' device, or the CPU for a node without leaves."""
    return leaves[0].device if leaves else torch.device("cpu")


def same_device(leaves: list[torch.Tensor]) -> bool:
    return all(x.device == leaves[0].device for x in leaves)


def header(layout: Layout, consolidated: bool, device: torch.device) -> torch.Tensor:
    return torch.tensor([MAGIC, layout.fingerprint, int(consolidated), layout.nbytes], dtype=torch.int64, device=device)


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


def _explain(mine: Any, theirs: Any, hdr_mine: list[int], hdr_theirs: list[int], me: str, them: str) -> list[str]:
    lines = differences(mine, theirs, me, them) + _mode_line(hdr_mine, hdr_theirs, me, them)
    return lines or [f"the structure fingerprints differ between {me} and {them}"]


def check_peer(
    op: str, mine: torch.Tensor, theirs: torch.Tensor, layout: Layout, peer: int, group: Any, tag: int
) -> None:
    """Return when the swapped headers agree; else swap descriptions with ``peer`` and raise."""
    a, b = mine.tolist(), theirs.tolist()
    if a == b:
        return
    them = f"rank {peer}"
    if b[0] != MAGIC:
        raise StructureMismatchError(op, [f"{them} sent a message that is not a tdtree header: {b}"])
    device = mine.device
    own = _encode(layout.description, device)
    size = torch.empty(1, dtype=torch.int64, device=device)
    _swap(torch.tensor([own.numel()], dtype=torch.int64, device=device), size, peer, group, tag)
    other = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _swap(own, other, peer, group, tag)
    raise StructureMismatchError(op, _explain(layout.description, _decode(other), a, b, f"this rank ({dist.get_rank()})", them))


def _swap(out: torch.Tensor, into: torch.Tensor, peer: int, group: Any, tag: int) -> None:
    works = [dist.isend(out, peer, group=group, tag=tag), dist.irecv(into, peer, group=group, tag=tag)]
    for w in works:
        w.wait()


def check_group(op: str, layout: Layout, consolidated: bool, device: torch.device, group: Any, ref: int) -> None:
    """All-gather the headers; return when every rank's equals rank ``ref``'s (a group rank), else raise
    on every rank the same error naming, for each differing rank, how it differs from ``ref``."""
    mine = header(layout, consolidated, device)
    world = dist.get_world_size(group)
    table = torch.empty(world * 4, dtype=torch.int64, device=device)
    dist.all_gather_single(table, mine, group=group)
    rows = table.view(world, 4).tolist()
    if all(row == rows[ref] for row in rows):
        return
    own = _encode(layout.description, device)
    sizes = torch.empty(world, dtype=torch.int64, device=device)
    dist.all_gather_single(sizes, torch.tensor([own.numel()], dtype=torch.int64, device=device), group=group)
    longest = int(sizes.max().item())
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: own.numel()] = own
    everyone = torch.empty(world * longest, dtype=torch.uint8, device=device)
    dist.all_gather_single(everyone, padded, group=group)
    described = [_decode(everyone[r * longest : r * longest + int(sizes[r])]) for r in range(world)]
    lines = []
    for r, row in enumerate(rows):
        if row != rows[ref]:
            lines += _explain(described[r], described[ref], row, rows[ref], f"rank {r}", f"rank {ref}")
    raise StructureMismatchError(op, lines)
