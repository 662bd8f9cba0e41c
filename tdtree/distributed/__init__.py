"""Nodes over ``torch.distributed``: point to point, collectives, and a local launcher.

Import it explicitly (``import tdtree.distributed as ttd``); it needs an initialised process
group (``torch.distributed.init_process_group``, or ``torchrun``), like ``torch.distributed``.

* ``send(td, dst)`` / ``recv(like, src)`` / ``recv_(into, src)``, and ``isend`` / ``irecv``,
  whose :class:`Transfer` handles return the node from ``wait()``.
* ``broadcast(td, src)``, ``all_reduce(td, op)``, ``all_gather(td)`` (stacked on a new dim 0),
  ``reduce_scatter(td, op)``.
* ``Channel(like, peer, tag=...)``: made on both processes, it checks the structure once; then
  ``ch.send(td)`` / ``ch.recv()`` / ``ch.recv_(into)`` (and ``isend`` / ``irecv``, whose
  :class:`Pending` handles return the node from ``wait()``) move one message per node, checking
  the structure locally. For hot loops between fixed peers.
* ``run_local(fn, world_size, *args)``: ``fn`` on local processes in a gloo group, bounded in time.

Guarantees: every function returns a new, untagged node and changes none of its arguments,
except ``recv_``, which writes into ``into``'s storages and keeps its tags. Before any data moves,
the processes compare a fingerprint of their nodes' keys, batch sizes, shapes and dtypes (tags,
devices and values may differ); when they differ, every side raises
:class:`~tdtree.errors.StructureMismatchError` naming what differs, and nothing is sent.

Modes: ``consolidated=True`` packs every leaf into one buffer (grouped by dtype) sent as one
message and unpacked as views; ``False`` sends one message per leaf; ``None`` (the default)
picks the cheaper for the node's structure (``tdtree.distributed._protocol.choose``).
"""

from ._channel import Channel as Channel
from ._channel import Pending as Pending
from ._collectives import all_gather as all_gather
from ._collectives import all_reduce as all_reduce
from ._collectives import broadcast as broadcast
from ._collectives import reduce_scatter as reduce_scatter
from ._local import run_local as run_local
from ._p2p import Transfer as Transfer
from ._p2p import irecv as irecv
from ._p2p import isend as isend
from ._p2p import recv as recv
from ._p2p import recv_ as recv_
from ._p2p import send as send

__all__ = [
    "Channel",
    "Pending",
    "Transfer",
    "all_gather",
    "all_reduce",
    "broadcast",
    "irecv",
    "isend",
    "recv",
    "recv_",
    "reduce_scatter",
    "run_local",
    "send",
]
