"""tdtree.save / tdtree.load: one file, atomic writes, safe against untrusted input."""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import pytest
import torch

import tdtree as tt
from tdtree import Locked, TensorDict
from tdtree._pickle import rebuild_node
from tdtree.errors import SerializationError
from tdtree.testing import assert_equal


def nested() -> TensorDict:
    return TensorDict(
        {
            "obs": torch.randn(4, 3),
            "mask": torch.tensor([True, False, True, True]),
            "half": torch.randn(4, 2, dtype=torch.bfloat16),
            "z": torch.randn(4, dtype=torch.complex64),
            "next": {
                "reward": torch.arange(4.0).unsqueeze(-1),
                "done": torch.zeros(4, 0),
                "deep": {"x": torch.ones(4, 2, 1)},
            },
        },
        batch_size=[4],
    )


class Marker:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_round_trip(tmp_path):
    td = nested()
    tt.save(td, tmp_path / "td.pt")
    back = tt.load(tmp_path / "td.pt")
    assert_equal(back, td)
    assert back.tags == frozenset() and back.device == torch.device("cpu")
    for a, b in zip(td.values(True, True), back.values(True, True)):
        assert b.numel() == 0 or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def test_save_leaves_input_unchanged(tmp_path):
    td = nested()
    before = [(leaf, leaf._version, leaf.clone()) for leaf in td.values(True, True)]
    tt.save(td, str(tmp_path / "td.pt"))
    for (leaf, version, copy), now in zip(before, td.values(True, True)):
        assert now is leaf and now._version == version and torch.equal(now, copy)


def test_empty_and_odd_keys_round_trip(tmp_path):
    keys = ["a/b", "../../evil", "ünïcødé", "x" * 1000, "Case", "case", ""]
    td = TensorDict({k: torch.full((2,), float(i)) for i, k in enumerate(keys)}, [2])
    tt.save(td, tmp_path / "td.pt")
    assert_equal(tt.load(tmp_path / "td.pt"), td)
    assert os.listdir(tmp_path) == ["td.pt"]
    tt.save(TensorDict({}, []), tmp_path / "empty.pt")
    assert_equal(tt.load(tmp_path / "empty.pt"), TensorDict({}, []))


def test_views_are_saved_as_compact_values(tmp_path):
    big = torch.randn(1000, 100)
    td = TensorDict({"row": big[3:5], "t": big[:4, :2].T.T, "e": torch.arange(3).expand(4, 3)}, [])
    tt.save(td, tmp_path / "td.pt")
    assert os.path.getsize(tmp_path / "td.pt") < 20_000
    back = tt.load(tmp_path / "td.pt")
    assert_equal(back, td)
    assert back["e"].stride() == (3, 1)


def test_cpu_leaves_load_as_aligned_disjoint_views_of_one_buffer(tmp_path):
    td = nested()
    tt.save(td, tmp_path / "td.pt")
    back = tt.load(tmp_path / "td.pt")
    leaves = [x for x in back.values(True, True) if x.numel()]
    assert len({x.untyped_storage().data_ptr() for x in leaves}) == 1
    assert all(x.data_ptr() % 64 == 0 and x.is_contiguous() for x in leaves)
    back["obs"].fill_(7.0)
    assert_equal(back.exclude("obs"), td.exclude("obs"))


def test_leaves_off_the_cpu_are_saved_apart(tmp_path):
    td = TensorDict({"a": torch.ones(2), "m": torch.empty(2, 5, device="meta"), "z": torch.zeros(2, 3)}, [2])
    tt.save(td, tmp_path / "td.pt")
    payload = torch.load(tmp_path / "td.pt", weights_only=True)
    assert json.loads(payload["tdtree"])["packed"] == [0, 2] and len(payload["tensors"]) == 1
    back = tt.load(tmp_path / "td.pt")
    assert back["m"].device == torch.device("meta") and back["m"].shape == (2, 5) and back.device is None
    assert torch.equal(back["a"], td["a"]) and torch.equal(back["z"], td["z"])


def test_conjugate_views_are_saved_resolved(tmp_path):
    z = torch.tensor([1 + 2j], dtype=torch.complex64)
    tt.save(TensorDict({"c": z.conj()}, [1]), tmp_path / "td.pt")
    back = tt.load(tmp_path / "td.pt")
    assert not back["c"].is_conj() and torch.equal(back["c"], torch.tensor([1 - 2j], dtype=torch.complex64))


def test_locked_is_kept_and_storage_tags_are_not(tmp_path):
    tt.save(nested().lock(), tmp_path / "locked.pt")
    back = tt.load(tmp_path / "locked.pt")
    assert back.tags == frozenset({Locked}) and back["next"].tags == frozenset({Locked})
    mm = nested().memmap(tmp_path / "mm")
    tt.save(mm, tmp_path / "mm.pt")
    back = tt.load(tmp_path / "mm.pt")
    assert back.tags == frozenset({Locked})
    assert_equal(back, mm, check_tags=False)
    assert back["obs"].untyped_storage().filename is None


def test_devices_are_kept_as_recorded(tmp_path):
    td = TensorDict({"a": torch.zeros(2), "empty": TensorDict({}, [2])}, [2])
    assert td.device == td["empty"].device == torch.device("cpu")
    tt.save(td, tmp_path / "td.pt")
    assert_equal(tt.load(tmp_path / "td.pt"), td)
    td.memmap(tmp_path / "mm")
    assert_equal(tt.load_memmap(tmp_path / "mm"), td, check_tags=False)


def test_device_argument(tmp_path):
    tt.save(nested(), tmp_path / "td.pt")
    back = tt.load(tmp_path / "td.pt", device="cpu")
    assert back.device == torch.device("cpu") and back["next"].device == torch.device("cpu")
    no_device = TensorDict({}, [])
    tt.save(no_device, tmp_path / "none.pt")
    assert tt.load(tmp_path / "none.pt").device is None


def test_save_replaces_atomically(tmp_path, monkeypatch):
    path = tmp_path / "td.pt"
    tt.save(TensorDict({"a": torch.zeros(2)}, [2]), path)
    td = nested()
    tt.save(td, path)
    assert_equal(tt.load(path), td)
    before = path.read_bytes()

    def broken(obj, f, *args, **kwargs):
        f.write(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="No space left"):
        tt.save(TensorDict({"b": torch.ones(3)}, [3]), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["td.pt"]


def test_save_refuses_non_nodes(tmp_path):
    with pytest.raises(TypeError, match=r"tdtree.save takes a node, got dict"):
        tt.save({"a": torch.zeros(1)}, tmp_path / "x.pt")
    assert os.listdir(tmp_path) == []


# -- untrusted input -----------------------------------------------------------------------------------


def test_the_marker_pickle_is_real(tmp_path):
    marker = tmp_path / "proof"
    pickle.loads(pickle.dumps(Marker(marker)))
    assert marker.exists()


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_malicious_pickle_is_refused_and_never_run(tmp_path, writer):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    if writer == "torch.save":
        torch.save({"tdtree": "{}", "packed": torch.zeros(0, dtype=torch.uint8), "tensors": [Marker(marker)]}, path)
    else:
        path.write_bytes(pickle.dumps(Marker(marker), protocol=2))
    with pytest.raises(SerializationError, match=r"refused to load .*evil.pt: .*GLOBAL posix.system"):
        tt.load(path)
    assert not marker.exists()


def test_a_pickled_node_is_not_a_save_file(tmp_path):
    torch.save(nested(), tmp_path / "node.pt")
    with pytest.raises(
        SerializationError,
        match=r"corrupt tdtree save file .*node.pt: it does not hold a tdtree description, a packed buffer",
    ):
        tt.load(tmp_path / "node.pt")


def test_garbage_file(tmp_path):
    (tmp_path / "junk").write_bytes(b"\x00\x01 this is not a checkpoint")
    with pytest.raises(
        SerializationError, match=r"refused to load .*junk: it is not a tdtree save file.*\(Unsupported operand 0\)"
    ):
        tt.load(tmp_path / "junk")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.pt"):
        tt.load(tmp_path / "nope.pt")


def rewrite(path, fn):
    payload = torch.load(path, weights_only=True)
    doc = json.loads(payload["tdtree"])
    fn(doc, payload)
    payload["tdtree"] = json.dumps(doc)
    torch.save(payload, path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d, p: d.update(version=4), r"td.pt has format version 4; this tdtree reads versions 2, 3"),
        (lambda d, p: d.update(format="other"), r"corrupt tdtree save file .*: it is not a tdtree save description"),
        (
            lambda d, p: d.update(type="builtins.eval"),
            r"corrupt tdtree save file .*: unknown node type 'builtins.eval'",
        ),
        (lambda d, p: d.update(tags="Locked"), r"corrupt tdtree save file .*: malformed tags 'Locked'"),
        (
            lambda d, p: p["tensors"].append(torch.zeros(1)),
            r"corrupt tdtree save file .*: it holds 1 separate tensors for 0 leaves",
        ),
        (lambda d, p: d.update(packed=[0, 1]), r"leaf \('c', 'd'\) should be torch.float32 \(2,\), found None"),
        (
            lambda d, p: (d.update(packed=[1, 2]), p["tensors"].append(torch.zeros(2, dtype=torch.int32))),
            r"leaf 'a' should be torch.float32 \(2, 1\), found torch.int32 \(2,\)",
        ),
        (lambda d, p: d.update(packed=[0, 1, 2, 3]), r"its list of packed leaves names 4 leaves, it holds 3"),
        (lambda d, p: d.update(packed=[2, 1]), r"malformed list of packed leaves \[2, 1\]"),
        (
            lambda d, p: p.update(packed=p["packed"][:-1]),
            r"its packed buffer holds 135 bytes, too few for leaf \('c', 'd'\)",
        ),
        (
            lambda d, p: p.update(packed=torch.zeros(200, dtype=torch.uint8)),
            r"its packed buffer holds 200 bytes for 136 bytes of leaves",
        ),
        (
            lambda d, p: p.update(packed=torch.zeros(136)),
            r"packed buffer should be a contiguous 1-d uint8 tensor, found torch.float32 \(136,\)",
        ),
        (
            lambda d, p: d["tree"][0].update(batch_size=[3]),
            r"entry 'a' has shape \(2, 1\), which does not start with the batch_size \(3,\)",
        ),
        (lambda d, p: d["tree"][0].update(device="nowhere"), r"unknown device 'nowhere'"),
        (lambda d, p: d["tree"][0].update(device="meta"), r"the root node is on meta but its leaf 'a' is on cpu"),
        (lambda d, p: d.update(parameters="a"), r"malformed list of parameter leaves a"),
        (lambda d, p: d.update(grad=[2, 0]), r"malformed list of grad-requiring leaves \[2, 0\]"),
        (lambda d, p: d.update(grad=[1]), r"leaf 'b' of dtype torch.int64 cannot require grad"),
        (
            lambda d, p: d.update(parameters=[0, 5]),
            r"lists of parameters and grad-requiring leaves name leaf 5; it holds 3",
        ),
    ],
    ids=[
        "version",
        "format",
        "type",
        "tags",
        "extra",
        "missing",
        "mismatch",
        "packed-extra",
        "packed-order",
        "buffer-short",
        "buffer-long",
        "buffer-dtype",
        "batch",
        "device",
        "device-leaf",
        "parameters-list",
        "grad-order",
        "grad-int",
        "parameters-beyond",
    ],
)
def test_descriptions_that_do_not_fit(tmp_path, edit, message):
    path = tmp_path / "td.pt"
    tt.save(TensorDict({"a": torch.zeros(2, 1), "b": torch.arange(2), "c": {"d": torch.ones(2)}}, [2]), path)
    rewrite(path, edit)
    with pytest.raises(SerializationError, match=message):
        tt.load(path)


def test_description_that_is_not_json(tmp_path):
    torch.save({"tdtree": "{nope", "packed": torch.zeros(0, dtype=torch.uint8), "tensors": []}, tmp_path / "td.pt")
    with pytest.raises(SerializationError, match=r"corrupt tdtree save file .*td.pt: its description is not JSON"):
        tt.load(tmp_path / "td.pt")


# -- issue 19: loading is validation ----------------------------------------------------------------


def _payload(tmp_path, **tensors):
    td = TensorDict({"a": torch.zeros(4), "b": torch.ones(4)}, [4])
    tt.save(td, tmp_path / "td.pt")
    payload = torch.load(tmp_path / "td.pt", weights_only=True)
    doc = json.loads(payload["tdtree"])
    doc["packed"] = []
    payload["tdtree"] = json.dumps(doc)
    payload["packed"] = torch.zeros(0, dtype=torch.uint8)
    payload["tensors"] = [tensors["a"], tensors["b"]]
    torch.save(payload, tmp_path / "bad.pt")
    return tmp_path / "bad.pt"


@pytest.mark.parametrize(
    "case",
    ["shared_storage", "stride0", "parameter", "sparse", "view"],
)
def test_hand_built_leaves_refused(tmp_path, case):
    b = torch.ones(4)
    a = {
        "shared_storage": None,
        "stride0": torch.zeros(1).expand(4),
        "parameter": torch.nn.Parameter(torch.zeros(4)),
        "sparse": torch.zeros(4).to_sparse(),
        "view": torch.zeros(8)[::2],
    }[case]
    if case == "shared_storage":  # two compact-looking leaves over one storage
        a = torch.empty(0).set_(b.untyped_storage(), 0, (4,), (1,))
    path = _payload(tmp_path, a=a, b=b)
    with pytest.raises(SerializationError, match=r"bad.pt"):
        tt.load(path)


def test_compressed_record_refused(tmp_path):
    tt.save(TensorDict({"a": torch.zeros(4)}, [4]), tmp_path / "td.pt")
    # torch.save's copy carries the CRC-32 that zipfile checks on reading (tdtree.save writes none)
    torch.save(torch.load(tmp_path / "td.pt", weights_only=True), tmp_path / "crc.pt")
    with zipfile.ZipFile(tmp_path / "crc.pt") as src, zipfile.ZipFile(tmp_path / "bomb.pt", "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(SerializationError, match=r"bomb.pt: its record .* is compressed"):
        tt.load(tmp_path / "bomb.pt")


def test_fifo_and_devices_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo.pt")
    with pytest.raises(SerializationError, match="fifo.pt is not a regular file"):
        tt.load(tmp_path / "fifo.pt")
    os.symlink("/dev/zero", tmp_path / "zero.pt")
    with pytest.raises(SerializationError, match="zero.pt is not a regular file"):
        tt.load(tmp_path / "zero.pt")


class _Crafted:
    def __init__(self, args):
        self.args = args

    def __reduce__(self):
        return rebuild_node, self.args


@pytest.mark.parametrize(
    "args",
    [
        ("tdtree.TensorDict", ("a", "b", "c"), (torch.zeros(5), torch.zeros(5)), (100,), None, ()),
        ("tdtree.TensorDict", ("b", "a"), (torch.zeros(5), torch.zeros(5)), (5,), None, ()),
        ("tdtree.TensorDict", ("a",), (torch.zeros(5),), (100,), None, ()),
        ("tdtree.TensorDict", ("a",), (torch.zeros(5),), (5,), None, ("Bogus",)),
    ],
)
def test_weights_only_reconstruction_validates(tmp_path, args):
    torch.save(_Crafted(args), tmp_path / "crafted.pt")
    with pytest.raises(SerializationError, match="cannot unpickle"):
        torch.load(tmp_path / "crafted.pt", weights_only=True)


def test_leaf_aliasing_the_packed_buffer_refused(tmp_path):
    tt.save(TensorDict({"a": torch.zeros(4), "b": torch.ones(4, dtype=torch.uint8)}, [4]), tmp_path / "td.pt")
    payload = torch.load(tmp_path / "td.pt", weights_only=True)
    doc = json.loads(payload["tdtree"])
    doc["packed"] = [0]  # "b" moves out of the buffer, as a view of it
    payload["tdtree"] = json.dumps(doc)
    buffer = payload["packed"]
    payload["tensors"] = [torch.empty(0, dtype=torch.uint8).set_(buffer.untyped_storage(), 16, (4,), (1,))]
    payload["packed"] = buffer[:16]
    torch.save(payload, tmp_path / "alias.pt")
    with pytest.raises(SerializationError, match=r"alias.pt: leaf 'b' .*(shares its storage|not a compact)"):
        tt.load(tmp_path / "alias.pt")
