"""tdtree.distributed over real gloo process groups on 127.0.0.1.

Process start-up is slow, so one module-level fixture starts one group of four
(``tdtree.distributed.run_local``: a free port picked by the OS, every wait
bounded, every child stopped on failure) and runs a list of *scenarios* in it;
each test then checks one scenario's outcome. A scenario returns what it saw
(nodes, flags, errors with their timings) and the assertions happen here, in
the parent, against nodes built independently from the same seeds. When a
scenario raises, the ones after it are not run (their tests fail, naming the
first failure) rather than run against processes that may disagree.
"""

from __future__ import annotations

import tempfile
import time
import traceback
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import tdtree as tt
import tdtree.distributed as ttd
from tdtree.errors import BatchSizeError, StructureMismatchError
from tdtree.testing import assert_equal

MODES = (None, True, False)
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
# gloo's all_reduce refuses int16; bool sums are not a reduction a node test should pin down
REDUCIBLE = tuple(d for d in DTYPES if d not in (torch.int16, torch.bool))
LARGE_MB = 64
MISMATCH_SECONDS = 5.0


# -- nodes, built the same way in every process and in the parent ----------------------------


def _values(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    low = 0 if dtype == torch.uint8 else -10
    # small integers: exact in every dtype, and sums of four stay exact and in range
    return torch.randint(low, 11, shape, generator=gen).to(dtype)


def nested(seed: int, dtypes: tuple[torch.dtype, ...] = DTYPES) -> tt.TensorDict:
    """A node with every dtype in ``dtypes``, two levels of nesting, a sub-node with an extra
    batch dim, a non-contiguous leaf, a zero-size leaf and an empty sub-node."""
    gen = torch.Generator().manual_seed(seed)
    leaves = {f"x_{str(d).removeprefix('torch.')}": _values((4, 3), d, gen) for d in dtypes}
    return tt.TensorDict(
        {
            **leaves,
            "next": {
                "reward": _values((4, 1), torch.float32, gen),
                "deep": {"obs": _values((4, 2, 2), dtypes[0], gen)},
            },
            "extra": tt.TensorDict({"y": _values((4, 5, 2), dtypes[-1], gen)}, [4, 5]),
            "transposed": _values((3, 4), torch.float32, gen).t(),
            "empty_leaf": torch.zeros(4, 0),
            "empty_node": tt.TensorDict({}, [4]),
        },
        batch_size=[4],
    )


def large(seed: int) -> tt.TensorDict:
    """64 MB in four leaves of two dtypes."""
    n = LARGE_MB * 2**20 // 4 // 8
    gen = torch.Generator().manual_seed(seed)
    return tt.TensorDict(
        {
            "a": torch.randn(n, generator=gen),
            "b": torch.randint(0, 100, (n,), generator=gen),
            "c": {"d": torch.randn(n, generator=gen), "e": torch.randint(0, 100, (n,), generator=gen)},
        }
    )


def _snapshot(td: tt.TensorDict) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    return [(x, x._version, x.clone()) for x in tt.tree.leaves(td)]


def _unchanged(td: tt.TensorDict, before: list[tuple[torch.Tensor, int, torch.Tensor]]) -> bool:
    after = tt.tree.leaves(td)
    return len(after) == len(before) and all(
        x is orig and x._version == version and torch.equal(x, values)
        for x, (orig, version, values) in zip(after, before)
    )


def _storages(td: tt.TensorDict) -> list[int]:
    return [x.untyped_storage().data_ptr() for x in tt.tree.leaves(td) if x.numel()]


def _fresh(out: tt.TensorDict, *inputs: tt.TensorDict) -> bool:
    """``out`` is untagged and none of its leaves uses an input's storage."""
    used = {p for td in inputs for p in _storages(td)}
    return out.tags == frozenset() and not used.intersection(_storages(out))


def _error(fn: Callable[[], Any]) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the test checks the type
        return type(err).__name__, str(err), time.monotonic() - start
    return "no error", "", time.monotonic() - start


def _outcome(results: list[dict[str, Any]], name: str) -> list[Any]:
    """What scenario ``name`` returned on each of its ranks; fails naming the first scenario that raised."""
    members = dict((sc.__name__, m) for sc, m in SCENARIOS)[name]
    seen = []
    for rank in members:
        status, value = results[rank].get(name, ("not run", None))
        if status != "ok":
            raised = [
                f"{k} on rank {r}:\n{v[1]}" for r, res in enumerate(results) for k, v in res.items() if v[0] == "raised"
            ]
            pytest.fail(f"{name} {status} on rank {rank}; the first failure: {raised[:1]}")
        seen.append(value)
    return seen


# -- scenarios with two processes ----------------------------------------------------------------


def p2p_every_mode(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """rank 0 sends nested(1) with send; rank 1 sends nested(2) back with isend/irecv; per mode."""
    got: dict[Any, Any] = {}
    for mode in MODES:
        mine = nested(1 + rank)
        like = nested(100).share_memory()  # a tagged template: tags are not part of the structure
        before, like_before = _snapshot(mine), _snapshot(like)
        if rank == 0:
            ttd.send(mine, 1, consolidated=mode)
            pending = ttd.irecv(like, 1, consolidated=mode)
            out = pending.wait()
            assert pending.wait() is out
        else:
            out = ttd.recv(like, 0, consolidated=mode)
            assert ttd.isend(mine, 0, consolidated=mode).wait() is None
        got[mode] = (out, _unchanged(mine, before), _unchanged(like, like_before), _fresh(out, mine, like))
    return got


def p2p_in_a_group(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """On global ranks 2 and 3, in their own group: peers are named by global rank, as in torch."""
    peer = (2, 3)[1 - rank]
    got: dict[Any, Any] = {}
    for mode in MODES:
        if rank == 0:
            ttd.send(nested(1), peer, group=group, consolidated=mode)
            got[mode] = ttd.recv(nested(100), peer, group=group, consolidated=mode)
        else:
            got[mode] = ttd.recv(nested(100), peer, group=group, consolidated=mode)
            ttd.send(nested(2), peer, group=group, consolidated=mode)
    got["outside the group"] = _error(lambda: ttd.send(nested(1), 1 - rank, group=group))
    got["outside the world"] = _error(lambda: ttd.irecv(nested(1), 4 + rank))
    return got


def p2p_large(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """A 64 MB node from rank 0 to rank 1 in every mode; rank 1 compares with large(7) itself."""
    td = large(7)
    got = {}
    for mode in MODES:
        if rank == 0:
            before = _snapshot(td)
            ttd.send(td, 1, consolidated=mode)
            got[mode] = _unchanged(td, before)
        else:
            out = ttd.recv(td, 0, consolidated=mode)
            got[mode] = all(torch.equal(x, y) for x, y in zip(tt.tree.leaves(out), tt.tree.leaves(td)))
    return got


def recv_into_shared_and_memmap(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """recv_ into a shared node, a memmapped one and a plain one with a non-contiguous leaf keeps
    their type, tags and storages."""
    got = {}
    for mode in MODES:
        for kind in ("shared", "memmap", "plain"):
            if rank == 0:
                ttd.send(nested(3), 1, consolidated=mode)
                continue
            with tempfile.TemporaryDirectory() as tmp:
                into = {
                    "shared": nested(0).share_memory,
                    "memmap": lambda: nested(0).memmap(f"{tmp}/node"),
                    "plain": lambda: nested(0),
                }[kind]()
                kind_before, ptrs = type(into), _storages(into)
                out = ttd.recv_(into, 0, consolidated=mode)
                shared = all(x.is_shared() for x in tt.tree.leaves(into) if x.numel()) if kind == "shared" else True
                got[(mode, kind)] = (
                    out is into,
                    type(into) is kind_before,
                    _storages(into) == ptrs,
                    shared,
                    into.clone(),
                )
    return got


def collectives_two(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """On ranks 2 and 3, in their own group: ``src`` is global rank 3, group rank 1."""
    return _collectives(rank, world, group, src=3)


def _collectives(rank: int, world: int, group: Any, src: int) -> dict[Any, Any]:
    got: dict[Any, Any] = {}
    for mode in MODES:
        mine = nested(10 + rank, REDUCIBLE)
        before = _snapshot(mine)
        got[("broadcast", mode)] = ttd.broadcast(mine, src, group=group, consolidated=mode)
        got[("all_reduce", mode)] = ttd.all_reduce(mine, dist.ReduceOp.SUM, group=group, consolidated=mode)
        got[("all_reduce max", mode)] = ttd.all_reduce(
            mine.exclude("x_complex64"), dist.ReduceOp.MAX, group=group, consolidated=mode
        )
        got[("all_gather", mode)] = ttd.all_gather(mine, group=group, consolidated=mode)
        got[("unchanged", mode)] = _unchanged(mine, before)
        got[("fresh", mode)] = all(_fresh(got[(op, mode)], mine) for op in ("broadcast", "all_reduce", "all_gather"))
    stacked = tt.stack([nested(20 + r, REDUCIBLE) for r in range(world)]).apply(lambda x: x + rank)
    got["reduce_scatter"] = ttd.reduce_scatter(stacked, group=group)
    wrong = tt.TensorDict({"a": torch.zeros(world + 1, 2)}, [world + 1])
    got["reduce_scatter wrong batch"] = _error(lambda: ttd.reduce_scatter(wrong, group=group))
    return got


def mismatches(rank: int, world: int, group: Any) -> dict[str, Any]:
    """Every kind of disagreement raises on both sides, and a correct transfer still works after."""
    base = nested(5)
    cases = {
        "extra key": base.set("only_on_1", torch.zeros(4)) if rank == 1 else base,
        "shape": base.set(("next", "reward"), torch.zeros(4, 2)) if rank == 1 else base,
        "dtype": base.set("x_int64", torch.zeros(4, 3, dtype=torch.int32)) if rank == 1 else base,
        "large shape": large(1).set("a", torch.zeros(8)) if rank == 1 else large(1),
        # consolidated but over the first message's size: the data goes in a message of its own
        "medium dtype": base.set("big", torch.zeros(4, 50_000, dtype=torch.float64 if rank else torch.float32)),
    }
    got: dict[str, Any] = {}
    for name, td in cases.items():
        got[name] = _error(lambda: ttd.send(td, 1) if rank == 0 else ttd.recv(td, 0))
    mode = rank == 0  # consolidated on rank 0, per-leaf on rank 1
    got["mode"] = _error(
        lambda: ttd.send(base, 1, consolidated=mode) if rank == 0 else ttd.recv(base, 0, consolidated=mode)
    )
    for mode in MODES:  # both send at once, then both receive: a swap
        pending = ttd.isend(nested(40 + rank), 1 - rank, consolidated=mode)
        got[("swap", mode)] = ttd.recv(base, 1 - rank, consolidated=mode)
        pending.wait()
    got["collective"] = _error(lambda: ttd.all_reduce(cases["shape"], group=group))
    got["after"] = ttd.recv(base, 0) if rank == 1 else ttd.send(base, 1)
    return got


def _with_checksum(td: tt.TensorDict) -> tt.TensorDict:
    return td.set("crc", torch.tensor(_crc(td), dtype=torch.int64))


def _crc(td: tt.TensorDict) -> int:
    crc = 0
    for key, leaf in td.exclude("crc", strict=False).items(include_nested=True, leaves_only=True):
        crc = zlib.crc32(repr(key).encode(), crc)
        crc = zlib.crc32(leaf.contiguous().view(-1).view(torch.uint8).numpy().tobytes(), crc)
    return crc


def _random_node(i: int, gen: torch.Generator) -> tt.TensorDict:
    """The i-th node of the reliability run: its structure from ``i`` (both sides agree), its values from ``gen``."""
    shapes = [(2,), (3, 4), (5, 1, 2), (40, 500), ()]
    keys = ["a", "b", "c", "d"]
    data: dict[Any, Any] = {}
    for j, key in enumerate(keys[: 1 + i % 4]):
        dtype = DTYPES[(i + j) % len(DTYPES)]
        shape = shapes[(i * 7 + j) % len(shapes)]
        path = key if (i + j) % 3 else ("sub", key)
        data[path] = _values(shape, dtype, gen)
    return _with_checksum(tt.TensorDict(data))


def reliability(rank: int, world: int, group: Any) -> dict[str, Any]:
    """1,000 round trips of random nodes, each carrying the CRC32 of its bytes; both sides verify."""
    gen = torch.Generator().manual_seed(1234 + rank)
    bad, start = [], time.monotonic()
    for i in range(1000):
        mode = (None, True, False)[i % 3]
        if rank == 0:
            sent = _random_node(i, gen)
            ttd.send(sent, 1, consolidated=mode)
            back = ttd.recv(sent, 1, consolidated=mode)
            # the echo carries the same leaves and the checksum plus one
            if _crc(back) != int(sent["crc"]) or int(back["crc"]) != int(sent["crc"]) + 1:
                bad.append(i)
        else:
            got = ttd.recv(_random_node(i, gen), 0, consolidated=mode)
            if _crc(got) != int(got["crc"]):
                bad.append(i)
            ttd.send(got.set("crc", got["crc"] + 1), 0, consolidated=mode)
    return {"bad": bad, "seconds": time.monotonic() - start}


# -- channels ----------------------------------------------------------------------------------------

WIDE = DTYPES + (torch.complex128,)  # complex128 needs its group 16-aligned after the 40-byte header


def medium(seed: int) -> tt.TensorDict:
    """Over the 64 KiB of a first message: a consolidated node travels in a data message of its own."""
    gen = torch.Generator().manual_seed(seed)
    return nested(seed, WIDE).set("big", torch.randn(4, 50_000, generator=gen))


# the nodes channels carry in channel_transfers, by name: (node of a seed, mode)
CHANNEL_NODES: dict[str, tuple[Callable[[int], tt.TensorDict], bool | None]] = {
    "small": (lambda seed: nested(seed, WIDE), None),  # consolidated, in one message
    "small per-leaf": (lambda seed: nested(seed, WIDE), False),
    "medium consolidated": (medium, True),
    "medium per-leaf": (medium, False),
    "large": (large, None),
    "empty node": (lambda seed: tt.TensorDict({}, [4]), None),
    "empty leaf only": (lambda seed: tt.TensorDict({"e": torch.zeros(4, 0), "n": {}}, [4]), True),
}


def channel_transfers(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """Per node kind: a channel made from a tagged template, rank 0 sends (send) and receives
    (irecv), rank 1 receives (recv) and sends (isend); plain per-leaf send/recv of the same nodes
    for comparison; recv_ into shared, memory-mapped, locked and plain nodes."""
    peer = 1 - rank
    got: dict[Any, Any] = {}
    for tag, (name, (make, mode)) in enumerate(CHANNEL_NODES.items()):
        like = make(100).share_memory()
        mine = make(1 + rank)
        before, like_before = _snapshot(mine), _snapshot(like)
        ch = ttd.Channel(like, peer, tag=tag, consolidated=mode)
        if rank == 0:
            ch.send(mine)
            pending = ch.irecv()
            out = pending.wait()
            assert pending.wait() is out
        else:
            out = ch.recv()
            assert ch.isend(mine).wait() is None
        plain = ttd.recv(like, 0, consolidated=False) if rank else ttd.send(make(1), 1, consolidated=False)
        got[name] = (out, plain, _unchanged(mine, before), _unchanged(like, like_before), _fresh(out, mine, like))
        if name == "large":
            continue
        # and plain recv_ in the channel's mode (complex128 in the first message's bytes, for "small")
        got[(name, "plain recv_")] = (
            ttd.recv_(make(0), 0, consolidated=mode) if rank else ttd.send(make(1), 1, consolidated=mode)
        )
        for kind in ("shared", "memmap", "locked", "plain"):
            if rank == 0:
                ch.send(make(3))
                continue
            with tempfile.TemporaryDirectory() as tmp:
                into = {
                    "shared": make(0).share_memory,
                    "memmap": lambda: make(0).memmap(f"{tmp}/node"),
                    "locked": lambda: make(0).lock(),
                    "plain": lambda: make(0),
                }[kind]()
                kind_before, ptrs = type(into), _storages(into)
                back = ch.recv_(into)
                got[(name, kind)] = (back is into, type(into) is kind_before, _storages(into) == ptrs, into.clone())
    return got


def channel_swaps_and_order(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """Two channels between the same processes (small on tag 20, medium on tag 21): both sides send
    on both, then receive on both; two receives posted at once and waited for in reverse order; a
    received node is not changed by the next receive."""
    peer = 1 - rank
    small = ttd.Channel(nested(0, WIDE), peer, tag=20)
    mid = ttd.Channel(medium(0), peer, tag=21)
    got: dict[Any, Any] = {}
    sends = [small.isend(nested(50 + rank, WIDE)), mid.isend(medium(60 + rank))]
    got["small"], got["medium"] = small.recv(), mid.recv()
    for pending in sends:
        pending.wait()
    if rank == 0:
        for seed in (70, 71, 72, 73):
            small.send(nested(seed, WIDE))
    else:
        first, second = small.irecv(), small.irecv()
        got["second"], got["first"] = second.wait(), first.wait()
        got["first again"] = first.wait()
        # one after the other, through the buffer the channel keeps: the first must not change
        got["kept"] = small.recv()
        got["next"] = small.recv()
    return got


def channel_in_a_group(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """On global ranks 2 and 3, in their own group, the peer named by global rank; global rank 2
    counts 5 earlier channels on the tag and rank 3 none (as after a restart), and they agree on 6."""
    from tdtree.distributed import _channel

    if rank == 0:
        _channel._OPENED[(id(group), 1, 3)] = 5
    ch = ttd.Channel(nested(0), (2, 3)[1 - rank], group=group, tag=3)
    if rank == 0:
        ch.send(nested(1))
        return {"got": ch.recv(), "number": ch._id}
    got = ch.recv()
    ch.send(nested(2))
    return {"got": got, "number": ch._id}


def channel_misuse(rank: int, world: int, group: Any) -> dict[Any, Any]:
    """Disagreements at creation raise on both sides; a node of another structure is refused
    locally (nothing sent, the channel goes on); what a channel did not send is refused by the
    receiving channel, and the channel goes on."""
    peer = 1 - rank
    base = nested(5)
    got: dict[Any, Any] = {}
    created = {
        "shape": base.set(("next", "reward"), torch.zeros(4, 2)) if rank == 1 else base,
        "dtype": base.set("x_int64", torch.zeros(4, 3, dtype=torch.int32)) if rank == 1 else base,
    }
    for name, td in created.items():
        got[("create", name)] = _error(lambda: ttd.Channel(td, peer, tag=30))
    got[("create", "mode")] = _error(lambda: ttd.Channel(base, peer, tag=30, consolidated=rank == 0))
    got[("create", "self")] = _error(lambda: ttd.Channel(base, rank, tag=30))
    ch = ttd.Channel(base, peer, tag=30)
    wrong = base.set(("next", "reward"), torch.zeros(4, 2))
    if rank == 0:
        got["local send"] = _error(lambda: ch.send(wrong))
        ch.send(nested(6))
        got["local recv_"] = _error(lambda: ch.recv_(wrong))
        got["after local recv_"] = ch.recv_(base.clone())
        # a plain send on the channel's tag: the receiving channel answers, and both raise
        got["plain send"] = _error(lambda: ttd.send(nested(7), 1, tag=30))
        got["plain send medium"] = _error(lambda: ttd.send(medium(7), 1, tag=30, consolidated=True))
        ch.send(nested(8))
    else:
        got["after local send"] = ch.recv()
        ch.send(nested(9))
        got["plain send"] = _error(ch.recv)
        got["plain send medium"] = _error(ch.recv)
        got["after plain send"] = ch.recv()
    # a message of an earlier channel on the same tag, left unreceived, reaches the new channel
    old = ttd.Channel(base, peer, tag=31)
    if rank == 0:
        unreceived = old.isend(nested(13))  # a send completes once the other side posts a receive
    new = ttd.Channel(base, peer, tag=31)
    if rank == 0:
        for seed in (14, 15, 16, 17):
            new.send(nested(seed))
        unreceived.wait()
    else:
        got["old channel"] = _error(new.recv)
        got["after old channel"] = new.recv()
        # the old channel takes the new one's next message, so the new one misses it and says so
        got["taken by the old channel"] = _error(old.recv)
        got["gap"] = _error(new.recv)
        got["after gap"] = new.recv()
    return got


def channel_reliability(rank: int, world: int, group: Any) -> dict[str, Any]:
    """300 round trips of random values on three channels (one message, a consolidated data message,
    per-leaf), each node carrying the CRC32 of its bytes; both sides verify."""
    gen = torch.Generator().manual_seed(99 + rank)
    peer = 1 - rank
    # the structures of _random_node(2), (3) and (4) travel in one message, consolidated in a data
    # message of their own, and per leaf
    kinds = (2, 3, 4)
    channels = [ttd.Channel(_random_node(i, gen), peer, tag=40 + i) for i in kinds]
    bad = []
    for r in range(300):
        ch, i = channels[r % 3], kinds[r % 3]
        if rank == 0:
            sent = _random_node(i, gen)
            pending = ch.isend(sent)
            back = ch.recv() if r % 2 else ch.recv_(_random_node(i, gen))
            pending.wait()
            if _crc(back) != int(sent["crc"]) or int(back["crc"]) != int(sent["crc"]) + 1:
                bad.append(r)
        else:
            got = ch.irecv().wait()
            if _crc(got) != int(got["crc"]):
                bad.append(r)
            ch.send(got.set("crc", got["crc"] + 1))
    return {"bad": bad}


# -- scenarios with four processes ---------------------------------------------------------------


def collectives_four(rank: int, world: int, group: Any) -> dict[Any, Any]:
    return _collectives(rank, world, group, src=world - 1)


def collective_mismatch_four(rank: int, world: int, group: Any) -> dict[str, Any]:
    td = nested(0)
    odd = td.set("x_float32", torch.zeros(4, 7)) if rank == 3 else td
    return {
        "all_reduce": _error(lambda: ttd.all_reduce(odd)),
        "broadcast": _error(lambda: ttd.broadcast(odd, 0)),
        "all_gather": _error(lambda: ttd.all_gather(odd)),
        "different ops": _error(lambda: ttd.all_gather(td) if rank == 2 else ttd.all_reduce(td)),
    }


# (scenario, the ranks that run it); ranks 0 and 1 use the default group for point to point
SCENARIOS: list[tuple[Callable[[int, int, Any], Any], tuple[int, ...]]] = [
    (p2p_every_mode, (0, 1)),
    (p2p_large, (0, 1)),
    (recv_into_shared_and_memmap, (0, 1)),
    (collectives_two, (2, 3)),
    (p2p_in_a_group, (2, 3)),
    (mismatches, (0, 1)),
    (reliability, (0, 1)),
    (channel_transfers, (0, 1)),
    (channel_swaps_and_order, (0, 1)),
    (channel_in_a_group, (2, 3)),
    (channel_misuse, (0, 1)),
    (channel_reliability, (0, 1)),
    (collectives_four, (0, 1, 2, 3)),
    (collective_mismatch_four, (0, 1, 2, 3)),
]


def job(rank: int, world: int) -> dict[str, Any]:
    """Every scenario on its ranks, one after the other; stops at the first that raises."""
    groups: dict[tuple[int, ...], Any] = {
        (0, 1): dist.new_group([0, 1]),
        (2, 3): dist.new_group([2, 3]),
        (0, 1, 2, 3): None,
    }
    out: dict[str, Any] = {}
    for scenario, members in SCENARIOS:
        name = scenario.__name__
        try:
            if rank in members:
                out[name] = ("ok", scenario(members.index(rank), len(members), groups[members]))
            dist.barrier()
        except Exception:  # noqa: BLE001 - reported to the parent with its traceback
            out[name] = ("raised", traceback.format_exc())
            break
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    """One group of four processes for the whole module (start-up is the slow part)."""
    return ttd.run_local(job, 4, timeout=150.0, op_timeout=60.0)


# -- the checks ----------------------------------------------------------------------------------


def test_send_recv_isend_irecv_every_mode(results: list[dict[str, Any]]) -> None:
    got = _outcome(results, "p2p_every_mode")
    for mode in MODES:
        on_1, *flags_1 = got[1][mode]
        on_0, *flags_0 = got[0][mode]
        assert_equal(on_1, nested(1))
        assert_equal(on_0, nested(2))
        assert flags_0 == flags_1 == [True, True, True], f"mode {mode}: inputs unchanged, template unchanged, fresh"


def test_send_recv_in_a_group_by_global_rank(results: list[dict[str, Any]]) -> None:
    on_2, on_3 = _outcome(results, "p2p_in_a_group")
    for mode in MODES:
        assert_equal(on_3[mode], nested(1))
        assert_equal(on_2[mode], nested(2))
    for got in (on_2, on_3):
        kind, message, _ = got["outside the group"]
        assert kind == "ValueError", message
        kind, message, _ = got["outside the world"]
        assert kind == "ValueError" and "peer rank" in message and "4 processes" in message, message


def test_modes_give_identical_nodes(results: list[dict[str, Any]]) -> None:
    got = _outcome(results, "p2p_every_mode")
    for rank in (0, 1):
        for mode in (True, False):
            assert_equal(got[rank][mode][0], got[rank][None][0])


def test_large_node_every_mode(results: list[dict[str, Any]]) -> None:
    sender, receiver = _outcome(results, "p2p_large")
    assert sender == {m: True for m in MODES}, "the sender's node changed"
    assert receiver == {m: True for m in MODES}, "the received 64 MB differ from what was sent"


def test_recv_into_keeps_type_tags_and_storages(results: list[dict[str, Any]]) -> None:
    got = _outcome(results, "recv_into_shared_and_memmap")[1]
    for (mode, kind), (returned_self, same_type, same_storages, shared, values) in got.items():
        where = f"mode {mode}, {kind}"
        assert returned_self and same_type and same_storages and shared, where
        assert_equal(values, nested(3), check_tags=False)
    assert len(got) == 9


def _expected_collectives(world: int) -> dict[str, tt.TensorDict]:
    nodes = [nested(10 + r, REDUCIBLE) for r in range(world)]
    return {
        "broadcast": nodes[world - 1],
        "all_reduce": tt.tree.map(lambda *xs: sum(xs[1:], xs[0]), *nodes),
        "all_reduce max": tt.tree.map(lambda *xs: torch.stack(xs).amax(0), *[n.exclude("x_complex64") for n in nodes]),
        "all_gather": tt.stack(nodes),
    }


def _check_collectives(results: list[dict[Any, Any]], world: int) -> None:
    expected = _expected_collectives(world)
    for rank, got in enumerate(results):
        for mode in MODES:
            for op, want in expected.items():
                assert_equal(got[(op, mode)], want)
            assert got[("unchanged", mode)] and got[("fresh", mode)], f"rank {rank}, mode {mode}"
        stacked = [tt.stack([nested(20 + r, REDUCIBLE) for r in range(world)]) + k for k in range(world)]
        assert_equal(got["reduce_scatter"], tt.tree.map(lambda *xs: sum(xs[1:], xs[0]), *stacked)[rank])
        kind, message, _ = got["reduce_scatter wrong batch"]
        assert kind == BatchSizeError.__name__ and f"world size {world}" in message


def test_collectives_two_processes(results: list[dict[str, Any]]) -> None:
    _check_collectives(_outcome(results, "collectives_two"), 2)


def test_collectives_four_processes(results: list[dict[str, Any]]) -> None:
    _check_collectives(_outcome(results, "collectives_four"), 4)


@pytest.mark.parametrize(
    ("case", "names"),
    [
        ("extra key", ["'only_on_1'"]),
        ("shape", ["('next', 'reward')", "(4, 1)", "(4, 2)"]),
        ("dtype", ["'x_int64'", "int64", "int32"]),
        ("large shape", ["'a'", "(8,)"]),
        ("medium dtype", ["'big'", "float32", "float64"]),
        ("mode", ["consolidated", "per-leaf"]),
    ],
)
def test_point_to_point_mismatch_raises_on_both_sides(
    results: list[dict[str, Any]], case: str, names: list[str]
) -> None:
    for rank, got in enumerate(_outcome(results, "mismatches")):
        kind, message, seconds = got[case]
        assert kind == StructureMismatchError.__name__, f"rank {rank}: {kind} {message}"
        for name in names:
            assert name in message, f"rank {rank}: {name} not in {message!r}"
        assert seconds < MISMATCH_SECONDS, f"rank {rank} took {seconds:.1f}s to raise"


def test_a_swap_in_both_directions_at_once(results: list[dict[str, Any]]) -> None:
    for rank, got in enumerate(_outcome(results, "mismatches")):
        for mode in MODES:
            assert_equal(got[("swap", mode)], nested(40 + 1 - rank))


def test_a_transfer_after_mismatches_is_intact(results: list[dict[str, Any]]) -> None:
    sender, receiver = _outcome(results, "mismatches")
    assert sender["after"] is None
    assert_equal(receiver["after"], nested(5))
    for got in (sender, receiver):
        kind, message, _ = got["collective"]
        assert kind == StructureMismatchError.__name__ and "rank 1" in message and "(4, 2)" in message


def test_collective_mismatch_raises_on_every_rank(results: list[dict[str, Any]]) -> None:
    for rank, got in enumerate(_outcome(results, "collective_mismatch_four")):
        for op in ("all_reduce", "broadcast", "all_gather"):
            kind, message, seconds = got[op]
            assert kind == StructureMismatchError.__name__, f"rank {rank} {op}: {kind} {message}"
            assert "rank 3" in message and "'x_float32'" in message and "(4, 7)" in message
            assert seconds < MISMATCH_SECONDS
        kind, message, _ = got["different ops"]
        assert kind == StructureMismatchError.__name__ and "rank 2 called all_gather" in message


def test_thousand_round_trips_with_checksums(results: list[dict[str, Any]]) -> None:
    sender, receiver = _outcome(results, "reliability")
    assert sender["bad"] == [] and receiver["bad"] == []


def test_checksum_detects_a_changed_byte() -> None:
    td = _random_node(3, torch.Generator().manual_seed(0))
    key, leaf = next((k, x) for k, x in td.items(include_nested=True, leaves_only=True) if x.numel() and k != "crc")
    flipped = leaf.clone()
    flipped.view(-1).view(torch.uint8)[0] ^= 1
    assert _crc(td) == int(td["crc"])
    assert _crc(td.set(key, flipped)) != int(td["crc"])


def test_point_to_point_without_a_process_group_raises() -> None:
    # the tests' processes are spawned: this one never joins a process group
    assert not dist.is_initialized()
    td = tt.TensorDict({"a": torch.ones(2)}, [2])
    for start in (ttd.isend, ttd.irecv):
        with pytest.raises(ValueError, match="default process group is not initialized"):
            start(td, 1)


def test_uniform_leaves_pack_and_unpack_as_one_stack() -> None:
    """Leaves of one dtype and shape take the one-stack path; its bytes and node match the general path's."""
    import dataclasses

    from tdtree.distributed._layout import layout_of, pack, unpack

    gen = torch.Generator().manual_seed(5)
    td = tt.TensorDict(
        {"a": {str(i): torch.randn(3, 4, generator=gen) for i in range(3)}, "b": torch.randn(3, 4, generator=gen)},
        (3, 4),
    )
    layout, leaves = layout_of(td)
    assert layout.stacked == (torch.float32, (4, 3, 4))
    general = dataclasses.replace(layout, stacked=None)
    fast = pack(layout, leaves, torch.empty(layout.nbytes, dtype=torch.uint8))
    slow = pack(general, leaves, torch.empty(general.nbytes, dtype=torch.uint8))
    assert torch.equal(fast, slow)
    assert_equal(unpack(layout, fast), unpack(general, slow))
    assert_equal(unpack(layout, fast), td)
    assert layout_of(tt.TensorDict({"a": torch.ones(2), "b": torch.ones(2, dtype=torch.int64)}))[0].stacked is None


def test_channel_transfers_match_plain_send_recv(results: list[dict[str, Any]]) -> None:
    on_0, on_1 = _outcome(results, "channel_transfers")
    for name, (make, _) in CHANNEL_NODES.items():
        out_1, plain_1, *flags_1 = on_1[name]
        out_0, _, *flags_0 = on_0[name]
        assert_equal(out_1, make(1))
        assert_equal(out_0, make(2))
        assert_equal(out_1, plain_1)
        if name != "large":
            assert_equal(on_1[(name, "plain recv_")], make(1))
        assert flags_0 == flags_1 == [True, True, True], f"{name}: inputs unchanged, template unchanged, fresh"


def test_channel_recv_into_keeps_type_tags_and_storages(results: list[dict[str, Any]]) -> None:
    got = _outcome(results, "channel_transfers")[1]
    checked = 0
    for key, value in got.items():
        if isinstance(key, tuple) and key[1] != "plain recv_":
            name, kind = key
            returned_self, same_type, same_storages, values = value
            assert returned_self and same_type and same_storages, f"{name}, {kind}"
            assert_equal(values, CHANNEL_NODES[name][0](3), check_tags=False)
            checked += 1
    assert checked == 4 * (len(CHANNEL_NODES) - 1)


def test_channel_swap_and_receives_in_posting_order(results: list[dict[str, Any]]) -> None:
    on_0, on_1 = _outcome(results, "channel_swaps_and_order")
    for rank, got in enumerate((on_0, on_1)):
        assert_equal(got["small"], nested(50 + 1 - rank, WIDE))
        assert_equal(got["medium"], medium(60 + 1 - rank))
    assert_equal(on_1["first"], nested(70, WIDE))
    assert_equal(on_1["second"], nested(71, WIDE))
    assert on_1["first again"] is on_1["first"]
    assert_equal(on_1["kept"], nested(72, WIDE))
    assert_equal(on_1["next"], nested(73, WIDE))


def test_channel_in_a_group_by_global_rank(results: list[dict[str, Any]]) -> None:
    on_2, on_3 = _outcome(results, "channel_in_a_group")
    assert_equal(on_3["got"], nested(1))
    assert_equal(on_2["got"], nested(2))
    assert on_2["number"] == on_3["number"] == 6


@pytest.mark.parametrize(
    ("case", "names"),
    [
        ("shape", ["('next', 'reward')", "(4, 1)", "(4, 2)"]),
        ("dtype", ["'x_int64'", "int64", "int32"]),
        ("mode", ["consolidated", "per-leaf"]),
    ],
)
def test_channel_creation_mismatch_raises_on_both_sides(
    results: list[dict[str, Any]], case: str, names: list[str]
) -> None:
    for rank, got in enumerate(_outcome(results, "channel_misuse")):
        kind, message, seconds = got[("create", case)]
        assert kind == StructureMismatchError.__name__, f"rank {rank}: {kind} {message}"
        for name in names:
            assert name in message, f"rank {rank}: {name} not in {message!r}"
        assert seconds < MISMATCH_SECONDS, f"rank {rank} took {seconds:.1f}s to raise"
        kind, message, _ = got[("create", "self")]
        assert kind == "ValueError" and f"rank {rank}" in message, message


def test_channel_refuses_a_wrong_node_locally_and_goes_on(results: list[dict[str, Any]]) -> None:
    sender, receiver = _outcome(results, "channel_misuse")
    for op in ("local send", "local recv_"):
        kind, message, _ = sender[op]
        assert kind == StructureMismatchError.__name__ and f"Channel.{op.split()[1]}" in message, message
        assert "('next', 'reward')" in message and "(4, 2)" in message and "(4, 1)" in message, message
    # the refused send sent nothing: the receiver's next message is the correct send after it
    assert_equal(receiver["after local send"], nested(6))
    assert_equal(sender["after local recv_"], nested(9))


def test_channel_refuses_plain_transfers_on_its_tag(results: list[dict[str, Any]]) -> None:
    sender, receiver = _outcome(results, "channel_misuse")
    for case in ("plain send", "plain send medium"):
        for rank, got in enumerate((sender, receiver)):
            kind, message, seconds = got[case]
            assert kind == StructureMismatchError.__name__, f"rank {rank} {case}: {kind} {message}"
            assert "called send" in message and "called Channel" in message, message
            assert seconds < MISMATCH_SECONDS
    assert_equal(receiver["after plain send"], nested(8))


def test_channel_refuses_a_message_of_another_channel_and_reports_a_gap(results: list[dict[str, Any]]) -> None:
    receiver = _outcome(results, "channel_misuse")[1]
    for case, (its, this) in {"old channel": (1, 2), "taken by the old channel": (2, 1)}.items():
        kind, message, _ = receiver[case]
        assert kind == StructureMismatchError.__name__, message
        assert f"another channel on this tag (its channel {its}, this one is {this})" in message, message
    assert_equal(receiver["after old channel"], nested(14))
    kind, message, _ = receiver["gap"]
    assert kind == StructureMismatchError.__name__ and "message 2" in message and "1 was next" in message, message
    assert_equal(receiver["after gap"], nested(17))


def test_channel_round_trips_with_checksums(results: list[dict[str, Any]]) -> None:
    sender, receiver = _outcome(results, "channel_reliability")
    assert sender["bad"] == [] and receiver["bad"] == []


# -- issue 29: parameters, and a rank that fails before the exchange (a group of two) -------------


def _params(seed: int) -> tuple[torch.nn.Module, tt.TensorDict]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    return model, tt.nn.from_module(model)


def _plain(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The same parameters as a dict, as torch.distributed takes them (clones: torch writes in place)."""
    return {k: p.clone() for k, p in model.named_parameters()}


def _values_of(td: tt.TensorDict) -> dict[str, torch.Tensor]:
    return {".".join(k): v for k, v in td.items(include_nested=True, leaves_only=True)}


def parameters_and_failures(rank: int, world: int) -> dict[Any, Any]:
    """Collectives and transfers of from_module(model) (leaves requiring grad, grad mode on), with
    torch.distributed on a dict of the same parameters in the same run; then ranks that fail first."""
    got: dict[Any, Any] = {"grad_enabled": torch.is_grad_enabled()}
    model, params = _params(rank)
    before = _snapshot(params)
    for mode in MODES:
        ref = _plain(model)
        for t in ref.values():
            dist.all_reduce(t)
        got[("all_reduce", mode)] = (_values_of(ttd.all_reduce(params, consolidated=mode)), ref)
        ref = _plain(model)
        for t in ref.values():
            dist.broadcast(t, 0)
        got[("broadcast", mode)] = (_values_of(ttd.broadcast(params, 0, consolidated=mode)), ref)
        ref = {}
        for k, p in model.named_parameters():
            parts = [torch.empty_like(p) for _ in range(world)]
            dist.all_gather(parts, p.detach())
            ref[k] = torch.stack(parts)
        got[("all_gather", mode)] = (_values_of(ttd.all_gather(params, consolidated=mode)), ref)
        if rank == 0:
            ttd.send(params, 1, consolidated=mode)  # for recv
            ttd.send(params, 1, consolidated=mode)  # for recv_
            for p in _plain(model).values():
                dist.send(p.detach(), 1)
        else:
            received = ttd.recv(params, 0, consolidated=mode)
            into_model, into = _params(7)
            ttd.recv_(into, 0, consolidated=mode)
            ref = {k: torch.empty_like(p) for k, p in model.named_parameters()}
            for t in ref.values():
                dist.recv(t, 0)
            got[("recv", mode)] = (_values_of(received), ref)
            got[("recv_", mode)] = ({k: p.detach().clone() for k, p in into_model.named_parameters()}, ref)
            got[("recv_ keeps", mode)] = all(p.requires_grad and p.is_leaf for p in into_model.parameters())
    got["unchanged"] = _unchanged(params, before)
    # a rank that fails before the exchange: the others raise at once, then everything still works
    for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
        fail = {
            "all_reduce": lambda td: ttd.all_reduce(td),
            "broadcast": lambda td: ttd.broadcast(td, 1),
            "all_gather": lambda td: ttd.all_gather(td),
            "reduce_scatter": lambda td: ttd.reduce_scatter(td),
        }[op]
        stacked = tt.stack([params, params])
        got[("fails", op)] = _error(lambda: fail("not a node" if rank == 1 else stacked))
    got[("fails", "send")] = _error(
        lambda: ttd.send("not a node", 1) if rank == 0 else ttd.recv(params, 0)  # type: ignore[arg-type]
    )
    got[("fails", "recv_")] = _error(
        lambda: ttd.send(params, 1, consolidated=False) if rank == 0 else ttd.recv_(42, 0)  # type: ignore[arg-type]
    )
    got["after"] = _values_of(ttd.all_reduce(params))
    return got


@pytest.fixture(scope="module")
def two() -> list[dict[Any, Any]]:
    return ttd.run_local(parameters_and_failures, 2, timeout=120.0, op_timeout=30.0)


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "all_gather", "recv", "recv_"])
@pytest.mark.parametrize("mode", MODES)
def test_parameters_travel_by_value_as_torch_distributed_moves_them(
    two: list[dict[Any, Any]], op: str, mode: bool | None
) -> None:
    assert two[0]["grad_enabled"]
    for rank, got in enumerate(two):
        if (op, mode) not in got:
            assert op in ("recv", "recv_") and rank == 0
            continue
        mine, ref = got[(op, mode)]
        assert sorted(mine) == sorted(ref)
        for k, v in mine.items():
            assert not v.requires_grad  # values: torch.distributed records no autograd history
            assert_equal(v, ref[k].detach())
    assert two[1][("recv_ keeps", mode)]
    assert all(got["unchanged"] for got in two)


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv_"])
def test_a_rank_failing_before_the_exchange_makes_the_others_raise_not_wait(two: list[dict[Any, Any]], op: str) -> None:
    failed = 0 if op == "send" else 1
    kind, message, _ = two[failed][("fails", op)]
    assert kind == "TypeError", message
    kind, message, seconds = two[1 - failed][("fails", op)]
    assert kind == "PeerFailedError", message
    assert f"rank {failed} failed before any data moved" in message and "TypeError" in message
    assert seconds < 10.0  # the group's timeout is 30 s
    expected = two[0][("all_reduce", None)][1]  # torch.distributed's sum of the same parameters
    for got in two:
        assert sorted(got["after"]) == sorted(expected)
        for k, v in got["after"].items():
            assert_equal(v, expected[k].detach())
