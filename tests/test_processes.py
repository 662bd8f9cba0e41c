"""Shared nodes across torch.multiprocessing workers (spawn and fork).

A node from ``share_memory()`` handed to a worker arrives tagged, with its
leaves in the same shared storages, so in-place writes on either side
(``update_``, ``fill_``, ``at[idx].set_``, also through a view ``td[i]``) are
seen on the other. Model weights (``tdtree.nn.from_module``) reach workers
as torch's own shared module and dict of Parameters do, and the parent's
in-place updates are seen there (torchrl's weight sync). Workers live at module level so that spawned children can import
them; every join is bounded and a stuck worker fails the test by name.
"""

from __future__ import annotations

import queue as queue_mod

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

import tdtree as tt
from tdtree.nn import from_module, functional_call

CONTEXTS = ["spawn", "fork"]
TIMEOUT = 120.0
WORKERS = 4
STEPS = 250


def _tags(td: tt.TensorDict) -> list[str]:
    return sorted(t.name for t in td.tags)


def _inspect(td: tt.TensorDict, out: mp.Queue, go: mp.Event) -> None:
    leaves = [t for _, t in td.items(include_nested=True, leaves_only=True)]
    out.put(
        (
            type(td).__name__,
            _tags(td),
            _tags(td["n"]),
            all(t.is_shared() for t in leaves),
            isinstance(td, tt.TensorDict[tt.Shared, tt.Locked]),
        )
    )
    go.wait(TIMEOUT)
    out.put(td["x"].sum().item())
    td.update_({"n": {"y": torch.full((4,), 3.0)}})
    out.put("written")


def _write_rows(td: tt.TensorDict, row: int) -> None:
    for step in range(STEPS):
        # an int is not written into the bool "done" (update_'s casting rule): the other leaves take it
        td.exclude("done").at[row, step].set_(step + 1)
    td[row].fill_("done", True)


def _from_queue(inbox: mp.Queue, out: mp.Queue) -> None:
    td = inbox.get(timeout=TIMEOUT)
    out.put((_tags(td), td["x"].is_shared()))
    td.fill_("x", 9.0)
    out.put("written")


def _node() -> tt.TensorDict:
    return tt.TensorDict({"x": torch.zeros(4, 3), "n": {"y": torch.zeros(4)}}, batch_size=[4]).share_memory()


def _get(q: mp.Queue, what: str) -> object:
    try:
        return q.get(timeout=TIMEOUT)
    except queue_mod.Empty:
        pytest.fail(f"no answer from the worker within {TIMEOUT}s while waiting for {what}")


def _join(procs: list, what: str) -> None:
    for p in procs:
        p.join(TIMEOUT)
    stuck = [p for p in procs if p.is_alive()]
    for p in stuck:
        p.terminate()
        p.join(10)
    assert not stuck, f"{what}: {len(stuck)} worker(s) still running after {TIMEOUT}s"
    codes = [p.exitcode for p in procs]
    assert codes == [0] * len(procs), f"{what}: worker exit codes {codes}"


@pytest.mark.parametrize("method", CONTEXTS)
def test_worker_gets_the_same_storages_and_tags(method: str) -> None:
    ctx = mp.get_context(method)
    td = _node()
    out, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_inspect, args=(td, out, go))
    proc.start()
    try:
        name, tags, sub_tags, shared, typed = _get(out, "the worker's view of the node")
        assert name == "TensorDict[Locked, Shared]"
        assert tags == sub_tags == ["Locked", "Shared"]
        assert shared and typed
        td.fill_("x", 2.0)  # written after the worker started: it must see it
        go.set()
        assert _get(out, "the sum the worker read") == 24.0
        assert _get(out, "the worker's write") == "written"
    finally:
        go.set()
        _join([proc], f"{method} inspect")
    torch.testing.assert_close(td["n", "y"], torch.full((4,), 3.0))


@pytest.mark.parametrize("method", CONTEXTS)
def test_node_sent_through_a_queue_keeps_storage(method: str) -> None:
    ctx = mp.get_context(method)
    td = _node()
    inbox, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_from_queue, args=(inbox, out))
    proc.start()
    try:
        inbox.put(td)
        assert _get(out, "the worker's tags") == (["Locked", "Shared"], True)
        assert _get(out, "the worker's write") == "written"
    finally:
        _join([proc], f"{method} queue")
    torch.testing.assert_close(td["x"], torch.full((4, 3), 9.0))


@pytest.mark.parametrize("method", CONTEXTS)
def test_workers_write_disjoint_rows_nothing_lost(method: str) -> None:
    ctx = mp.get_context(method)
    shape = (WORKERS, STEPS)
    td = tt.TensorDict(
        {
            "log": torch.zeros(shape),
            "done": torch.zeros(shape, dtype=torch.bool),
            "n": {"step": torch.zeros((*shape, 2), dtype=torch.int64)},
        },
        batch_size=shape,
    ).share_memory()
    procs = [ctx.Process(target=_write_rows, args=(td, row)) for row in range(WORKERS)]
    for p in procs:
        p.start()
    _join(procs, f"{method} row writers")
    steps = torch.arange(1, STEPS + 1).expand(shape)
    torch.testing.assert_close(td["log"], steps.float())
    torch.testing.assert_close(td["n", "step"], steps[..., None].expand(*shape, 2))
    assert bool(td["done"].all())
    assert type(td) is tt.TensorDict[tt.Locked, tt.Shared]


def _weights() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    m[0].bias.requires_grad_(False)
    return m


def _facts(pairs) -> dict[str, tuple[str, bool, bool, bool]]:
    return {
        ".".join(k) if isinstance(k, tuple) else k: (type(v).__name__, v.requires_grad, v.is_leaf, v.is_shared())
        for k, v in pairs
    }


def _weights_worker(shared: tt.TensorDict, ref: nn.Module, inbox: mp.Queue, out: mp.Queue, go: mp.Event) -> None:
    got, ref_got = inbox.get(timeout=TIMEOUT)
    kept = got.share_memory()  # what arrives is in shared memory: kept, not copied
    out.put(
        (
            _tags(shared),
            _facts(shared.items(include_nested=True, leaves_only=True)),
            _facts(ref.named_parameters()),
            _facts(got.items(include_nested=True, leaves_only=True)),
            _facts(ref_got.items()),
            all(kept[k] is v for k, v in got.items(include_nested=True, leaves_only=True)),
        )
    )
    go.wait(TIMEOUT)
    x = torch.linspace(-1, 1, 6).view(2, 3)
    with torch.no_grad():  # as lists: a tensor sent through a queue needs its sender alive to arrive
        out.put((functional_call(ref, shared, x).tolist(), ref(x).tolist()))


@pytest.mark.parametrize("method", CONTEXTS)
def test_weights_reach_workers_and_in_place_updates_are_seen(method: str) -> None:
    ctx = mp.get_context(method)
    shared = from_module(_weights()).share_memory()
    ref = _weights().share_memory()  # plain torch: a shared module handed to the worker
    inbox, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_weights_worker, args=(shared, ref, inbox, out, go))
    proc.start()
    try:
        sent = _weights()
        inbox.put((from_module(sent), dict(sent.named_parameters())))
        tags, facts, ref_facts, got, ref_got, kept = _get(out, "the worker's view of the weights")
        assert tags == ["Locked", "Shared"]
        assert facts == ref_facts and got == ref_got
        assert facts["0.weight"] == ("Parameter", True, True, True) and facts["0.bias"][:2] == ("Parameter", False)
        assert kept, "the worker's share_memory() copied leaves that were already in shared memory"
        new = _weights().apply(lambda mod: nn.init.normal_(mod.weight) if isinstance(mod, nn.Linear) else None)
        with torch.no_grad():  # the parent's update, in place: the worker sees it
            shared.update_(from_module(new))
            for p, q in zip(ref.parameters(), new.parameters()):
                p.copy_(q)
        go.set()
        y, ref_y = _get(out, "the worker's outputs")
    finally:
        go.set()
        _join([proc], f"{method} weights")
    x = torch.linspace(-1, 1, 6).view(2, 3)
    with torch.no_grad():
        expected = new(x)
    assert y == ref_y == expected.tolist()
