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
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
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
            "next": {"reward": _values((4, 1), torch.float32, gen), "deep": {"obs": _values((4, 2, 2), dtypes[0], gen)}},
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
            raised = [f"{k} on rank {r}:\n{v[1]}" for r, res in enumerate(results) for k, v in res.items() if v[0] == "raised"]
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
                into = {"shared": nested(0).share_memory, "memmap": lambda: nested(0).memmap(f"{tmp}/node"),
                        "plain": lambda: nested(0)}[kind]()
                kind_before, ptrs = type(into), _storages(into)
                out = ttd.recv_(into, 0, consolidated=mode)
                shared = all(x.is_shared() for x in tt.tree.leaves(into) if x.numel()) if kind == "shared" else True
                got[(mode, kind)] = (
                    out is into, type(into) is kind_before, _storages(into) == ptrs, shared, into.clone()
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
    got["mode"] = _error(lambda: ttd.send(base, 1, consolidated=mode) if rank == 0 else ttd.recv(base, 0, consolidated=mode))
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
    (collectives_four, (0, 1, 2, 3)),
    (collective_mismatch_four, (0, 1, 2, 3)),
]


def job(rank: int, world: int) -> dict[str, Any]:
    """Every scenario on its ranks, one after the other; stops at the first that raises."""
    groups: dict[tuple[int, ...], Any] = {(0, 1): dist.new_group([0, 1]), (2, 3): dist.new_group([2, 3]), (0, 1, 2, 3): None}
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
def test_point_to_point_mismatch_raises_on_both_sides(results: list[dict[str, Any]], case: str, names: list[str]) -> None:
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
    for rank, got in enumerate((sender, receiver)):
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
