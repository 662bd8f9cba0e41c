"""tdtree.testing.assert_equal / assert_close: what they compare, their switches, and their messages."""

from __future__ import annotations

import math

import pytest
import torch

import tdtree as tt
from tdtree.testing import assert_close, assert_equal


def node(**leaves: torch.Tensor) -> tt.TensorDict:
    return tt.TensorDict({"a": leaves.get("a", torch.zeros(2, 3)), "n": {"b": leaves.get("b", torch.arange(2))}}, [2])


def test_equal_nodes_pass_and_nan_equals_nan_by_default():
    td = node(a=torch.tensor([[math.nan, 1.0, 2.0], [3.0, 4.0, 5.0]]))
    assert_equal(td, td.clone())
    assert_close(td, td.clone())
    with pytest.raises(AssertionError, match="equal_nan=False"):
        assert_equal(td, td.clone(), equal_nan=False)


def test_message_names_key_path_index_values_shape_and_dtype():
    b = torch.arange(2)
    with pytest.raises(AssertionError) as err:
        assert_equal(node(b=b), node(b=torch.tensor([0, 7])))
    text = str(err.value)
    assert "key ('n', 'b')" in text
    assert "first at index (1,): 1 vs 7" in text
    assert "1 of 2 elements" in text
    assert "shape (2,), torch.int64 vs torch.int64" in text


def test_shapes_and_dtypes_are_shown_both():
    with pytest.raises(AssertionError, match=r"key 'a': shapes differ: \(2, 3\) vs \(2, 4\)"):
        assert_equal(node(), node(a=torch.zeros(2, 4)))
    with pytest.raises(AssertionError, match=r"key 'a': dtypes differ: torch.float32 vs torch.float64"):
        assert_equal(node(), node(a=torch.zeros(2, 3, dtype=torch.float64)))


def test_check_dtype_false_compares_promoted_values():
    assert_equal(node(), node(a=torch.zeros(2, 3, dtype=torch.float64)), check_dtype=False)
    with pytest.raises(AssertionError, match="first at index"):
        assert_equal(node(), node(a=torch.ones(2, 3, dtype=torch.float64)), check_dtype=False)


def test_tags_switch():
    td = node()
    with pytest.raises(AssertionError, match=r"at the root: tags differ: \{Locked\} vs \{\}"):
        assert_equal(td.lock(), td)
    assert_equal(td.lock(), td, check_tags=False)


def test_batch_size_switch():
    a = tt.TensorDict({"x": torch.zeros(2, 3)}, [2, 3])
    b = tt.TensorDict({"x": torch.zeros(2, 3)}, [2])
    with pytest.raises(AssertionError, match=r"batch_size differs: \(2, 3\) vs \(2,\)"):
        assert_equal(a, b)
    assert_equal(a, b, check_batch_size=False)


def test_device_switch():
    placed = tt.TensorDict({}, [2], device="cpu")
    unplaced = tt.TensorDict({}, [2])
    with pytest.raises(AssertionError, match="at the root: device differs: cpu vs None"):
        assert_equal(placed, unplaced)
    assert_equal(placed, unplaced, check_device=False)
    with pytest.raises(AssertionError, match="devices differ: cpu vs meta"):
        assert_equal(torch.zeros(2), torch.zeros(2, device="meta"))


def test_close_tolerances_default_per_dtype_and_override():
    x = torch.ones(3)
    assert_close(x, x + 1e-7)
    with pytest.raises(AssertionError, match=r"rtol=1.3e-06, atol=1e-05.*first at index \(0,\)"):
        assert_close(x, x + 1e-3)
    assert_close(x, x + 1e-3, rtol=0, atol=1e-2)
    half = torch.ones(3, dtype=torch.float16)
    assert_close(half, half + 1e-3)  # float16's looser default
    with pytest.raises(ValueError, match="both rtol and atol"):
        assert_close(x, x, rtol=1e-3)


def test_keys_differ_names_both_sides():
    with pytest.raises(AssertionError, match=r"keys differ: \['a', 'n'\] vs \['a'\]"):
        assert_equal(node(), tt.TensorDict({"a": torch.zeros(2, 3)}, [2]))


def test_plain_dict_compares_keys_and_leaves():
    td = node()
    assert_equal(td, {"a": torch.zeros(2, 3), "n": {"b": torch.arange(2)}})
    with pytest.raises(AssertionError, match=r"key \('n', 'b'\)"):
        assert_equal({"a": torch.zeros(2, 3), "n": {"b": torch.ones(2, dtype=torch.int64)}}, td)


def test_containers_name_the_position():
    a = (torch.zeros(2), [node()])
    b = (torch.zeros(2), [node(b=torch.tensor([5, 1]))])
    with pytest.raises(AssertionError, match=r"key \[1\]\[0\]\[\('n', 'b'\)\]"):
        assert_equal(a, b)


def test_bits_of_negative_zero_equal_as_values():
    assert_equal(torch.tensor([-0.0]), torch.tensor([0.0]))


class Pair(tt.TensorClass):
    x: torch.Tensor
    label: str = "p"


def test_tensorclasses_compare_class_static_fields_and_leaves():
    p = Pair(torch.zeros(2), batch_size=[2])
    assert_equal(p, Pair(torch.zeros(2), batch_size=[2]))
    with pytest.raises(AssertionError, match="static fields differ"):
        assert_equal(p, Pair(torch.zeros(2), label="q", batch_size=[2]))
    with pytest.raises(AssertionError, match="key 'x'"):
        assert_equal(p, Pair(torch.ones(2), batch_size=[2]))
    with pytest.raises(AssertionError, match="types differ"):
        assert_equal(p, p.to_node())
