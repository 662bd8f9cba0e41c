"""torch.distributed.checkpoint (DCP) with nodes in the state dict, over a gloo group of two.

One spawned group (``tdtree.distributed.run_local``) runs one scenario: each rank saves a node and
the same plain dict (with a DTensor sharded across the two ranks) with ``dcp.save``, reads both
checkpoints' metadata, and loads each back with ``dcp.load`` into zeroed targets. The assertions
happen here, in the parent, against the dict's outcome in the same run and values built
independently from the same seed.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import tdtree as tt
from tdtree.distributed import run_local
from tdtree.errors import KeyMismatchError

WORLD = 2
SEED = 7


def _plain(seed: int) -> dict[str, Any]:
    """The checkpointed values as nested plain dicts: plain leaves, a nested sub-node, and the
    global value of the DTensor leaf ``w``."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(4, 3, generator=gen),
        "n": torch.randint(0, 100, (4,), generator=gen),
        "sub": {"b": torch.randn(4, 2, generator=gen), "deep": {"c": torch.randn(4, generator=gen).double()}},
        "w": torch.randn(6, 5, generator=gen),
    }


def _state(mesh: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``w`` as a DTensor sharded by rows across the mesh."""
    return {**values, "w": distribute_tensor(values["w"], mesh, [Shard(0)])}


def _zeros(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _zeros(v) if isinstance(v, dict) else torch.zeros_like(v) for k, v in values.items()}


def _metadata(path: str) -> dict[str, Any]:
    md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    return {
        k: (
            type(v).__name__,
            [(tuple(c.offsets), tuple(c.sizes)) for c in v.chunks] if isinstance(v, TensorStorageMetadata) else None,
        )
        for k, v in md.items()
    }


def _local(values: dict[str, Any]) -> dict[str, Any]:
    """Plain tensors: a DTensor as its full value and its local shard."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, DTensor):
            out[k] = v.full_tensor()
            out[k + ".local"] = v.to_local().clone()
        elif isinstance(v, dict):
            out[k] = _local(v)
        else:
            out[k] = v.clone()
    return out


def _version(x: torch.Tensor) -> int:
    # DCP writes into a DTensor's local shard
    return x.to_local()._version if isinstance(x, DTensor) else x._version


def checkpoint_scenario(rank: int, world: int, node_dir: str, dict_dir: str, root_dir: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world,))
    values = _plain(SEED)
    dcp.save({"p": tt.TensorDict(_state(mesh, values))}, checkpoint_id=node_dir)
    dcp.save({"p": _state(mesh, values)}, checkpoint_id=dict_dir)
    dcp.save(tt.TensorDict(_state(mesh, values)), checkpoint_id=root_dir)

    target = tt.TensorDict(_state(mesh, _zeros(values))).lock()
    leaves = [(x, _version(x)) for x in tt.tree.leaves(target)]
    state = {"p": target}
    dcp.load(state, checkpoint_id=node_dir)
    target_dict = _state(mesh, _zeros(values))
    dcp.load({"p": target_dict}, checkpoint_id=dict_dir)
    # the dict's checkpoint into a node: the same keys
    from_dict = tt.TensorDict(_state(mesh, _zeros(values)))
    dcp.load({"p": from_dict}, checkpoint_id=dict_dir)
    # a node saved as the whole state dict, loaded through its state_dict()
    root = tt.TensorDict(_state(mesh, _zeros(values)))
    dcp.load(root.state_dict(), checkpoint_id=root_dir)
    return {
        "same_node": state["p"] is target,
        "tags": target.tags,
        "locked_type": type(target) is tt.TensorDict[tt.Locked],
        "in_place": all(
            x is y and _version(x) > version for (x, version), y in zip(leaves, tt.tree.leaves(target), strict=True)
        ),
        "sharded": isinstance(target["w"], DTensor) and target["w"].placements == (Shard(0),),
        "node": _local(target.to_dict()),
        "dict": _local(target_dict),
        "from_dict": _local(from_dict.to_dict()),
        "root": _local(root.to_dict()),
        "metadata": (_metadata(node_dir), _metadata(dict_dir), _metadata(root_dir)) if rank == 0 else None,
    }


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    base = tmp_path_factory.mktemp("dcp")
    dirs = [tempfile.mkdtemp(dir=base) for _ in range(3)]
    return run_local(checkpoint_scenario, WORLD, *dirs, timeout=90.0, op_timeout=30.0)


def _flat_keys(values: dict[str, Any], prefix: str = "") -> list[str]:
    return [
        k2
        for k, v in values.items()
        for k2 in (_flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k])
    ]


def test_a_node_is_saved_as_the_same_dict_one_tensor_entry_per_leaf(outcome: list[dict[str, Any]]) -> None:
    node_md, dict_md, root_md = outcome[0]["metadata"]
    assert node_md == dict_md
    assert sorted(node_md) == sorted("p." + k for k in _flat_keys(_plain(SEED)))
    assert {kind for kind, _ in node_md.values()} == {"TensorStorageMetadata"}
    assert sorted(root_md) == sorted(_flat_keys(_plain(SEED)))
    assert {kind for kind, _ in root_md.values()} == {"TensorStorageMetadata"}


def test_a_sharded_dtensor_leaf_stays_sharded(outcome: list[dict[str, Any]]) -> None:
    node_md, _, _ = outcome[0]["metadata"]
    rows = _plain(SEED)["w"].shape[0] // WORLD
    assert sorted(node_md["p.w"][1]) == [((r * rows, 0), (rows, 5)) for r in range(WORLD)]
    assert node_md["p.a"][1] == [((0, 0), (4, 3))]


def _assert_values(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, dict):
            _assert_values(got[k], v)
        else:
            assert torch.equal(got[k], v), k


@pytest.mark.parametrize("rank", range(WORLD))
def test_load_writes_in_place_into_the_node_as_into_the_dict(outcome: list[dict[str, Any]], rank: int) -> None:
    seen = outcome[rank]
    assert seen["same_node"] and seen["in_place"] and seen["sharded"]
    assert seen["tags"] == frozenset({tt.Locked}) and seen["locked_type"]
    want = _plain(SEED)
    rows = want["w"].shape[0] // WORLD
    want["w.local"] = want["w"][rank * rows : (rank + 1) * rows]
    _assert_values(seen["dict"], want)
    _assert_values(seen["node"], seen["dict"])
    _assert_values(seen["from_dict"], seen["dict"])
    _assert_values(seen["root"], seen["dict"])


# -- the Stateful protocol itself, in one process ---------------------------------------------


def test_state_dict_is_the_nodes_own_leaves_as_plain_dicts() -> None:
    values = _plain(SEED)
    td = tt.TensorDict(values).lock()
    sd = td.state_dict()
    assert type(sd) is dict and type(sd["sub"]) is dict and type(sd["sub"]["deep"]) is dict
    assert all(
        x is y for x, y in zip(tt.tree.leaves(td), (sd["a"], sd["n"], sd["sub"]["b"], sd["sub"]["deep"]["c"], sd["w"]))
    )
    assert _flat_keys(sd) == _flat_keys(values)


def test_load_state_dict_writes_in_place_and_skips_its_own_leaves() -> None:
    values = _plain(SEED)
    td = tt.TensorDict(_zeros(values)).lock()
    before = [(x, x._version) for x in tt.tree.leaves(td)]
    sd = td.state_dict()
    sd["a"] = values["a"]
    sd["sub"]["deep"]["c"] = values["sub"]["deep"]["c"]
    assert td.load_state_dict(sd) is td and td.tags == frozenset({tt.Locked})
    written = {id(td["a"]), id(td["sub", "deep", "c"])}
    for x, version in before:
        assert x._version == (version + 1 if id(x) in written else version)
    assert torch.equal(td["a"], values["a"]) and torch.equal(td["sub", "deep", "c"], values["sub"]["deep"]["c"])
    assert not td["n"].any()


@pytest.mark.parametrize("drop", [("n",), ("sub", "b")])
def test_load_state_dict_is_strict_and_writes_nothing_when_refused(drop: tuple[str, ...]) -> None:
    values = _plain(SEED)
    td = tt.TensorDict(_zeros(values))
    partial = _plain(SEED)
    parent = partial
    for k in drop[:-1]:
        parent = parent[k]
    del parent[drop[-1]]
    with pytest.raises(KeyMismatchError, match=drop[-1]):
        td.load_state_dict(partial)
    assert not any(x.any() for x in tt.tree.leaves(td))


class Point(tt.TensorClass):
    x: torch.Tensor
    label: str = "p"


def test_a_tensorclass_has_the_same_protocol() -> None:
    p = Point(x=torch.zeros(3), batch_size=[3])
    sd = p.state_dict()
    assert sd == {"x": p.x}
    assert p.load_state_dict({"x": torch.ones(3)}) is p and p.x.tolist() == [1.0, 1.0, 1.0]
