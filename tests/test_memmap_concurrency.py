"""Two processes replacing one memmap directory while a third loads it: every node written or
loaded holds one writer's data, never a mix (issue 19)."""

from __future__ import annotations

import multiprocessing as mp
import time

import torch

import tdtree as tt
from tdtree.errors import MemmapError

DURATION = 2.0  # seconds each process runs
LEAVES = 4


def _values(td: tt.TensorDict) -> set[float]:
    return {float(v) for _, t in td.items(include_nested=True, leaves_only=True) for v in t.unique()}


def _writer(prefix: str, value: float, out: mp.Queue) -> None:
    td = tt.TensorDict({f"k{i}": torch.full((4096,), value) for i in range(LEAVES)}, [4096])
    writes = torn = errors = 0
    end = time.monotonic() + DURATION
    while time.monotonic() < end:
        try:
            got = td.memmap(prefix, existsok=True)
        except MemmapError:
            errors += 1
            continue
        writes += 1
        torn += _values(got) != {value}
    out.put(("write", writes, torn, errors))


def _reader(prefix: str, out: mp.Queue) -> None:
    loads = torn = errors = 0
    why = ""
    end = time.monotonic() + DURATION
    while time.monotonic() < end:
        try:
            got = tt.load_memmap(prefix)
        except MemmapError as err:
            errors += 1
            why = str(err)  # the last refusal, for the failure message
            continue
        loads += 1
        torn += len(_values(got)) != 1
    out.put(("load", loads, torn, errors) + ((why,) if errors else ()))


def test_two_writers_one_reader_never_mix(tmp_path) -> None:
    prefix = str(tmp_path / "mm")
    tt.TensorDict({f"k{i}": torch.zeros(4096) for i in range(LEAVES)}, [4096]).memmap(prefix)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(prefix, v, out)) for v in (1.0, 2.0)]
    procs.append(ctx.Process(target=_reader, args=(prefix, out)))
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    writes = sum(r[1] for r in results if r[0] == "write")
    loads = sum(r[1] for r in results if r[0] == "load")
    print(f"writes {writes}, loads {loads}, results {results}")
    assert writes > 0 and loads > 0
    assert all(r[2] == 0 for r in results), results  # torn: 0
    assert all(r[3] == 0 for r in results), results  # no refusal while the directory is replaced
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "mm"]
    assert leftovers == [], leftovers
