"""Examples for stack/cat, the torch functions on nodes, devices, dtypes, contiguous and nbytes."""

from __future__ import annotations

import pytest
import torch

import tdtree as tt
from tdtree import Locked, TensorDict
from tdtree.errors import BatchSizeError, KeyMismatchError
from tdtree.testing import assert_equal


def node(scale: float = 1.0) -> TensorDict:
    return TensorDict({"a": torch.arange(6.0).reshape(2, 3) * scale, "sub": {"c": torch.ones(2, 3, 4) * scale}}, [2, 3])


def extra() -> TensorDict:
    inner = TensorDict({"x": torch.arange(12.0).reshape(2, 3, 2)}, [2, 3, 2])
    return TensorDict({"a": torch.zeros(2, 3), "sub": inner}, [2, 3])


# -- stack --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack_dims_count_batch_dims(dim):
    a, b = node(), node(2.0)
    out = tt.stack([a, b], dim)
    d = dim % 3
    assert out.batch_size == torch.Size([2, 3])[:d] + torch.Size([2]) + torch.Size([2, 3])[d:]
    assert_equal(out["a"], torch.stack([a["a"], b["a"]], d))
    assert_equal(out["sub", "c"], torch.stack([a["sub", "c"], b["sub", "c"]], d))
    assert out["sub"].batch_size == out.batch_size


def test_stack_keeps_extra_batch_dims_of_sub_nodes():
    out = tt.stack([extra(), extra()], 1)
    assert out["sub"].batch_size == torch.Size([2, 2, 3, 2])
    assert_equal(out["sub", "x"], torch.stack([extra()["sub", "x"]] * 2, 1))


def test_stack_through_torch_stack():
    a, b = node(), node(2.0)
    assert_equal(torch.stack([a, b], dim=-1), tt.stack([a, b], -1))
    assert_equal(torch.stack((a, b)), tt.stack([a, b]))


def test_stack_of_tagged_nodes_drops_tags():
    a = node().lock()
    assert tt.stack([a, a]).tags == frozenset()
    assert tt.stack([a]).tags == frozenset()


def test_stack_pairs_whatever_tags():
    assert_equal(tt.stack([node(), node().lock()]), tt.stack([node(), node()]))


def test_stack_errors():
    with pytest.raises(KeyMismatchError, match=r"stack: .*only in the second: 'b'\.$"):
        tt.stack([node(), node().set("b", torch.zeros(2, 3))])
    with pytest.raises(BatchSizeError, match=r"stack: batch_size \(2, 3\) at the root does not match \(2,\)"):
        tt.stack([node(), TensorDict({"a": torch.zeros(2), "sub": {"c": torch.zeros(2)}}, [2])])
    with pytest.raises(
        IndexError, match=r"stack: dim 3 is out of range for a new batch dim of batch_size \(2, 3\) \(allowed: -3..2\)"
    ):
        tt.stack([node(), node()], 3)
    with pytest.raises(ValueError, match="stack takes a non-empty list or tuple of nodes"):
        tt.stack([])
    with pytest.raises(TypeError, match="stack: item 1 is a Tensor, not a node"):
        tt.stack([node(), torch.zeros(2, 3)])


# -- cat --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_cat_dims_count_batch_dims(dim):
    a = node()
    b = tt.cat([node(3.0), node(4.0)], dim)
    out = tt.cat([a, b], dim)
    d = dim % 2
    assert_equal(out["a"], torch.cat([a["a"], b["a"]], d))
    assert_equal(out["sub", "c"], torch.cat([a["sub", "c"], b["sub", "c"]], d))
    assert out.batch_size == out["a"].shape
    assert out["sub"].batch_size == out.batch_size


def test_cat_different_sizes_along_dim():
    a = TensorDict({"x": torch.zeros(2, 3)}, [2])
    b = TensorDict({"x": torch.ones(5, 3)}, [5])
    out = torch.cat([a, b])
    assert out.batch_size == torch.Size([7])
    assert_equal(out["x"], torch.cat([a["x"], b["x"]]))


def test_cat_keeps_extra_batch_dims():
    out = tt.cat([extra(), extra()], -1)
    assert out.batch_size == torch.Size([2, 6])
    assert out["sub"].batch_size == torch.Size([2, 6, 2])


def test_cat_through_torch_aliases():
    a = node()
    assert_equal(torch.concat([a, a], 1), tt.cat([a, a], 1))
    assert_equal(torch.concatenate([a, a], dim=0), tt.cat([a, a]))


def test_cat_drops_tags():
    a = node().lock()
    assert tt.cat([a]).tags == frozenset()


def test_cat_errors():
    with pytest.raises(KeyMismatchError, match=r"cat: .*only in the first: 'a';"):
        tt.cat([node(), node().exclude("a")])
    other = TensorDict({"a": torch.zeros(3, 4), "sub": {"c": torch.zeros(3, 4, 4)}}, [3, 4])
    with pytest.raises(
        BatchSizeError, match=r"cat: batch_size \(2, 3\) at the root does not match \(3, 4\) outside batch dim 0"
    ):
        tt.cat([node(), other])
    with pytest.raises(IndexError, match=r"cat: dim 2 is out of range for the batch_size \(2, 3\) \(allowed: -2..1\)"):
        tt.cat([node()], 2)
    with pytest.raises(IndexError, match=r"cat: dim 0 is out of range for the batch_size \(\); stack nodes"):
        tt.cat([TensorDict({"x": torch.ones(2)}, [])])
    with pytest.raises(TypeError, match="cat: item 0 is a int, not a node"):
        tt.cat([1, node()])


# -- the *_like functions and other torch functions --------------------------------------------------


def test_like_functions():
    td = node()
    assert_equal(torch.zeros_like(td), tt.tree.map(torch.zeros_like, td))
    assert_equal(
        torch.ones_like(td, dtype=torch.int64), tt.tree.map(lambda x: torch.ones_like(x, dtype=torch.int64), td)
    )
    assert_equal(torch.full_like(td, 7.0), tt.tree.map(lambda x: torch.full_like(x, 7.0), td))
    empty = torch.empty_like(td)
    assert empty["sub", "c"].shape == td["sub", "c"].shape
    assert torch.zeros_like(td.lock()).tags == frozenset()


def test_other_torch_functions_decline():
    with pytest.raises(TypeError, match="'torch.sum'; all __torch_function__ handlers returned NotImplemented"):
        torch.sum(node())


def test_tensor_method_with_node_on_right():
    td = node()
    t = torch.arange(2.0).reshape(2, 1)
    assert_equal(t + td, td + t)
    assert_equal(t.mul(td), td * t)
    assert_equal(t < td, td > t)


# -- devices and dtypes -----------------------------------------------------------------------------------


def test_to_same_device_reuses_leaves_and_keeps_tags():
    td = node().lock()
    out = td.to("cpu")
    assert out["a"] is td["a"]
    assert out.tags == frozenset({Locked})
    assert out.device == torch.device("cpu")
    assert td.cpu().tags == frozenset({Locked})


def test_to_that_changes_nothing_is_the_node_itself():
    # as Tensor.to returns the tensor itself: the same object, tags and all
    td = node().share_memory()
    assert td.device == torch.device("cpu")
    for out in (
        td.to("cpu"),
        td.to(torch.device("cpu"), non_blocking=True),
        td.cpu(),
        td.to(torch.float32),
        td.to(dtype=torch.float32),
        td.to("cpu", torch.float32),
        td.float(),
        td.to(),
        td.contiguous(),
    ):
        assert out is td
    meta = TensorDict({"a": torch.zeros(2, device="meta")}, [2])
    assert meta.to("meta") is meta


def test_to_that_changes_something_is_a_new_node():
    td = TensorDict({"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.float64)}, [2])
    out = td.to(torch.float64)
    assert out is not td and out["b"] is td["b"] and out["a"].dtype == torch.float64
    assert td.to("cpu", torch.float64) is not td
    assert td.to("meta").device == torch.device("meta")
    # a node without a device (no leaves) takes the one given, and every sub-node with it
    empty = TensorDict({"sub": {}}, [2])
    assert empty.device is None
    moved = empty.to("cpu")
    assert moved is not empty and moved.device == moved["sub"].device == torch.device("cpu")
    assert empty.to(torch.float64) is empty  # no leaf to convert, no device asked for


def test_to_sets_device_on_every_sub_node():
    td = TensorDict({"a": torch.zeros(2), "sub": {"c": torch.zeros(2)}}, [2])
    out = td.to(torch.device("cpu"))
    assert out.device == torch.device("cpu") and out["sub"].device == torch.device("cpu")


def test_to_dtype_converts_and_drops_tags():
    td = node().lock()
    out = td.to(torch.float64)
    assert out["sub", "c"].dtype == torch.float64
    assert out.tags == frozenset()
    assert td.to(dtype=torch.float32).tags == frozenset({Locked})


def test_to_device_and_dtype_together():
    out = node().to("cpu", torch.float16)
    assert out["a"].dtype == torch.float16 and out.device == torch.device("cpu")


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float", torch.float32),
        ("double", torch.float64),
        ("half", torch.float16),
        ("bfloat16", torch.bfloat16),
        ("int", torch.int32),
        ("long", torch.int64),
        ("bool", torch.bool),
    ],
)
def test_casts(name, dtype):
    out = getattr(node(), name)()
    assert out["a"].dtype == dtype and out["sub", "c"].dtype == dtype


def test_to_bad_argument():
    with pytest.raises(TypeError, match=r"to\(\) takes a device and/or a dtype .* got 1.5"):
        node().to(1.5)


def test_cuda_without_accelerator_is_torch_error():
    if torch.cuda.is_available():
        out = node().cuda()
        assert out.device == torch.device("cuda", torch.cuda.current_device()) == out["a"].device
    else:
        with pytest.raises((RuntimeError, AssertionError), match="CUDA|cuda|NVIDIA"):
            node().cuda()


def test_a_device_without_index_is_recorded_as_the_current_one(monkeypatch):
    # No accelerator is lent to CI: torch.accelerator is stood in for, as a machine with a current
    # cuda:1 would answer. A node without leaves records the device it is given, moving nothing.
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 1)
    cuda1 = torch.device("cuda", 1)
    assert TensorDict({}, [], device="cuda").device == cuda1
    assert TensorDict({}, [], device="cuda:0").device == torch.device("cuda", 0)
    assert TensorDict({"sub": {}}, []).to("cuda").device == cuda1
    assert TensorDict({"sub": {}}, []).cuda()["sub"].device == cuda1
    assert TensorDict({}, [], device="cpu").device == torch.device("cpu")
    assert TensorDict({}, [], device="meta").device == torch.device("meta")


def test_pin_memory():
    td = node()
    if torch.cuda.is_available():
        out = td.pin_memory()
        assert out["a"].is_pinned() and out.tags == frozenset()
    else:
        with pytest.raises(RuntimeError, match="accelerator"):
            td.pin_memory()


# -- contiguous and nbytes ---------------------------------------------------------------------------------


def test_contiguous_of_contiguous_keeps_leaves_and_tags():
    td = node().lock()
    out = td.contiguous()
    assert out is td
    assert out.tags == frozenset({Locked})


def test_contiguous_copies_non_contiguous_and_drops_tags():
    td = TensorDict({"x": torch.randn(3, 2).t()}, [2]).lock()
    out = td.contiguous()
    assert out["x"].is_contiguous()
    assert_equal(out["x"], td["x"], check_tags=False)
    assert out.tags == frozenset()


def test_nbytes_counts_distinct_storages():
    base = torch.zeros(4, 3)
    td = TensorDict({"a": base, "b": base[1:], "c": base.t().t(), "d": torch.zeros(4, dtype=torch.int64)}, [])
    assert td.nbytes == 4 * 3 * 4 + 4 * 8


def test_nbytes_nested_and_empty():
    assert node().nbytes == 6 * 4 + 24 * 4
    assert TensorDict({}, [3]).nbytes == 0
    assert TensorDict({"z": torch.zeros(0, 2)}, [0]).nbytes == 0
