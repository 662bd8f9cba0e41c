"""Round trips of nodes between two processes: tdtree beside tensordict, a dict loop and raw torch.

Usage: ``python -m bench.distributed [--rounds 200] [--large-mb 64]``

pytest-benchmark times a call in its own process, and the work here happens in two others, so
this is a script: it starts a gloo group of two local processes (``tdtree.distributed.run_local``),
and rank 0 times round trips (send to rank 1, which receives and sends back) while rank 1 echoes.
It prints one table per node: the median round trip, the throughput (twice the node's bytes per
round trip), and the ratio to tensordict's ``isend``/``irecv`` (its ``test_distributed`` case;
above 1 is faster than tensordict) and to raw ``torch.distributed`` on one contiguous tensor of
the same bytes (the floor; 1.0 is as fast as it).

Nodes: *small*, 10 leaves of shape (3, 4) (float32, batch (3, 4)); *large*, 4 leaves of 16 MB
(64 MB). Rows:

* ``tdtree``: ``send`` / ``recv`` with the default mode; ``tdtree consolidated`` and
  ``tdtree per-leaf`` force the mode; ``tdtree recv_`` receives into a preallocated node.
  Every one of these rows includes the two-sided structure check.
* ``tdtree channel``: ``ch.send(td)`` / ``ch.recv()`` on a ``ttd.Channel``, made once per node
  before the timed rounds (its creation is the two-sided structure check, which is not timed;
  each timed transfer checks the structure locally and is one message per direction for the
  small node); ``tdtree channel recv_`` receives into a preallocated node with ``ch.recv_(td)``.
* ``tensordict``: ``td.isend(dst)`` / ``td.irecv(src)`` into a preallocated tensordict.
* ``dict loop``: ``dist.send`` / ``dist.recv`` of each tensor of a dict into preallocated tensors.
* ``raw``: ``dist.send`` / ``dist.recv`` of one contiguous float32 tensor of the same bytes, into a
  preallocated tensor (compare ``tdtree recv_``); ``raw new`` receives into a new tensor each time,
  as a function returning new data must (compare ``tdtree``: for 64 MB, allocating the pages costs
  about as much as moving them over loopback).

Timings on a shared machine are noisy: compare the ratios within one run, not the times.
``bench/test_distributed.py`` runs this with a few rounds and a small "large" node in ``make test``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import tdtree as tt
import tdtree.distributed as ttd

__all__ = ["IMPLS", "measure", "table", "main"]


def _source(case: str, large_mb: int) -> tuple[dict[str, torch.Tensor], tuple[int, ...]]:
    if case == "small":
        return {str(i): torch.randn(3, 4) for i in range(10)}, (3, 4)
    per_leaf = large_mb * 2**20 // 4 // 4  # float32 elements in each of 4 leaves
    return {k: torch.randn(per_leaf) for k in "abcd"}, ()


# Each impl: make(source, batch) -> state; send(state, dst); recv(state, src) -> state to echo back.
Impl = tuple[Callable[..., Any], Callable[[Any, int], None], Callable[[Any, int], Any]]


def _tdtree(mode: bool | None) -> Impl:
    return (
        lambda src, batch: tt.TensorDict(src, batch),
        lambda td, dst: ttd.send(td, dst, consolidated=mode),
        lambda td, src: ttd.recv(td, src, consolidated=mode),
    )


def _tensordict() -> Impl:
    import tensordict

    def recv(td: Any, src: int) -> Any:
        td.irecv(src)
        return td

    return (lambda src, batch: tensordict.TensorDict(src, batch), lambda td, dst: td.isend(dst), recv)


def _dict_send(d: dict[str, torch.Tensor], dst: int) -> None:
    for t in d.values():
        dist.send(t, dst)


def _dict_recv(d: dict[str, torch.Tensor], src: int) -> dict[str, torch.Tensor]:
    for t in d.values():
        dist.recv(t, src)
    return d


def _raw_make(src: dict[str, torch.Tensor], batch: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(sum(t.numel() for t in src.values()))


def _raw_recv(t: torch.Tensor, src: int) -> torch.Tensor:
    dist.recv(t, src)
    return t


class _ChannelState:
    """A node and its channel, which ``open`` makes once, before the timed loop (see the module docstring)."""

    def __init__(self, src: dict[str, torch.Tensor], batch: tuple[int, ...]) -> None:
        self.td = tt.TensorDict(src, batch)
        self.channel: Any = None

    def open(self, peer: int, tag: int) -> None:
        self.channel = ttd.Channel(self.td, peer, tag=tag)


def _channel_recv(state: _ChannelState, src: int) -> _ChannelState:
    state.td = state.channel.recv()
    return state


def _channel_recv_(state: _ChannelState, src: int) -> _ChannelState:
    state.channel.recv_(state.td)
    return state


IMPLS: dict[str, Impl] = {
    "tdtree": _tdtree(None),
    "tdtree consolidated": _tdtree(True),
    "tdtree per-leaf": _tdtree(False),
    "tdtree recv_": (
        lambda src, batch: tt.TensorDict(src, batch),
        lambda td, dst: ttd.send(td, dst),
        lambda td, src: ttd.recv_(td, src),
    ),
    "tdtree channel": (_ChannelState, lambda st, dst: st.channel.send(st.td), _channel_recv),
    "tdtree channel recv_": (_ChannelState, lambda st, dst: st.channel.send(st.td), _channel_recv_),
    "tensordict": _tensordict(),
    "dict loop": (lambda src, batch: dict(src), _dict_send, _dict_recv),
    "raw": (_raw_make, lambda t, dst: dist.send(t, dst), _raw_recv),
    "raw new": (_raw_make, lambda t, dst: dist.send(t, dst), lambda t, src: _raw_recv(torch.empty_like(t), src)),
}


def _total(state: Any) -> float:
    """The sum of every value a state holds, to check that a round trip brought the same data back."""
    if isinstance(state, _ChannelState):
        return _total(state.td)
    if isinstance(state, torch.Tensor):
        return float(state.double().sum())
    if isinstance(state, tt.TensorDict):
        return sum(_total(x) for x in tt.tree.leaves(state))
    if isinstance(state, dict):
        return sum(_total(x) for x in state.values())
    return sum(_total(x) for x in state.values(True, True))  # a tensordict


def _zero(state: Any) -> None:
    if isinstance(state, _ChannelState):
        state = state.td
    leaves = (
        [state]
        if isinstance(state, torch.Tensor)
        else list(
            tt.tree.leaves(state)
            if isinstance(state, tt.TensorDict)
            else state.values()
            if isinstance(state, dict)
            else state.values(True, True)
        )
    )
    for x in leaves:
        x.zero_()


def _job(
    rank: int, world: int, rounds: int, large_mb: int, warmup: int
) -> tuple[dict[Any, list[float]], dict[Any, bool]]:
    # Rounds interleave the impls (in a rotating order), so that load from other processes on a
    # shared machine falls on all of them alike and the ratios stay meaningful.
    times: dict[tuple[str, str], list[float]] = {}
    intact: dict[tuple[str, str], bool] = {}
    names = list(IMPLS)
    for case in ("small", "large"):
        source, batch = _source(case, large_mb)
        # each impl its own tensors: in-place receives and the zeroing below must not reach the others
        states = {name: IMPLS[name][0]({k: v.clone() for k, v in source.items()}, batch) for name in names}
        for tag, state in enumerate(
            states.values()
        ):  # channels are made here, untimed, in the same order on both ranks
            if isinstance(state, _ChannelState):
                state.open(1 - rank, tag)
        n = rounds if case == "small" else max(rounds // 20, 3)
        dist.barrier()
        for i in range(warmup + n):
            for j in range(len(names)):
                name = names[(i + j) % len(names)]
                _, send, recv = IMPLS[name]
                if rank == 0:
                    t0 = time.perf_counter()
                    send(states[name], 1)
                    recv(states[name], 1)
                    if i >= warmup:
                        times.setdefault((case, name), []).append(time.perf_counter() - t0)
                else:
                    send(recv(states[name], 0), 0)
        for name in names:  # one more round trip each, untimed, into a zeroed state: did the data come back?
            _, send, recv = IMPLS[name]
            if rank == 0:
                expected = _total(states[name])
                send(states[name], 1)
                _zero(states[name])
                received = _total(recv(states[name], 1))
                intact[(case, name)] = expected != 0 and received == expected
            else:
                send(recv(states[name], 0), 0)
    return times, intact


def measure(
    rounds: int = 200, large_mb: int = 64, warmup: int = 5
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], bool]]:
    """{(case, impl): median round-trip seconds}, measured by rank 0 of a local 2-process gloo group,
    and {(case, impl): whether the last round trip brought back the data sent}."""
    laps, intact = ttd.run_local(_job, 2, rounds, large_mb, warmup, timeout=600.0, op_timeout=120.0)[0]
    return {key: statistics.median(v) for key, v in laps.items()}, intact


def table(medians: dict[tuple[str, str], float], large_mb: int = 64) -> str:
    """The Markdown table of :func:`measure`'s medians, with throughput and ratios."""
    lines = []
    for case in ("small", "large"):
        nbytes = 10 * 12 * 4 if case == "small" else large_mb * 2**20
        lines += [
            f"\n{case} node ({nbytes} bytes)\n",
            "| impl | round trip | throughput | vs tensordict | vs raw | vs raw new |",
            "|---|---|---|---|---|---|",
        ]
        base = [medians[(case, b)] for b in ("tensordict", "raw", "raw new")]
        for name in IMPLS:
            t = medians[(case, name)]
            ratios = " | ".join(f"{b / t:.2f}x" for b in base)
            lines.append(f"| {name} | {t * 1e6:.0f} µs | {2 * nbytes / t / 1e6:.1f} MB/s | {ratios} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="round trips per small case (large: a 20th)")
    parser.add_argument("--large-mb", type=int, default=64, help="size of the large node in MB")
    args = parser.parse_args(argv)
    medians, intact = measure(args.rounds, args.large_mb)
    broken = [key for key, ok in intact.items() if not ok]
    if broken:
        raise SystemExit(f"round trips that did not bring the data back: {broken}")
    print(table(medians, args.large_mb))  # noqa: T201


if __name__ == "__main__":
    main()
