"""tdtree.save's file: streamed from the leaves in torch.save's format, loadable by older readers and
from older writers; damaged files, full disks and killed saves give named errors and leave nothing behind."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from _nestedtree import nested_tree

import tdtree as tt
from tdtree import TensorDict
from tdtree.errors import SerializationError
from tdtree.testing import assert_equal


def sample() -> TensorDict:
    return TensorDict(
        {
            "w": torch.randn(3, 5),
            "b": torch.arange(3, dtype=torch.int16),
            "half": torch.randn(3, 7, dtype=torch.bfloat16),
            "nested": {"flag": torch.tensor([True, False, True]), "m": torch.empty(3, 2, device="meta")},
        },
        [3],
    )


def _packed_bytes(leaves: list[torch.Tensor]) -> bytes:
    """The packed buffer the format describes, built here from the leaves: each leaf's bytes at the next
    multiple of 64, zeros between."""
    out = b""
    for leaf in leaves:
        out += b"\0" * (-len(out) % 64)
        out += leaf.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return out


def test_the_file_is_the_format_as_torch_load_reads_it(tmp_path):
    td = sample()
    tt.save(td, tmp_path / "td.pt")
    payload = torch.load(tmp_path / "td.pt", weights_only=True)
    doc = json.loads(payload["tdtree"])
    cpu = [td["b"], td["half"], td["nested", "flag"], td["w"]]  # in canonical (sorted) key order
    assert bytes(payload["packed"].numpy()) == _packed_bytes(cpu)
    assert len(doc["packed"]) == 4 and len(payload["tensors"]) == 1
    assert payload["tensors"][0].is_meta and payload["tensors"][0].shape == (3, 2)


def test_a_file_written_as_the_previous_version_did_loads(tmp_path):
    """The previous writer: torch.save (with its CRC-32s) of the dict, the packed buffer made in memory."""
    td = sample()
    tt.save(td, tmp_path / "new.pt")
    payload = torch.load(tmp_path / "new.pt", weights_only=True)
    cpu = [td["b"], td["half"], td["nested", "flag"], td["w"]]
    payload["packed"] = torch.frombuffer(bytearray(_packed_bytes(cpu)), dtype=torch.uint8)
    torch.save(payload, tmp_path / "old.pt")
    with zipfile.ZipFile(tmp_path / "old.pt") as z:
        assert z.testzip() is None  # every record's CRC-32 is there and right, as torch.save wrote them
    assert_equal(tt.load(tmp_path / "old.pt"), td)


def test_a_file_of_format_version_2_loads(tmp_path):
    """Version 2 nested the tree in the description: a file written so still loads."""
    td = sample()
    tt.save(td, tmp_path / "new.pt")
    payload = torch.load(tmp_path / "new.pt", weights_only=True)
    doc = json.loads(payload["tdtree"])
    assert doc["version"] == 3 and type(doc["tree"]) is list
    doc.update(version=2, tree=nested_tree(td))
    payload["tdtree"] = json.dumps(doc)
    torch.save(payload, tmp_path / "old.pt")
    assert_equal(tt.load(tmp_path / "old.pt"), td)
    doc["version"] = 3  # the nested form is read only as version 2
    payload["tdtree"] = json.dumps(doc)
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(SerializationError, match=r"bad.pt: its tree is not a list of nodes and leaves but a dict"):
        tt.load(tmp_path / "bad.pt")


def test_large_leaves_and_views_round_trip(tmp_path):
    base = torch.randn(300, 1000)
    td = TensorDict({"big": torch.randn(1 << 20), "view": base[::3, 5:], "t": base.t(), "odd": torch.ones(1, 3)}, [])
    tt.save(td, tmp_path / "td.pt")
    assert_equal(tt.load(tmp_path / "td.pt"), td)


def test_a_leaf_load_could_not_read_back_is_refused_before_writing(tmp_path):
    class Sub(torch.Tensor):
        pass

    td = TensorDict({"x": {"y": torch.zeros(2).as_subclass(Sub)}}, [])
    tt.save(TensorDict({"a": torch.ones(1)}, []), tmp_path / "td.pt")
    before = (tmp_path / "td.pt").read_bytes()
    with pytest.raises(SerializationError, match=r"td.pt: leaf \('x', 'y'\) is a Sub"):
        tt.save(td, tmp_path / "td.pt")
    assert (tmp_path / "td.pt").read_bytes() == before and os.listdir(tmp_path) == ["td.pt"]


# -- damaged files: tt.load raises SerializationError naming the file, nothing else ---------------------


def _zip_damages(data: bytes) -> dict[str, bytes]:
    end = data.rindex(b"PK\x05\x06")  # the end-of-central-directory record
    central = data.index(b"PK\x01\x02")
    # a zip64 locator saying the archive spans two disks (zipfile.is_zipfile raised on it)
    locator = b"PK\x06\x07" + struct.pack("<IQI", 0, 0, 2)
    method = bytearray(data)
    method[central + 10 : central + 12] = (99).to_bytes(2, "little")  # compression method 99 (AES)
    encrypted = bytearray(data)
    encrypted[central + 8] |= 1  # the encrypted flag
    return {
        "truncated": data[: len(data) // 2],
        "no_end_record": data[:end],
        "multi_disk": data[:end] + locator + data[end:],
        "method_99": bytes(method),
        "encrypted": bytes(encrypted),
        "header_only": data[:30],
    }


@pytest.mark.parametrize("damage", sorted(_zip_damages(b"PK\x01\x02" + b"\0" * 60 + b"PK\x05\x06" + b"\0" * 18)))
def test_damaged_zip_files_raise_serialization_error(tmp_path, damage):
    tt.save(sample(), tmp_path / "td.pt")
    (tmp_path / "bad.pt").write_bytes(_zip_damages((tmp_path / "td.pt").read_bytes())[damage])
    with pytest.raises(SerializationError, match=r"bad.pt"):
        tt.load(tmp_path / "bad.pt")


def test_byte_mutation_fuzz_gives_a_node_or_serialization_error(tmp_path):
    td = TensorDict({"a": torch.randn(4, 3), "n": {"b": torch.arange(4)}, "m": torch.empty(4, device="meta")}, [4])
    tt.save(td, tmp_path / "td.pt")
    data = (tmp_path / "td.pt").read_bytes()
    rng = random.Random(0)
    outcomes = {"loaded": 0, "refused": 0}
    for trial in range(400):
        bad = bytearray(data)
        kind = trial % 4
        if kind == 0:  # flip bytes anywhere
            for _ in range(rng.randint(1, 8)):
                bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # overwrite a run with random bytes
            at = rng.randrange(len(bad))
            bad[at : at + 16] = rng.randbytes(16)
        elif kind == 2:  # truncate
            del bad[rng.randrange(len(bad)) :]
        else:  # insert bytes, shifting every offset after them
            at = rng.randrange(len(bad))
            bad[at:at] = rng.randbytes(rng.randint(1, 64))
        (tmp_path / "bad.pt").write_bytes(bytes(bad))
        try:
            back = tt.load(tmp_path / "bad.pt")
        except SerializationError as err:
            assert "bad.pt" in str(err)
            outcomes["refused"] += 1
        else:
            assert back.keys(True, True) == td.keys(True, True)
            outcomes["loaded"] += 1
    assert outcomes["refused"] > 100 and outcomes["loaded"] > 0


# -- full disks and killed saves -----------------------------------------------------------------------


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_write_past_the_file_size_limit_raises_oserror_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "td.pt"
    tt.save(TensorDict({"a": torch.ones(3)}, []), path)
    before = path.read_bytes()
    result = _run(
        f"""
        import resource, signal, torch, tdtree as tt
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            tt.save(tt.TensorDict({{"a": torch.ones(1 << 20)}}, []), {str(path)!r})
        except OSError as err:
            print(type(err).__name__, err.errno, err)
        """
    )
    assert result.returncode == 0, result.stderr
    name, code, message = result.stdout.split(" ", 2)
    assert (name, int(code)) == ("OSError", errno.EFBIG) and str(path) in message, result.stdout
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["td.pt"]


def test_a_full_disk_raises_enospc_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "td.pt"
    tt.save(TensorDict({"a": torch.ones(3)}, []), path)
    before = path.read_bytes()

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError, match=r"cannot save .*td.pt: No space left on device") as info:
        tt.save(TensorDict({"b": torch.zeros(5)}, []), path)
    assert info.value.errno == errno.ENOSPC and not isinstance(info.value, SerializationError)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["td.pt"]


def test_the_temporary_file_of_a_killed_save_is_removed_by_the_next_save(tmp_path):
    path = tmp_path / "td.pt"
    result = _run(
        f"""
        import os, signal, torch, tdtree as tt
        os.pwrite = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # killed in the middle of the write
        tt.save(tt.TensorDict({{"a": torch.ones(1000)}}, []), {str(path)!r})
        """
    )
    assert result.returncode == -signal.SIGKILL
    (left,) = os.listdir(tmp_path)
    assert left.startswith(".td.pt.") and left.endswith(".tmp")
    live = tmp_path / f".td.pt.{os.getpid()}.0123456789ab.tmp"  # a save running now, in this process
    live.write_bytes(b"")
    other = tmp_path / ".other.pt.1.0123456789ab.tmp"  # another file's
    other.write_bytes(b"")
    td = TensorDict({"a": torch.arange(3)}, [])
    tt.save(td, path)
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other.name, "td.pt"])
    assert_equal(tt.load(path), td)
