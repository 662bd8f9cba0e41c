"""One name per type: pickles, memmap directories and torch's pytree serialization name a node
type or a tensorclass the same way, and a name is only ever looked up for the kind asked."""

from __future__ import annotations

import json

import pytest
import torch
import torch.utils._pytree as torch_pytree

import tdtree as tt
from tdtree import TensorDict
from tdtree._pickle import rebuild_node
from tdtree.errors import MemmapError, SerializationError


class Point(tt.TensorClass):
    x: torch.Tensor
    label: str = "p"


def _torch_type_name(tree: object) -> str:
    """The name torch's pytree serializes ``tree``'s type under (torch.export writes it)."""
    return torch_pytree.SUPPORTED_SERIALIZED_TYPES[type(tree)].serialized_type_name


def test_a_node_type_has_one_name_everywhere(tmp_path) -> None:
    td = TensorDict({"a": torch.zeros(2)}, [2])
    memmapped = td.memmap(tmp_path / "m")
    with open(tmp_path / "m" / "meta.json") as f:
        meta = json.load(f)
    rebuild, args = td.__reduce__()
    assert rebuild is rebuild_node
    assert args[0] == meta["type"] == _torch_type_name(td) == "tdtree.TensorDict"
    assert torch_pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE["tdtree.TensorDict"] is TensorDict
    # a tagged node pickles under its root's name; torch serializes its own type
    assert memmapped.__reduce__()[1][0] == "tdtree.TensorDict"
    assert _torch_type_name(memmapped) == "tdtree.TensorDict[Locked, Memmap]"


def test_a_tensorclass_has_one_name_everywhere(tmp_path) -> None:
    p = Point(x=torch.zeros(2), batch_size=[2])
    p.memmap(tmp_path / "p")
    with open(tmp_path / "p" / "meta.json") as f:
        meta = json.load(f)
    name = f"{__name__}.Point"
    assert meta["record"]["class"] == _torch_type_name(p) == name
    loaded = tt.load_memmap(tmp_path / "p")
    assert type(loaded) is Point and loaded.label == "p"
    assert torch.equal(loaded.x, p.x)


@pytest.mark.parametrize("name", ["tdtree.TensorDict[Locked]", f"{__name__}.Point", "builtins.dict"])
def test_pickles_name_only_root_node_types(name: str) -> None:
    with pytest.raises(SerializationError, match="unknown type"):
        rebuild_node(name, ("a",), (torch.zeros(2),), (2,), None, ())


def test_memmap_records_name_only_tensorclasses(tmp_path) -> None:
    Point(x=torch.zeros(2), batch_size=[2]).memmap(tmp_path / "p")
    meta_path = tmp_path / "p" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["record"]["class"] = "tdtree.TensorDict"  # a registered name, but of a node type
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(MemmapError, match="unknown tensorclass 'tdtree.TensorDict'"):
        tt.load_memmap(tmp_path / "p")
