"""A pickled Memmap node comes back as the node that was pickled (its values, its mode) or is refused
with MemmapError; it never maps bytes another writer put under the same prefix (DESIGN 5.1, issue 29).

Mapped ``"r+"`` or ``"r"`` it travels by reference and maps the same files again (in place writes are
seen on both sides, through a torch.multiprocessing queue too); mapped ``"c"`` it travels by value as
its ``clone()``; ``copy.deepcopy`` is an in-memory copy. The worker lives at module level so that the
spawned child can import it; every wait is bounded.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import queue as queue_mod

import pytest
import torch
import torch.multiprocessing as mp

import tdtree as tt
from tdtree import Locked, Memmap, TensorDict
from tdtree._memmap import META, leaf_name, origin
from tdtree._pickle import rebuild_node
from tdtree.errors import MemmapError, WriteError
from tdtree.testing import assert_equal

MM = frozenset({Memmap, Locked})
TIMEOUT = 120.0
REPLACED = r"cannot unpickle a Memmap node: .*mm no longer holds the memmap directory that was mapped: another writer"


def dumps(node, how) -> bytes:
    if how == "pickle":
        return pickle.dumps(node)
    buf = io.BytesIO()
    torch.save(node, buf)
    return buf.getvalue()


def loads(blob, how):
    return pickle.loads(blob) if how == "pickle" else torch.load(io.BytesIO(blob), weights_only=True)


def round_trip(node, how):
    return loads(dumps(node, how), how)


def node(**leaves) -> TensorDict:
    return TensorDict({**leaves, "sub": {"y": torch.arange(6.0).reshape(2, 3)}}, [2])


def tags_below(td) -> list[frozenset]:
    return [td.tags] + [tags_below(v) for v in td.values() if isinstance(v, TensorDict)]


# -- another writer replaced the directory -----------------------------------------------------------


@pytest.mark.parametrize("how", ["pickle", "torch-weights-only"])
@pytest.mark.parametrize(
    ("first", "second"),
    [
        # same dtype, new values: they would read as the node's values
        (torch.tensor([5, 5], dtype=torch.int32), torch.tensor([6, 6], dtype=torch.int32)),
        # another dtype of the same size: int32 5 would read as float32 7e-45
        (torch.tensor([5.0, 5.0]), torch.tensor([5, 5], dtype=torch.int32)),
    ],
)
def test_a_replaced_directory_is_refused(tmp_path, how, first, second):
    prefix = tmp_path / "mm"
    td = node(x=first).memmap(prefix)
    blob = dumps(td, how)
    node(x=second).memmap(prefix, existsok=True)  # another writer
    with pytest.raises(MemmapError, match=REPLACED):
        loads(blob, how)
    assert torch.equal(td["x"], first)  # the node itself still maps the files it wrote
    assert torch.equal(tt.load_memmap(prefix)["x"], second)


def test_a_removed_directory_is_refused(tmp_path):
    td = node(x=torch.ones(2)).memmap(tmp_path / "mm")
    blob = pickle.dumps(td)
    for name in os.listdir(tmp_path / "mm"):
        os.remove(tmp_path / "mm" / name)
    os.rmdir(tmp_path / "mm")
    with pytest.raises(MemmapError, match=r"cannot unpickle a Memmap node: .*mm does not exist"):
        pickle.loads(blob)


def test_a_leaf_file_replaced_by_hand_is_refused(tmp_path):
    prefix = tmp_path / "mm"
    td = node(x=torch.ones(2)).memmap(prefix)
    blob = pickle.dumps(td)
    # another file of the same size under the same name, metadata untouched
    (tmp_path / "other.bin").write_bytes(torch.full((2,), 9.0).numpy().tobytes())
    os.replace(tmp_path / "other.bin", prefix / leaf_name(1))
    with pytest.raises(MemmapError, match=r"leaf-000001.bin is not the file that was mapped: another writer"):
        pickle.loads(blob)


def test_a_directory_written_again_by_the_same_values_is_refused(tmp_path):
    # equal bytes do not make the same files: the reference names the files, not their contents
    td = node(x=torch.ones(2)).memmap(tmp_path / "mm")
    blob = pickle.dumps(td)
    node(x=torch.ones(2)).memmap(tmp_path / "mm", existsok=True)
    with pytest.raises(MemmapError, match=REPLACED):
        pickle.loads(blob)


# -- an unchanged directory maps the same files ------------------------------------------------------


@pytest.mark.parametrize("how", ["pickle", "torch-weights-only"])
def test_an_unchanged_node_maps_the_same_files(tmp_path, how):
    td = node(x=torch.zeros(2)).memmap(tmp_path / "mm")
    back = round_trip(td, how)
    assert_equal(back, td)
    assert tags_below(back) == tags_below(td) == [MM, [MM]]
    for path in [("x",), ("sub", "y")]:
        assert origin(back[path]) == origin(td[path])  # same prefix, index, mode, file identities
    back["x"][0] = 3.0
    td["sub", "y"][1, 2] = -1.0
    assert td["x"][0] == 3.0 and back["sub", "y"][1, 2] == -1.0
    assert tt.load_memmap(tmp_path / "mm")["x"][0] == 3.0
    again = round_trip(back, how)  # what was unpickled pickles again
    assert origin(again["x"]) == origin(td["x"])


def test_shared_writes_do_not_invalidate_the_reference(tmp_path):
    # a leaf file's mtime moves with every write through a shared mapping: it is not part of its identity
    td = node(x=torch.zeros(2)).memmap(tmp_path / "mm")
    blob = pickle.dumps(td)
    td.update_({"x": torch.full((2,), 4.0)})
    tt.load_memmap(tmp_path / "mm").update_({"sub": {"y": torch.ones(2, 3)}})
    back = pickle.loads(blob)
    assert torch.equal(back["x"], torch.full((2,), 4.0)) and torch.equal(back["sub", "y"], torch.ones(2, 3))


def test_a_directory_renamed_away_and_back(tmp_path):
    # the reference names the prefix: a directory renamed away is not there; renamed back it is the same
    td = node(x=torch.ones(2)).memmap(tmp_path / "mm")
    loaded = tt.load_memmap(tmp_path / "mm")
    assert origin(loaded["x"]).meta == origin(td["x"]).meta  # load and memmap record one identity
    os.rename(tmp_path / "mm", tmp_path / "moved")
    with pytest.raises(MemmapError, match=r"mm does not exist"):
        pickle.loads(pickle.dumps(loaded))
    os.rename(tmp_path / "moved", tmp_path / "mm")
    assert_equal(pickle.loads(pickle.dumps(loaded)), td)


# -- modes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["pickle", "torch-weights-only"])
def test_read_only_comes_back_read_only(tmp_path, how):
    node(x=torch.ones(2)).memmap(tmp_path / "mm")
    ro = tt.load_memmap(tmp_path / "mm", mode="r")
    back = round_trip(ro, how)
    assert_equal(back, ro)
    assert tags_below(back) == [MM, [MM]] and origin(back["x"]).mode == "r"
    with pytest.raises(WriteError, match=r"'x' is read-only: it is mapped from .*leaf-000001.bin with mode='r'"):
        back.update_({"x": torch.zeros(2)})
    with pytest.raises(WriteError, match="read-only"):
        back["sub"].fill_("y", 0.0)
    assert torch.equal(tt.load_memmap(tmp_path / "mm")["x"], torch.ones(2))


@pytest.mark.parametrize("how", ["pickle", "torch-weights-only", "deepcopy"])
def test_copy_on_write_keeps_its_private_writes(tmp_path, how):
    node(x=torch.zeros(2)).memmap(tmp_path / "mm")
    cow = tt.load_memmap(tmp_path / "mm", mode="c")
    cow.update_({"x": torch.full((2,), 42.0)})
    expected = {"x": cow["x"].clone(), "sub": {"y": cow["sub", "y"].clone()}}
    back = copy.deepcopy(cow) if how == "deepcopy" else round_trip(cow, how)
    assert_equal(back, TensorDict(expected, [2]))
    # an in-memory copy: new storage, so no tag (as clone()); the node pickled is unchanged
    assert tags_below(back) == [frozenset(), [frozenset()]] and origin(back["x"]) is None
    assert tags_below(cow) == [MM, [MM]] and origin(cow["x"]).mode == "c"
    back.update_({"x": torch.full((2,), 7.0)})
    assert torch.equal(cow["x"], torch.full((2,), 42.0))
    assert torch.equal(tt.load_memmap(tmp_path / "mm")["x"], torch.zeros(2))


def test_one_copy_on_write_leaf_sends_the_whole_node_by_value(tmp_path):
    # the tags of every sub-node stay the root's: a node holding a private leaf anywhere is copied whole
    shared = node(x=torch.zeros(2)).memmap(tmp_path / "a")
    TensorDict({"z": torch.ones(2)}, [2]).memmap(tmp_path / "b")
    cow = tt.load_memmap(tmp_path / "b", mode="c")
    mixed = shared.unlock().update(cow.unlock())  # storages of its inputs only: the rule keeps Memmap
    assert tags_below(mixed) == [{Memmap}, [{Memmap}]] and origin(mixed["z"]).mode == "c"
    back = pickle.loads(pickle.dumps(mixed))
    assert_equal(back, mixed.clone())
    assert tags_below(back) == [frozenset(), [frozenset()]]  # the sub-node of r+ leaves too


@pytest.mark.parametrize("mode", ["r+", "r"])
def test_deepcopy_is_independent_of_the_files(tmp_path, mode):
    node(x=torch.zeros(2)).memmap(tmp_path / "mm")
    td = tt.load_memmap(tmp_path / "mm", mode=mode)
    plain = {"x": td["x"], "y": td["sub", "y"]}
    copied = copy.deepcopy(td)
    plain_copy = copy.deepcopy(plain)  # what torch does with the same tensors in a dict
    assert_equal(copied, td.unlock().clone())
    assert tags_below(copied) == [frozenset(), [frozenset()]]
    copied.update_({"x": torch.full((2,), 5.0), "sub": {"y": torch.ones(2, 3)}})
    plain_copy["x"].fill_(5.0)
    assert torch.equal(td["x"], torch.zeros(2)) and torch.equal(plain["x"], torch.zeros(2))
    assert torch.equal(tt.load_memmap(tmp_path / "mm")["x"], torch.zeros(2))
    # deepcopy keeps two leaves viewing one storage together, as it does for tensors in a dict
    both = td.unlock().set("alias", td["x"])
    copied = copy.deepcopy(both)
    assert copied["alias"].untyped_storage().data_ptr() == copied["x"].untyped_storage().data_ptr()


def test_deepcopy_of_other_nodes_is_unchanged(tmp_path):
    locked = node(x=torch.ones(2)).lock()
    shared = node(x=torch.ones(2)).share_memory()
    for td in (locked, shared):
        copied = copy.deepcopy(td)
        assert_equal(copied, td)
        assert tags_below(copied) == tags_below(td)
        assert copied["x"].data_ptr() != td["x"].data_ptr()


def test_crafted_memmap_node_with_data_by_value_is_refused():
    with pytest.raises(MemmapError, match="holds data but names no memmap file"):
        rebuild_node("tdtree.TensorDict", ("a",), (torch.ones(2),), (2,), None, ("Locked", "Memmap"))


def test_a_reference_of_an_older_tdtree_is_refused(tmp_path):
    node(x=torch.ones(2)).memmap(tmp_path / "mm")
    old = ("tdtree.memmap-leaf", str(tmp_path / "mm"), 1, True, 8, "float32", (2,), (1,), 0)
    with pytest.raises(MemmapError, match="pickled by an older tdtree, which records no identity of its files"):
        rebuild_node("tdtree.TensorDict", ("x",), (old,), (2,), None, ("Locked", "Memmap"))
    assert os.path.isfile(tmp_path / "mm" / META)


class Pair(tt.TensorClass):
    a: torch.Tensor
    b: torch.Tensor


def test_tensorclasses_pickle_and_deepcopy_as_their_nodes(tmp_path):
    shared = Pair(a=torch.zeros(2), b=torch.ones(2), batch_size=[2]).memmap(tmp_path / "mm")
    cow = tt.load_memmap(tmp_path / "mm", mode="c")
    cow.update_({"a": torch.full((2,), 42.0)})
    back = pickle.loads(pickle.dumps(cow))
    assert type(back) is Pair and back.tags == frozenset()
    assert torch.equal(back.a, torch.full((2,), 42.0)) and torch.equal(back.b, torch.ones(2))
    assert pickle.loads(pickle.dumps(shared)).tags == MM
    copied = copy.deepcopy(shared)
    assert type(copied) is Pair and copied.tags == frozenset()
    copied.update_({"a": torch.full((2,), 3.0)})
    assert torch.equal(shared.a, torch.zeros(2))


# -- through a torch.multiprocessing queue ---------------------------------------------------------------


def _worker(inbox: mp.Queue, out: mp.Queue) -> None:
    # the r+ node: report where its leaf is mapped from, then write in place
    td = inbox.get(timeout=TIMEOUT)
    found = origin(td["x"])
    out.put((sorted(t.name for t in td.tags), None if found is None else tuple(found)))
    td.update_({"x": torch.full((2,), 8.0)})
    out.put("written")
    # the copy-on-write node: its private values, and its tags
    cow = inbox.get(timeout=TIMEOUT)
    out.put((cow["x"].tolist(), sorted(t.name for t in cow.tags), origin(cow["x"]) is None))


def _get(q: mp.Queue, what: str):
    try:
        return q.get(timeout=TIMEOUT)
    except queue_mod.Empty:
        pytest.fail(f"no {what} from the worker within {TIMEOUT}s")


def test_through_a_spawned_worker_queue(tmp_path):
    td = node(x=torch.zeros(2)).memmap(tmp_path / "mm")
    TensorDict({"x": torch.zeros(2)}, [2]).memmap(tmp_path / "cow")
    cow = tt.load_memmap(tmp_path / "cow", mode="c")
    cow.update_({"x": torch.full((2,), 42.0)})
    before = cow["x"].untyped_storage().data_ptr()
    ctx = mp.get_context("spawn")
    inbox, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_worker, args=(inbox, out))
    proc.start()
    try:
        inbox.put(td)
        assert _get(out, "r+ node") == (["Locked", "Memmap"], tuple(origin(td["x"])))
        assert _get(out, "write") == "written"
        assert torch.equal(td["x"], torch.full((2,), 8.0))  # the worker mapped the same file, shared
        inbox.put(cow)
        assert _get(out, "copy-on-write node") == ([42.0, 42.0], [], True)
    finally:
        proc.join(TIMEOUT)
        if proc.is_alive():
            proc.kill()
            pytest.fail("the worker did not finish")
    assert proc.exitcode == 0
    # the sender's private mapping was copied, not moved into shared memory
    assert cow.tags == MM and cow["x"].untyped_storage().data_ptr() == before and origin(cow["x"]).mode == "c"
    assert torch.equal(tt.load_memmap(tmp_path / "cow")["x"], torch.zeros(2))
