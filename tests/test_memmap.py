"""Memory-mapped nodes: writing, loading, keys as file names, errors, pickling by reference."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from _nestedtree import nested_tree

import tdtree as tt
from tdtree import Locked, Memmap, TensorDict
from tdtree._memmap import META, leaf_name
from tdtree._pickle import rebuild_node, reference
from tdtree._tags import retag
from tdtree.errors import MemmapError, WriteError
from tdtree.testing import assert_equal

MM = frozenset({Memmap, Locked})
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tt.__file__)))


def nested() -> TensorDict:
    return TensorDict(
        {
            "obs": torch.randn(4, 3),
            "mask": torch.tensor([True, False, True, True]),
            "next": {"reward": torch.arange(4.0).unsqueeze(-1), "done": torch.zeros(4, 0)},
        },
        batch_size=[4],
    )


def sub_nodes(node: TensorDict) -> list[TensorDict]:
    out = [node]
    for value in node.values():
        if isinstance(value, TensorDict):
            out.extend(sub_nodes(value))
    return out


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def run_child(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# -- writing -------------------------------------------------------------------------------------


def test_memmap_writes_one_file_per_leaf_and_maps_them(tmp_path):
    td = nested()
    prefix = tmp_path / "mm"
    out = td.memmap(prefix)
    assert_equal(out, retag(td, MM))
    assert all(n.tags == MM for n in sub_nodes(out))
    assert isinstance(out, TensorDict[Memmap, Locked]) and out.is_memmap and out.is_locked
    assert sorted(os.listdir(prefix)) == sorted([META, *(leaf_name(i) for i in range(4))])
    for _, leaf in out.items(include_nested=True, leaves_only=True):
        if leaf.numel():
            assert reference(leaf)[1] == str(prefix)  # mapped from prefix's files (through its directory fd)
    doc = json.loads((prefix / META).read_text())
    assert doc["version"] == 2 and doc["tags"] == ["Locked", "Memmap"]
    assert doc["tree"][0]["batch_size"] == [4]


def test_memmap_leaves_input_unchanged(tmp_path):
    td = nested()
    before = [(leaf, leaf._version, leaf.clone()) for leaf in td.values(True, True)]
    out = td.memmap(tmp_path / "mm")
    for (leaf, version, copy), now in zip(before, td.values(True, True)):
        assert now is leaf and now._version == version and torch.equal(now, copy)
    for a, b in zip(td.values(True, True), out.values(True, True)):
        assert b.numel() == 0 or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def test_memmap_of_tagged_node_makes_its_own_tags(tmp_path):
    out = nested().lock().memmap(tmp_path / "mm")
    assert out.tags == MM
    again = out.unlock().memmap(tmp_path / "again")
    assert again.tags == MM


def test_noncontiguous_and_expanded_leaves_are_written_as_values(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    td = TensorDict({"t": base.T, "e": torch.arange(4).expand(5, 4).T, "z": torch.empty(4, 0, 2)}, [4])
    out = td.memmap(tmp_path / "mm")
    assert_equal(out, retag(td, MM))
    sizes = {k: (tmp_path / "mm" / leaf_name(i)).stat().st_size for i, k in enumerate(["e", "t", "z"])}
    assert sizes == {"e": 4 * 5 * 8, "t": 12 * 4, "z": 0}
    assert out["t"].is_contiguous() and out["e"].stride() == (5, 1)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex32,
        torch.complex64,
        torch.complex128,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ],
    ids=str,
)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_every_mappable_dtype_round_trips(tmp_path, dtype):
    raw = torch.randint(0, 256, (3, 2, 16), dtype=torch.uint8)
    value = raw.view(dtype) if dtype != torch.bool else raw > 100
    td = TensorDict({"x": value, "scalar": value[:, 0, 0]}, [3])

    def same_bits(a, b):
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

    out = td.memmap(tmp_path / "mm")
    back = tt.load_memmap(tmp_path / "mm")
    for node in (out, back):
        assert node["x"].dtype == dtype and node["scalar"].shape == (3,)
        assert same_bits(node["x"], value) and same_bits(node["scalar"].unsqueeze(-1), value[:, 0, :1])


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_unmappable_dtype_is_refused_before_writing(tmp_path):
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    td = TensorDict({"ok": torch.zeros(4), "sub": {"q": q}}, [4])
    with pytest.raises(MemmapError, match=r"leaf \('sub', 'q'\) of dtype torch.qint8"):
        td.memmap(tmp_path / "mm")
    assert os.listdir(tmp_path) == []


def test_conjugate_and_negative_views_are_written_resolved(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    td = TensorDict({"c": z.conj(), "n": torch._neg_view(torch.tensor([1.0, -2.0]))}, [2])
    out = td.memmap(tmp_path / "mm")
    assert torch.equal(out["c"], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    assert torch.equal(out["n"], torch.tensor([-1.0, 2.0]))


def test_device_is_cpu_or_none(tmp_path):
    empty = TensorDict({}, []).memmap(tmp_path / "empty")
    assert empty.device is None and empty.tags == MM and len(empty) == 0
    assert tt.load_memmap(tmp_path / "empty").device is None
    out = nested().memmap(tmp_path / "mm")
    assert out.device == torch.device("cpu")


# -- existing prefixes and atomic replacement -------------------------------------------------------


def test_existing_prefix_is_an_error_without_existsok(tmp_path):
    nested().memmap(tmp_path / "mm")
    before = (tmp_path / "mm" / META).read_bytes()
    with pytest.raises(MemmapError, match=r"mm exists; pass existsok=True"):
        TensorDict({"a": torch.ones(2)}, [2]).memmap(tmp_path / "mm")
    assert (tmp_path / "mm" / META).read_bytes() == before
    assert os.listdir(tmp_path) == ["mm"]


def test_existsok_replaces_and_old_mapping_stays_valid(tmp_path):
    prefix = tmp_path / "mm"
    old = TensorDict({"a": torch.zeros(3)}, [3]).memmap(prefix)
    new = TensorDict({"b": torch.ones(2, 2)}, [2]).memmap(prefix, existsok=True)
    assert os.listdir(tmp_path) == ["mm"]
    assert sorted(os.listdir(prefix)) == sorted([META, leaf_name(0)])
    assert_equal(tt.load_memmap(prefix), new)
    assert torch.equal(old["a"], torch.zeros(3))


def test_existsok_replaces_its_own_source(tmp_path):
    prefix = tmp_path / "mm"
    first = nested().memmap(prefix)
    again = first.memmap(prefix, existsok=True)
    assert_equal(again, first)
    assert_equal(tt.load_memmap(prefix), first)


def test_existsok_takes_an_empty_directory(tmp_path):
    (tmp_path / "mm").mkdir()
    out = nested().memmap(tmp_path / "mm", existsok=True)
    assert_equal(tt.load_memmap(tmp_path / "mm"), out)


def test_existsok_never_replaces_foreign_files(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("keep me")
    (tmp_path / "file").write_text("keep me too")
    with pytest.raises(MemmapError, match=r"docs is not a memmap directory that tdtree wrote"):
        nested().memmap(tmp_path / "docs", existsok=True)
    with pytest.raises(MemmapError, match=r"file exists and is not a directory"):
        nested().memmap(tmp_path / "file", existsok=True)
    assert (tmp_path / "docs" / "notes.txt").read_text() == "keep me"
    assert (tmp_path / "file").read_text() == "keep me too"
    assert sorted(os.listdir(tmp_path)) == ["docs", "file"]


@pytest.mark.parametrize("existing", [False, True], ids=["new", "replacing"])
def test_write_error_leaves_the_old_directory_or_none(tmp_path, monkeypatch, existing):
    from tdtree import _memmap

    prefix = tmp_path / "mm"
    if existing:
        old = TensorDict({"a": torch.arange(3)}, [3]).memmap(prefix)
    real = _memmap._write_leaf
    calls = []

    def failing(path, tensor):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(path, tensor)

    monkeypatch.setattr(_memmap, "_write_leaf", failing)
    fds = open_fds()
    with pytest.raises(MemmapError, match=r"cannot write .*mm/leaf-000001.bin: .*No space left"):
        nested().memmap(prefix, existsok=True)
    assert open_fds() == fds
    if existing:
        assert os.listdir(tmp_path) == ["mm"]
        assert_equal(tt.load_memmap(prefix), old)
    else:
        assert os.listdir(tmp_path) == []


def test_interrupt_while_writing_cleans_up(tmp_path, monkeypatch):
    from tdtree import _memmap

    def interrupted(path, tensor):
        raise KeyboardInterrupt

    monkeypatch.setattr(_memmap, "_write_leaf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nested().memmap(tmp_path / "mm")
    assert os.listdir(tmp_path) == []


def test_missing_parents_are_created(tmp_path):
    out = nested().memmap(tmp_path / "a" / "b" / "mm")
    assert_equal(tt.load_memmap(tmp_path / "a" / "b" / "mm"), out)


# -- keys as file names ----------------------------------------------------------------------------


KEYS = [
    "a/b",
    "..",
    "../../evil",
    "/etc/passwd",
    "with space",
    "ünïcødé ✓",
    "x" * 1000,
    "Case",
    "case",
    "",
    ".",
    "\\",
    "nul\x00byte",
]


def test_any_key_round_trips_and_nothing_escapes(tmp_path):
    work = tmp_path / "deep" / "er"
    work.mkdir(parents=True)
    data = {k: torch.full((2,), float(i)) for i, k in enumerate(KEYS)}
    td = TensorDict({**data, "sub": {"../../evil": torch.zeros(2, 1)}}, [2])
    listing = {p: sorted(os.listdir(p)) for p in (tmp_path, tmp_path / "deep", work)}
    out = td.memmap(work / "mm")
    assert_equal(tt.load_memmap(work / "mm"), out)
    assert_equal(out, retag(td, MM))
    assert {p: sorted(os.listdir(p)) for p in (tmp_path, tmp_path / "deep")} == {
        p: v for p, v in listing.items() if p != work
    }
    assert sorted(os.listdir(work)) == ["mm"]
    assert sorted(os.listdir(work / "mm")) == sorted([META, *(leaf_name(i) for i in range(len(KEYS) + 1))])


# -- loading -----------------------------------------------------------------------------------------


def test_load_memmap_maps_the_files(tmp_path):
    td = nested()
    td.memmap(tmp_path / "mm")
    back = tt.load_memmap(str(tmp_path / "mm"))
    assert_equal(back, retag(td, MM))
    assert all(n.tags == MM for n in sub_nodes(back))
    assert reference(back["obs"])[1:3] == (str(tmp_path / "mm"), 3)


def test_r_plus_writes_reach_the_file_and_other_mappings(tmp_path):
    a = nested().memmap(tmp_path / "mm")
    b = tt.load_memmap(tmp_path / "mm", mode="r+")
    b["obs"][0, 0] = 123.0
    assert a["obs"][0, 0] == 123.0
    assert tt.load_memmap(tmp_path / "mm")["obs"][0, 0] == 123.0


def test_r_mode_writes_stay_private(tmp_path):
    a = nested().memmap(tmp_path / "mm")
    before = a["obs"].clone()
    ro = tt.load_memmap(tmp_path / "mm", mode="r")
    assert ro.tags == MM
    ro["obs"].zero_()
    assert torch.equal(ro["obs"], torch.zeros(4, 3))
    assert torch.equal(a["obs"], before)
    assert torch.equal(tt.load_memmap(tmp_path / "mm", mode="r")["obs"], before)


def test_bad_mode():
    with pytest.raises(ValueError, match=r"mode must be 'r' .*, 'r\+' .* or 'c' .*got 'w'"):
        tt.load_memmap("/nonexistent", mode="w")


def test_another_process_sees_in_place_writes(tmp_path):
    prefix = tmp_path / "mm"
    mine = TensorDict({"x": torch.zeros(3)}, [3]).memmap(prefix)
    run_child(
        f"""
        import tdtree, torch
        td = tdtree.load_memmap({str(prefix)!r})
        assert td.tags == frozenset({{tdtree.Memmap, tdtree.Locked}})
        td["x"].copy_(torch.tensor([1.0, 2.0, 3.0]))
        """
    )
    assert torch.equal(mine["x"], torch.tensor([1.0, 2.0, 3.0]))
    mine["x"][0] = 9.0
    seen = run_child(
        f"""
        import tdtree
        print(tdtree.load_memmap({str(prefix)!r}, mode="r")["x"].tolist())
        """
    )
    assert seen.strip() == "[9.0, 2.0, 3.0]"


# -- errors naming the file ------------------------------------------------------------------------


@pytest.fixture
def stored(tmp_path):
    nested().memmap(tmp_path / "mm")
    return tmp_path / "mm"


def edit_meta(prefix, fn):
    doc = json.loads((prefix / META).read_text())
    fn(doc)
    (prefix / META).write_text(json.dumps(doc))


def grown(doc, item):
    """``doc``'s tree with ``item`` read as one more entry of the root node."""
    doc["tree"].append(item)
    doc["tree"][0]["entries"] += 1


def test_a_directory_of_format_version_1_loads(tmp_path):
    """Version 1 nested the tree: a directory written so still loads, and its broken trees are refused."""
    td = nested()
    stored = tmp_path / "mm"
    td.memmap(stored)
    edit_meta(stored, lambda d: d.update(version=1, tree=nested_tree(td)))
    assert_equal(tt.load_memmap(stored), retag(td, MM))
    edit_meta(stored, lambda d: d["tree"]["entries"][1][1].update(entries={}))
    with pytest.raises(MemmapError, match=r"meta.json: node 'next' has no list of entries"):
        tt.load_memmap(stored)


def test_missing_metadata_file(tmp_path):
    (tmp_path / "mm").mkdir()
    with pytest.raises(MemmapError, match=r"missing metadata file .*mm/meta.json"):
        tt.load_memmap(tmp_path / "mm")
    with pytest.raises(MemmapError, match=r"missing metadata file .*nothing/meta.json"):
        tt.load_memmap(tmp_path / "nothing")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", r"Expecting property name"),
        ("[1, 2]", r"not a tdtree memmap description"),
        (
            '{"format": "tdtree-memmap", "version": 1, "type": "os.system", "tree": {}}',
            r"unknown node type 'os.system'",
        ),
        ("[" * 100000 + "]" * 100000, r"recursion|nests too deeply"),
    ],
    ids=["syntax", "not-a-dict", "bad-type", "deep"],
)
def test_corrupt_metadata_file(stored, text, reason):
    (stored / META).write_text(text)
    with pytest.raises(MemmapError, match=rf"corrupt metadata file .*mm/meta.json: .*{reason}"):
        tt.load_memmap(stored)


@pytest.mark.parametrize(
    "edit, reason",
    [
        (
            lambda d: d["tree"][0].update(batch_size=[5]),
            r"entry 'mask' has shape \(4,\), which does not start with the batch_size \(5,\)",
        ),
        (lambda d: d["tree"][0].update(batch_size="4"), r"the root node has a malformed batch_size '4'"),
        (
            lambda d: grown(d, {"key": "mask", "leaf": 4, "dtype": "bool", "shape": [4]}),
            r"the root node holds the key 'mask' twice",
        ),
        (lambda d: d["tree"][1].update(leaf=3), r"leaf 'mask' should be leaf 0, found 3"),
        (lambda d: d["tree"][1].update(shape=[-1]), r"leaf 'mask' has a malformed shape \[-1\]"),
        (lambda d: d["tree"][1].update(dtype="float99"), r"leaf 'mask' has an unknown dtype 'float99'"),
        (lambda d: d["tree"][0].update(device="cuda"), r"device 'cuda': memmapped leaves live on the cpu"),
        (lambda d: grown(d, [3, {}]), r"the root node has a malformed entry \[3, \{\}\]"),
        (lambda d: d["tree"].pop(), r"the tree ends before the last of the 3 entries of the root node"),
        (lambda d: d["tree"].append(d["tree"][1]), r"it holds 1 items after the root node's entries"),
        (lambda d: d.update(tree=d["tree"][0]), r"its tree is not a list of nodes and leaves but a dict"),
    ],
    ids=["batch", "batch-type", "duplicate", "index", "shape", "dtype", "device", "entry", "short", "long", "nested"],
)
def test_metadata_that_does_not_fit(stored, edit, reason):
    edit_meta(stored, edit)
    with pytest.raises(MemmapError, match=rf"corrupt metadata file .*mm/meta.json: {reason}"):
        tt.load_memmap(stored)


def test_unknown_format_version(stored):
    edit_meta(stored, lambda d: d.update(version=99))
    with pytest.raises(MemmapError, match=r"meta.json has format version 99; this tdtree reads versions 1, 2"):
        tt.load_memmap(stored)


def test_dtype_that_cannot_be_mapped(stored):
    edit_meta(stored, lambda d: d["tree"][1].update(dtype="qint8"))
    with pytest.raises(MemmapError, match=r"leaf 'mask' in .*meta.json has dtype torch.qint8, which cannot be mapped"):
        tt.load_memmap(stored)


def test_missing_leaf_file_is_not_created(stored):
    os.remove(stored / leaf_name(1))
    fds = open_fds()
    with pytest.raises(MemmapError, match=r"missing leaf file .*mm/leaf-000001.bin"):
        tt.load_memmap(stored)
    assert not (stored / leaf_name(1)).exists()
    assert open_fds() == fds


@pytest.mark.parametrize("size", [3, 100], ids=["short", "long"])
def test_leaf_file_of_the_wrong_size_is_not_changed(stored, size):
    (stored / leaf_name(0)).write_bytes(b"\x01" * size)
    with pytest.raises(
        MemmapError, match=rf"leaf file .*mm/leaf-000000.bin holds {size} bytes; its metadata asks for 4"
    ):
        tt.load_memmap(stored)
    assert (stored / leaf_name(0)).stat().st_size == size


# -- pickling ------------------------------------------------------------------------------------------


def torch_round_trip(td, weights_only):
    buf = io.BytesIO()
    torch.save(td, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=weights_only)


@pytest.mark.parametrize("kind", ["plain", "locked", "memmap"])
@pytest.mark.parametrize("how", ["pickle", "torch-weights-only", "torch-full"])
def test_pickling_keeps_values_and_tags(tmp_path, kind, how):
    td = {"plain": nested, "locked": lambda: nested().lock(), "memmap": lambda: nested().memmap(tmp_path / "mm")}[
        kind
    ]()
    if how == "pickle":
        back = pickle.loads(pickle.dumps(td))
    else:
        back = torch_round_trip(td, weights_only=how == "torch-weights-only")
    assert_equal(back, td)
    assert all(n.tags == td.tags for n in sub_nodes(back))


def test_memmap_pickles_by_reference(tmp_path):
    td = TensorDict({"big": torch.zeros(1000, 1000), "empty": torch.zeros(1000, 0)}, [1000]).memmap(tmp_path / "mm")
    data = pickle.dumps(td)
    assert len(data) < 2000
    back = pickle.loads(data)
    assert reference(back["big"])[1:4] == reference(td["big"])[1:4]
    back["big"][3, 4] = 5.0
    assert td["big"][3, 4] == 5.0


def test_read_only_node_unpickles_read_only(tmp_path):
    nested().memmap(tmp_path / "mm")
    ro = tt.load_memmap(tmp_path / "mm", mode="r")
    back = pickle.loads(pickle.dumps(ro))
    assert back.tags == MM and reference(back["obs"])[3] == "r"
    with pytest.raises(WriteError, match="read-only"):
        back.fill_("obs", 7.0)
    assert_equal(back, ro)


def test_memmap_node_pickles_to_another_process(tmp_path):
    td = TensorDict({"x": torch.zeros(2)}, [2]).memmap(tmp_path / "mm")
    (tmp_path / "node.pkl").write_bytes(pickle.dumps(td))
    run_child(
        f"""
        import pickle, tdtree
        td = pickle.loads(open({str(tmp_path / "node.pkl")!r}, "rb").read())
        assert td.is_memmap and td.is_locked
        td["x"].fill_(4.0)
        """
    )
    assert torch.equal(td["x"], torch.full((2,), 4.0))


def test_views_of_a_memmap_leaf_pickle_by_reference(tmp_path):
    td = TensorDict({"m": torch.arange(12.0).reshape(4, 3)}, []).memmap(tmp_path / "mm")
    views = td.apply(lambda m: m.T[1:, 1:3])
    assert views.tags == MM  # the same storage: the rule keeps the tags
    ref = reference(views["m"])
    assert ref[1:3] == (str(tmp_path / "mm"), 0) and ref[8:] == ((2, 2), (1, 3), 4)
    again = pickle.loads(pickle.dumps(views))["m"]
    assert torch.equal(again, views["m"]) and again.stride() == (1, 3)
    again[0, 0] = -1.0
    assert td["m"][1, 1] == -1.0


def test_memmap_tag_on_unmapped_leaves_cannot_pickle():
    fake = retag(TensorDict({"a": torch.ones(2)}, [2]), MM)
    with pytest.raises(MemmapError, match=r"leaf is not mapped from a memmap file; pickle node.unlock\(\).clone\(\)"):
        pickle.dumps(fake)


class Crafted:
    """Builds a pickle that hands rebuild_node (the one safe global) a leaf reference of its choosing."""

    def __init__(self, ref):
        self.ref = ref

    def __reduce__(self):
        return rebuild_node, ("tdtree.TensorDict", ("a",), (self.ref,), (), None, ("Locked", "Memmap"))


def test_crafted_references_open_nothing_else(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / leaf_name(0)).write_bytes(b"\x00" * 8)
    target = tmp_path / "planted"
    ids = (0, 0, 0, 0), (0, 0)

    def crafted(prefix, index, nbytes, shape, meta=ids[0], file=ids[1], mode="r+", dtype="float32"):
        return ("tdtree.memmap-leaf/2", str(prefix), index, mode, meta, file, nbytes, dtype, shape, (1,), 0)

    cases = [
        (crafted(secret, 0, 8, (2,)), r"missing metadata file .*secret/meta.json"),
        (crafted(target, 0, 8, (2,)), r"planted does not exist"),
        (crafted("/x", "0", 8, (2,)), r"malformed memmap leaf reference"),
        (crafted("/x", 0, 8, (2,), mode="w"), r"malformed memmap leaf reference"),
        (crafted("/x", 0, 8, (2,), dtype="qint8"), r"malformed memmap leaf reference"),
        (crafted("/x", 0, 8, (2,), meta=(0, 0)), r"malformed memmap leaf reference"),
        (("os.system", "touch x"), r"malformed memmap leaf reference"),
    ]
    td = nested().memmap(tmp_path / "mm")
    meta = reference(td["obs"])[4]
    cases += [
        (crafted(tmp_path / "mm", 3, 48, (12,)), r"mm no longer holds the memmap directory that was mapped"),
        (crafted(tmp_path / "mm", 7, 8, (2,), meta), r"missing leaf file .*leaf-000007.bin"),
        (crafted(tmp_path / "mm", 3, 48, (12,), meta), r"leaf-000003.bin is not the file that was mapped"),
        (crafted(tmp_path / "mm", 3, 48, (20,), meta, reference(td["obs"])[5]), r"does not fit .*leaf-000003.bin"),
    ]
    for ref, message in cases:
        buf = io.BytesIO()
        torch.save(Crafted(ref), buf)
        buf.seek(0)
        with pytest.raises(MemmapError, match=message):
            torch.load(buf, weights_only=True)
    assert not target.exists() and not (tmp_path / "mm" / leaf_name(7)).exists()
    assert (secret / leaf_name(0)).stat().st_size == 8


# -- issue 19: files that cannot be turned against the user ---------------------------------------


def test_one_element_leaf_with_non_unit_stride(tmp_path):
    leaf = torch.arange(4)[::2][:1]
    back = TensorDict({"x": leaf}, [1]).memmap(tmp_path / "mm")
    assert back["x"].tolist() == [0]
    tt.save(TensorDict({"x": leaf}, [1]), tmp_path / "td.pt")
    assert tt.load(tmp_path / "td.pt")["x"].tolist() == [0]


def test_existsok_keeps_a_directory_with_other_files(tmp_path):
    prefix = tmp_path / "mm"
    TensorDict({"x": torch.zeros(2)}, [2]).memmap(prefix)
    (prefix / "notes.txt").write_text("mine")
    with pytest.raises(MemmapError, match="not a memmap directory that tdtree wrote"):
        TensorDict({"x": torch.ones(2)}, [2]).memmap(prefix, existsok=True)
    assert (prefix / "notes.txt").read_text() == "mine"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / META).write_text("{}")
    with pytest.raises(MemmapError, match="not a memmap directory that tdtree wrote"):
        TensorDict({"x": torch.ones(2)}, [2]).memmap(foreign, existsok=True)
    assert (foreign / META).read_text() == "{}"


def test_symlinks_are_never_followed(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes(range(8)))
    prefix = tmp_path / "mm"
    TensorDict({"x": torch.zeros(8, dtype=torch.uint8)}, [8]).memmap(prefix)
    os.unlink(prefix / leaf_name(0))
    os.symlink(outside, prefix / leaf_name(0))
    with pytest.raises(MemmapError, match="leaf-000000.bin is a symlink"):
        tt.load_memmap(prefix)
    assert outside.read_bytes() == bytes(range(8))
    other = tmp_path / "other"
    TensorDict({"x": torch.zeros(8, dtype=torch.uint8)}, [8]).memmap(other)
    os.symlink(other, tmp_path / "link")
    with pytest.raises(MemmapError, match="link is a symlink"):
        tt.load_memmap(tmp_path / "link")
    os.replace(other / META, tmp_path / "meta-outside.json")
    os.symlink(tmp_path / "meta-outside.json", other / META)
    with pytest.raises(MemmapError, match="meta.json is a symlink"):
        tt.load_memmap(other)


def test_hostile_metadata_refused_quickly(tmp_path):
    prefix = tmp_path / "mm"
    TensorDict({"x": torch.zeros(2)}, [2]).memmap(prefix)
    os.unlink(prefix / META)
    os.mkfifo(prefix / META)
    with pytest.raises(MemmapError, match="meta.json is not a regular file"):
        tt.load_memmap(prefix)
    os.unlink(prefix / META)
    doc = {
        "format": "tdtree-memmap",
        "version": 1,
        "type": "tdtree.TensorDict",
        "tags": ["Locked", "Memmap"],
        "tree": {
            "batch_size": [],
            "device": "cpu",
            "entries": [["x", {"leaf": 0, "dtype": "float32", "shape": [2**63]}]],
        },
    }
    (prefix / META).write_text(json.dumps(doc))
    with pytest.raises(MemmapError, match=r"meta.json.*\[9223372036854775808\]"):
        tt.load_memmap(prefix)


def test_mode_r_refuses_writes_mode_c_keeps_them_private(tmp_path):
    prefix = tmp_path / "mm"
    TensorDict({"x": torch.zeros(3)}, [3]).memmap(prefix)
    ro = tt.load_memmap(prefix, mode="r")
    for write in (
        lambda t: t.update_({"x": 1.0}),
        lambda t: t.zero_(),
        lambda t: t.at[0].set_(1.0),
        lambda t: t.fill_("x", 1.0),
        lambda t: t[1:].copy_(t[1:].unlock().clone()),
    ):
        with pytest.raises(tt.WriteError, match="read-only: it is mapped from .*mode='r'"):
            write(ro)
    cow = tt.load_memmap(prefix, mode="c")
    cow.update_({"x": 5.0})
    assert cow["x"].tolist() == [5.0] * 3 and tt.load_memmap(prefix)["x"].tolist() == [0.0] * 3


def test_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        TensorDict({"x": torch.zeros(2)}, [2]).memmap(tmp_path / "mm")
        tt.save(TensorDict({"x": torch.zeros(2)}, [2]), tmp_path / "td.pt")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "mm").st_mode & 0o777 == 0o755
    assert os.stat(tmp_path / "td.pt").st_mode & 0o777 == 0o644


def test_stale_temporary_directory_removed_by_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".mm.{int(dead.stdout)}.abcdef.tmp"
    stale.mkdir()
    TensorDict({"x": torch.zeros(2)}, [2]).memmap(tmp_path / "mm")
    assert not stale.exists()


def test_mapped_leaves_hold_no_file_descriptors(tmp_path):
    written = TensorDict({f"k{i}": torch.full((3,), float(i)) for i in range(50)}, [3]).memmap(tmp_path / "mm")
    fds = open_fds()
    shared, private = tt.load_memmap(tmp_path / "mm"), tt.load_memmap(tmp_path / "mm", mode="c")
    assert open_fds() == fds  # a descriptor per leaf would run out on large nodes
    assert_equal(shared, written)
    assert_equal(private, written)
