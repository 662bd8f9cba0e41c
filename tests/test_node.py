"""The node: construction, validation, immutability, metadata, repr."""

from __future__ import annotations

import types

import pytest
import torch

import tdtree as tt
from tdtree.errors import BatchSizeError, KeyCollisionError


def test_construction_nests_dicts_and_sorts_keys() -> None:
    td = tt.TensorDict({"z": torch.zeros(4), "a": {"y": torch.ones(4, 2), "b": torch.ones(4)}}, batch_size=[4])
    assert list(td.keys()) == ["a", "z"]
    assert isinstance(td["a"], tt.TensorDict)
    assert list(td["a"].keys()) == ["b", "y"]
    assert td["a"].batch_size == torch.Size([4])


def test_tuple_keys_in_constructor_nest() -> None:
    td = tt.TensorDict({("a", "b"): torch.ones(2), ("a", "c"): torch.zeros(2)}, [2])
    assert list(td.keys(include_nested=True)) == ["a", ("a", "b"), ("a", "c")]


@pytest.mark.parametrize("first", [True, False])
def test_tuple_keys_merge_without_changing_the_callers_mappings(first: bool) -> None:
    inner = {"x": torch.zeros(2), "deep": {"z": torch.zeros(2)}}
    sub = tt.TensorDict({"x": torch.zeros(2)}, [2])
    entries = [
        ("a", inner),
        (("a", "y"), torch.ones(2)),
        (("a", "deep", "w"), torch.ones(2)),
        ("s", sub),
        (("s", "y"), torch.ones(2)),
        (("m",), {"p": torch.ones(2)}),
        ("m", {"q": torch.ones(2)}),
    ]
    source = dict(entries if first else entries[::-1])
    td = tt.TensorDict(source, [2])
    assert list(td.keys(include_nested=True)) == [
        "a",
        ("a", "deep"),
        ("a", "deep", "w"),
        ("a", "deep", "z"),
        ("a", "x"),
        ("a", "y"),
        "m",
        ("m", "p"),
        ("m", "q"),
        "s",
        ("s", "x"),
        ("s", "y"),
    ]
    assert list(inner) == ["x", "deep"] and list(inner["deep"]) == ["z"]
    assert list(sub.keys()) == ["x"]


def test_a_leaf_given_twice_through_tuple_keys_is_refused() -> None:
    with pytest.raises(KeyCollisionError, match=r"\('a', 'b'\) is given twice"):
        tt.TensorDict({("a", "b"): torch.ones(2), "a": {"b": torch.zeros(2)}}, [2])


def test_tuple_key_under_a_leaf_is_refused() -> None:
    with pytest.raises(KeyCollisionError, match=r"needs 'a' to be a node"):
        tt.TensorDict({"a": torch.ones(2), ("a", "b"): torch.ones(2)}, [2])


def test_metadata() -> None:
    td = tt.TensorDict({"a": torch.zeros(2, 3, 5)}, batch_size=(2, 3))
    assert td.batch_size == td.shape == torch.Size([2, 3])
    assert td.ndim == td.dim() == 2
    assert td.numel() == 6
    assert td.device == torch.device("cpu")
    assert td.tags == frozenset()
    assert not td.is_locked and not td.is_shared and not td.is_memmap


def test_batch_size_forms() -> None:
    assert tt.TensorDict({"a": torch.zeros(3)}, 3).batch_size == torch.Size([3])
    assert tt.TensorDict({"a": torch.zeros(3)}).batch_size == torch.Size([])
    assert tt.TensorDict({}, torch.Size([2, 2])).batch_size == torch.Size([2, 2])
    with pytest.raises(ValueError, match="negative"):
        tt.TensorDict({}, [-1])
    with pytest.raises(TypeError, match="batch_size must be a sequence of ints"):
        tt.TensorDict({}, ["x"])


def test_device_inference_and_explicit_device() -> None:
    assert tt.TensorDict({}, []).device is None
    td = tt.TensorDict({"a": torch.zeros(2)}, [2], device="cpu")
    assert td.device == torch.device("cpu")
    assert td["a"].device == torch.device("cpu")
    meta = tt.TensorDict({"a": torch.zeros(2), "b": torch.zeros(2, device="meta")}, [2])
    assert meta.device is None
    # the first leaf (in key order) sets the device the others are compared with, whichever it is
    assert tt.TensorDict({"a": torch.zeros(2, device="meta"), "b": torch.zeros(2)}, [2]).device is None
    on_meta = tt.TensorDict({"a": torch.zeros(2, device="meta"), "b": torch.zeros(2, device="meta")}, [2])
    assert on_meta.device == torch.device("meta")
    assert tt.TensorDict({"b": torch.zeros(2), "a": torch.zeros(2)}, [2]).device == torch.device("cpu")


def test_device_given_moves_leaves() -> None:
    td = tt.TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2], device="meta")
    assert td["a"].device.type == "meta"
    assert td["n", "b"].device.type == "meta"
    assert td["n"].device == torch.device("meta")


def test_shape_mismatch_names_key_batch_and_shape() -> None:
    with pytest.raises(
        BatchSizeError, match=r"'b' has shape \(3, 2\), which does not start with the batch_size \(4,\)"
    ):
        tt.TensorDict({"a": torch.zeros(4), "b": torch.zeros(3, 2)}, [4])
    with pytest.raises(BatchSizeError, match=r"\('n', 'x'\)"):
        tt.TensorDict({"n": {"x": torch.zeros(3)}}, [4])


def test_nested_node_batch_prefix_checked() -> None:
    inner = tt.TensorDict({"x": torch.zeros(3, 2)}, [3])
    with pytest.raises(BatchSizeError, match=r"nested node 'n' has shape \(3,\)"):
        tt.TensorDict({"n": inner}, [4])
    outer = tt.TensorDict({"n": tt.TensorDict({"x": torch.zeros(4, 2)}, [4, 2])}, [4])
    assert outer["n"].batch_size == torch.Size([4, 2])


def test_bad_keys_and_values() -> None:
    with pytest.raises(TypeError, match="keys are str or tuples of str, got int 1"):
        tt.TensorDict({1: torch.zeros(1)}, [1])
    with pytest.raises(TypeError, match="every part of a nested key must be a str"):
        tt.TensorDict({("a", 2): torch.zeros(1)}, [1])
    with pytest.raises(TypeError, match="entry 'a' is a float"):
        tt.TensorDict({"a": 1.0}, [])


def test_errors_leave_nothing_half_built() -> None:
    source = {"a": torch.zeros(4), "b": torch.zeros(3)}
    with pytest.raises(BatchSizeError):
        tt.TensorDict(source, [4])
    assert set(source) == {"a", "b"}


def test_immutable() -> None:
    td = tt.TensorDict({"a": torch.zeros(2)}, [2])
    with pytest.raises(TypeError, match=r"td.set\(key, value\)"):
        td["b"] = torch.zeros(2)
    with pytest.raises(TypeError, match=r"exclude\(key\)"):
        del td["a"]
    with pytest.raises(TypeError, match="immutable"):
        td.batch_size = torch.Size([1])  # type: ignore[misc]
    with pytest.raises(TypeError, match="immutable"):
        td.foo = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="immutable"):
        del td.batch_size  # type: ignore[misc]


def test_bool_is_ambiguous() -> None:
    with pytest.raises(RuntimeError, match=r"td.all\(\) or td.any\(\)"):
        bool(tt.TensorDict({"a": torch.zeros(2)}, [2]))


def test_mapping_protocol() -> None:
    td = tt.TensorDict({"b": torch.zeros(2), "a": {"c": torch.zeros(2)}}, [2])
    assert len(td) == 2
    assert list(td) == ["a", "b"]
    assert "a" in td and ("a", "c") in td and ("a",) in td
    assert ("a", "x") not in td and "x" not in td and 3 not in td and () not in td
    assert ("b", "x") not in td


def test_constructor_holds_no_reference_to_the_callers_mapping() -> None:
    x, y = torch.zeros(2), torch.ones(2)
    source = {"b": x, "a": y}
    td = tt.TensorDict(source, [2])
    source["c"] = x
    del source["a"]
    assert td._data is not source and list(td.items()) == [("a", y), ("b", x)]
    proxied = tt.TensorDict(types.MappingProxyType({"b": x, "a": y}), [2])  # any Mapping, read as it is
    assert list(proxied.items()) == [("a", y), ("b", x)]


def test_constructor_retags_nodes_inside() -> None:
    inner = tt.TensorDict({"x": torch.zeros(2)}, [2]).lock()
    td = tt.TensorDict({"n": inner}, [2])
    assert type(td["n"]) is tt.TensorDict
    assert td["n"]["x"] is inner["x"]


def test_constructor_from_a_node_reuses_leaves() -> None:
    td = tt.TensorDict({"a": torch.zeros(2)}, [2]).lock()
    again = tt.TensorDict(td, [2])
    assert type(again) is tt.TensorDict and again["a"] is td["a"]


def test_repr_shows_fields_batch_size_device_and_tags() -> None:
    td = tt.TensorDict({"obs": torch.zeros(4, 3), "next": {"r": torch.zeros(4, 1, dtype=torch.int64)}}, [4])
    text = repr(td.lock())
    assert text.startswith("TensorDict[Locked](")
    assert "obs: Tensor(shape=(4, 3), device=cpu, dtype=torch.float32)" in text
    assert "r: Tensor(shape=(4, 1), device=cpu, dtype=torch.int64)" in text
    assert "batch_size=(4,)" in text and "device=cpu" in text
    assert "fields={}" in repr(tt.TensorDict({}, []))


def test_tagged_types() -> None:
    L, S = tt.TensorDict[tt.Locked], tt.TensorDict[tt.Shared]
    LS = tt.TensorDict[tt.Locked, tt.Shared]
    assert LS is tt.TensorDict[tt.Shared, tt.Locked]
    assert issubclass(LS, L) and issubclass(LS, S) and issubclass(L, tt.TensorDict)
    locked = tt.TensorDict({"a": torch.zeros(1)}, [1]).lock()
    assert type(locked) is L and isinstance(locked, tt.TensorDict)
    assert not isinstance(locked, S)
    assert locked.unlock().tags == frozenset()
    assert type(locked.unlock()) is tt.TensorDict
    with pytest.raises(TypeError, match="takes tags"):
        tt.TensorDict["Locked"]  # type: ignore[index]


def test_sub_nodes_without_leaves_take_the_device_found() -> None:
    holds_only_empty = tt.TensorDict({"e": tt.TensorDict({}, [])}, [])
    td = tt.TensorDict({"a": {"x": torch.zeros(())}, "b": holds_only_empty}, [])
    assert td.device == td["b"].device == td["b", "e"].device == torch.device("cpu")


def test_the_first_bad_entry_in_key_order_is_named_nested_or_not() -> None:
    # nested dicts are checked after the other entries of their level: the error is still the first key's
    with pytest.raises(BatchSizeError, match=r"\('a', 'x'\) has shape \(3,\)"):
        tt.TensorDict({"a": {"x": torch.zeros(3)}, "b": torch.zeros(2)}, [4])
    with pytest.raises(TypeError, match=r"entry \('a', 'n', 'x'\) is a float"):
        tt.TensorDict({"a": {"n": {"x": 1.0}}, "b": 2.0, "c": {"y": 3.0}}, [])
    with pytest.raises(BatchSizeError, match=r"'b' has shape \(2,\)"):
        tt.TensorDict({"a": {"x": torch.zeros(4)}, "b": torch.zeros(2), "c": {"y": torch.zeros(3)}}, [4])
