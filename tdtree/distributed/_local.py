"""``run_local``: a function on a few local processes in one process group, bounded in time.

For tests, benchmarks and trying things out on one machine. The parent holds
the rendezvous store on a port the OS picks (no race for a free port); the
children join it over 127.0.0.1, run ``fn(rank, world_size, *args)`` and hand
back what it returns. A child that raises, dies or runs past ``timeout``
fails the whole run with an error naming the rank, and every child is
stopped: nothing is left running.
"""

from __future__ import annotations

import pickle
import queue
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_local"]


def _child(
    rank: int, world: int, port: int, backend: str, op_timeout: float, fn: Callable[..., Any], args: tuple, out: Any
) -> None:
    try:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=op_timeout))
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=op_timeout)
        )
        try:
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        # pickled here, by value: torch's queue would pass tensors as handles to this process's
        # memory, which are gone once it exits
        out.put((rank, True, pickle.dumps(result)))
    except BaseException:
        out.put((rank, False, traceback.format_exc()))


def run_local(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 60.0,
    op_timeout: float = 20.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; their results by rank.

    ``fn`` must be importable by the children (a module-level function) and return something
    picklable. Each collective or transfer that waits longer than ``op_timeout`` seconds raises
    in the child (so a bug cannot hang), and the whole run is stopped after ``timeout`` seconds.

    Args:
        fn: a module-level function ``fn(rank, world_size, *args)``, run in each child after it
            joined a process group of ``world_size`` processes.
        world_size: the number of processes.
        *args: passed to ``fn`` (pickled to the children).
        backend: the ``torch.distributed`` backend.
        timeout: seconds after which the whole run is stopped.
        op_timeout: the process group's timeout for one collective or transfer.

    Returns:
        A list of ``fn``'s results, by rank.

    Raises:
        RuntimeError: a child raised (the message holds its traceback), died, or the run timed out.
    """
    store = dist.TCPStore(
        "127.0.0.1", 0, world_size, is_master=True, timeout=timedelta(seconds=op_timeout), wait_for_workers=False
    )
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(r, world_size, store.port, backend, op_timeout, fn, args, out), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failures: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(failures) < world_size:
            try:
                rank, ok, value = out.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    failures.append(f"rank(s) {dead} died with exit code(s) {[procs[r].exitcode for r in dead]}")
                    break
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(results))
                    failures.append(f"rank(s) {missing} still running after {timeout}s")
                    break
                continue
            if ok:
                results[rank] = pickle.loads(value)
            else:
                failures.append(f"rank {rank} raised:\n{value}")
    finally:
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0) if not failures else 1.0)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5.0)
        out.close()
    if failures:
        raise RuntimeError("run_local: " + "\n".join(failures))
    return [results[r] for r in range(world_size)]
