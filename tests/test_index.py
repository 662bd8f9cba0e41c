"""Indexing over the batch dims and the scatter td.at[idx].set / set_."""

from typing import Any

import pytest
import torch

import tdtree as tt
from tdtree.errors import BatchDimError, BatchSizeError, KeyMismatchError, LockedError, WriteShapeError, WriteTypeError
from tdtree.testing import assert_equal


def make_td() -> tt.TensorDict:
    sub = tt.TensorDict({"c": torch.arange(120.0).reshape(3, 4, 5, 2)}, [3, 4, 5])
    return tt.TensorDict(
        {"a": torch.arange(24.0).reshape(3, 4, 2), "b": torch.arange(12).reshape(3, 4), "sub": sub}, [3, 4]
    )


def ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "idx",
    [
        0,
        -1,
        slice(1, 3),
        slice(None, None, 2),
        None,
        Ellipsis,
        (0, 1),
        (Ellipsis, 0),
        (None, Ellipsis, None),
        [0, 2],
        ([0, 2], [1, 3]),
        ([0, 2], slice(None)),
        (slice(None), [3, 0]),
        (),
        (0, Ellipsis),
        (None, slice(None), 1),
        (Ellipsis, 1),
        (1, None, Ellipsis),
        (slice(1, 3), Ellipsis, None),
        (Ellipsis,),
    ],
    ids=repr,
)
def test_index_like_torch(idx) -> None:
    td = make_td()
    out = td[idx]
    ref = torch.empty(3, 4)[idx].shape
    assert out.batch_size == ref
    assert out["sub"].batch_size == (*ref, 5)
    norm = idx if isinstance(idx, tuple) else (idx,)
    for key in ("a", "b", ("sub", "c")):
        leaf = td[key]
        assert_equal(out[key], leaf[(*norm, *(slice(None),) * (leaf.dim() - 2))])


def test_tensor_indices() -> None:
    td = make_td()
    i = torch.tensor([[2, 0], [1, 1]])
    out = td[i]
    assert out.batch_size == (2, 2, 4)
    assert_equal(out["a"], td["a"][i])
    mask = torch.tensor([True, False, True])
    assert_equal(td[mask]["sub", "c"], td["sub", "c"][mask])
    full = td["b"] > 4
    assert td[full].batch_size == (int(full.sum()),)
    assert_equal(td[full]["a"], td["a"][full])
    assert_equal(td[1, mask[:2].repeat(2)]["a"], td["a"][1, mask[:2].repeat(2)])


def test_views_and_tags() -> None:
    td = make_td()
    locked = td.lock()
    assert ptr(td[0]["a"]) == ptr(td["a"])
    assert type(locked[0]) is tt.TensorDict[tt.Locked]
    assert type(locked[1:, None]) is tt.TensorDict[tt.Locked]
    assert type(locked[torch.tensor([0, 1])]) is tt.TensorDict
    assert type(locked[torch.tensor([True, False, True])]) is tt.TensorDict
    assert type(locked[[0]]) is tt.TensorDict
    # torch reads a 0-dim integer tensor as an int, so these are views and keep Locked (found by the
    # index law under the random profile)
    assert type(locked[torch.tensor(0), None]) is tt.TensorDict[tt.Locked]
    assert type(locked[torch.tensor(1)]) is tt.TensorDict[tt.Locked]


def test_keys_still_work() -> None:
    td = make_td()
    assert td["a"] is td._data["a"]
    assert td["sub", "c"].shape == (3, 4, 5, 2)


def test_index_errors() -> None:
    td = make_td()
    with pytest.raises(BatchDimError, match=r"too many indices: 3 batch dims.*batch_size \(3, 4\)"):
        td[0, 0, 0]
    with pytest.raises(BatchDimError, match="too many indices"):
        td[..., 0, 0, 0]
    with pytest.raises(TypeError, match=r"mixes a key with a batch index.*td\['a'\]\[0\] or td\[0\]\['a'\]"):
        td[0, "a"]
    with pytest.raises(TypeError, match="mixes a key"):
        td[0, ("sub", "c")]
    with pytest.raises(BatchDimError, match=r"index 3 is out of range for batch dim 0 of size 3"):
        td[3]
    with pytest.raises(BatchDimError, match=r"index -5 is out of range for batch dim 1 of size 4"):
        td[:, -5]
    with pytest.raises(BatchDimError, match="single ellipsis"):
        td[..., ...]
    with pytest.raises(BatchDimError, match="single ellipsis"):
        td[None, ..., 0, ...]
    with pytest.raises(BatchDimError, match=r"index 3 is out of range for batch dim 0 of size 3"):
        td[None, 3]
    with pytest.raises(BatchDimError, match="too many indices"):
        td[None, ..., 0, 0, 0]
    with pytest.raises(BatchDimError, match=r"mask of shape \(2,\) does not match batch dims 0..0"):
        td[torch.tensor([True, False])]
    with pytest.raises(ValueError, match="step must be positive"):
        td[::-1]
    with pytest.raises(TypeError, match="bool index"):
        td[True]
    with pytest.raises(TypeError, match="unsupported index"):
        td[1.5]
    # torch reads both as masks that add a dim; refused like a Python bool
    with pytest.raises(TypeError, match="0-dim bool tensor index is not supported"):
        td[:, torch.tensor(False)]
    with pytest.raises(TypeError, match="uint8 tensor index is not supported"):
        td[torch.tensor([1, 0, 1], dtype=torch.uint8)]


T0, T1 = torch.tensor(0), torch.tensor(1)


@pytest.mark.parametrize(
    "index",
    [
        T1,
        (T0, None),
        (T0, slice(None), [0]),
        (slice(None), T1, [0, 1]),
        ([0, 1], slice(None), T0),
        (T0, T1),
        (None, T1, ..., [2]),
        ([1], slice(None), T0),
    ],
    ids=repr,
)
def test_a_0_dim_int_tensor_indexes_as_an_int(index: Any) -> None:
    # torch selects with a 0-dim tensor of ints before it pairs the index tensors, so where their dims
    # go is decided as for an int (found by the index laws: the batch size once disagreed with the leaves)
    a = torch.arange(60.0).reshape(3, 4, 5)
    td = tt.TensorDict({"a": a, "sub": {"c": torch.zeros(3, 4, 5, 2)}}, [3, 4, 5])
    out = td[index]
    assert out.batch_size == a[index].shape and torch.equal(out["a"], a[index])
    assert out["sub"].batch_size == a[index].shape and out["sub", "c"].shape == (*a[index].shape, 2)
    expected = a.clone()
    expected[index] = a[index] + 100
    assert torch.equal(td.at[index].set(out.apply(lambda x: x + 100))["a"], expected)


def test_at_set_functional() -> None:
    td = make_td()
    before = td["a"].clone()
    out = td.at[0].set(0.0)
    assert_equal(td["a"], before)
    assert out["a"][0].eq(0).all() and out["sub", "c"][0].eq(0).all()
    assert_equal(out["a"][1:], before[1:])
    value = td[1:]
    moved = td.at[:2].set(value)
    assert_equal(moved["b"][:2], td["b"][1:])
    assert td.at[1].get()["b"].tolist() == td["b"][1].tolist()
    per_row = td.at[:, 0].set(torch.tensor([10, 20, 30]))  # aligned with the batch dims
    assert per_row["a"][:, 0].tolist() == [[10.0, 10.0], [20.0, 20.0], [30.0, 30.0]]


def test_at_set_errors() -> None:
    td = make_td()
    with pytest.raises(LockedError, match=r"at\[\.\.\.\]\.set\(\) on a locked node.*at\[idx\]\.set_\(\)"):
        td.lock().at[0].set(0)
    with pytest.raises(KeyMismatchError, match=r"only in the first: .*'b'.*only in the second: none"):
        td.at[0].set(td[0].exclude("b"))
    with pytest.raises(BatchSizeError, match=r"batch_size \(2, 4\) is not td\[idx\]\.batch_size \(4,\)"):
        td.at[0].set(td[:2])
    with pytest.raises(
        WriteShapeError, match=r"'a' has shape \(4, 2\) and the value's shape \(4, 3\) does not broadcast"
    ):
        td.at[0].set(td[0].exclude("a").set("a", torch.zeros(4, 3)))
    with pytest.raises(BatchSizeError, match=r"shape \(5,\).*does not broadcast to td\[idx\]\.batch_size \(4,\)"):
        td.at[0].set(torch.zeros(5))
    with pytest.raises(
        WriteTypeError, match=r"'b' holds torch.int64 and the value is torch.float32, which does not cast"
    ):
        td.at[0].set(td[0].exclude("b").set("b", torch.zeros(4)))
    with pytest.raises(TypeError, match="must be a node, a tensor or a number"):
        td.at[0].set("x")


def test_at_set_node_values_to_cast_or_broadcast() -> None:
    td = make_td()
    sub = tt.TensorDict({"c": torch.full((4, 5, 2), -1.0, dtype=torch.float64)}, [4, 5])
    a, b = torch.full((4, 1), -1.0, dtype=torch.float16), torch.full((4,), -1, dtype=torch.int32)
    value = tt.TensorDict({"a": a, "b": b, "sub": sub}, [4])  # other dtypes; "a" broadcasts
    out = td.at[0].set(value)
    assert out["a"][0].eq(-1).all() and out["a"].dtype == torch.float32 and out["b"][0].eq(-1).all()
    assert out["sub", "c"][0].eq(-1).all() and out["sub", "c"].dtype == torch.float32
    assert_equal(out[1:], td[1:])


def test_at_set_checks_every_value_before_torch_writes() -> None:
    td = make_td()
    bad_b = td[torch.tensor([1])].exclude("b").set("b", torch.zeros(1, 4))
    # torch refuses index 5 at the first leaf "a"; the value at "b" is refused first, as set_ would
    with pytest.raises(WriteTypeError, match=r"'b' holds torch.int64 and the value is torch.float32"):
        td.at[torch.tensor([5])].set(bad_b)
    with pytest.raises(IndexError):
        td.at[torch.tensor([5])].set(td[torch.tensor([1])])


def test_at_set_inplace() -> None:
    td = make_td().lock()
    a = td["a"]
    out = td.at[1].set_(td[0])
    assert out is td and td["a"] is a
    assert_equal(td["a"][1], td["a"][0])
    td.at[torch.tensor([True, False, True])].set_(-1)
    assert td["b"][0].eq(-1).all() and td["b"][2].eq(-1).all()


def test_at_set_inplace_checks_before_writing() -> None:
    td = make_td()
    before = td.clone()
    bad = td[0].exclude("sub").set("sub", {"c": torch.zeros(4, 5, 3)})
    with pytest.raises(
        WriteShapeError, match=r"\('sub', 'c'\) has shape \(4, 5, 2\) and the value's shape \(4, 5, 3\)"
    ):
        td.at[0].set_(bad)  # "a" and "b" come first and must not have been written
    assert_equal(td, before)
    with pytest.raises(WriteTypeError, match="does not cast"):
        td.at[0].set_(torch.tensor(0.5))
    assert_equal(td, before)


def test_range_index_is_a_list_of_ints() -> None:
    td = tt.TensorDict({"a": torch.arange(12.0).reshape(4, 3)}, [4])
    assert torch.equal(td[range(1, 3)]["a"], td["a"][[1, 2]])
    assert torch.equal(td[range(3, 0, -2)]["a"], td["a"][[3, 1]])
    assert torch.equal(td[range(-2, 0)]["a"], td["a"][[-2, -1]])
    assert td[range(0)].batch_size == torch.Size([0])
    assert torch.equal(td.at[range(3, 0, -2)].set(-1.0)["a"][[3, 1]], torch.full((2, 3), -1.0))


@pytest.mark.parametrize(
    "index",
    [
        torch.tensor([5, 0, 5, 9]),
        torch.tensor([-1, -10, 3], dtype=torch.int32),
        [9, -2],
        torch.tensor([True, False] * 5),
        torch.zeros(0, dtype=torch.long),
    ],
    ids=["long", "int32-negative", "list", "mask", "empty"],
)
def test_rows_long_enough_to_copy_whole_index_as_torch(index: Any) -> None:
    # rows of at least 32 elements are copied whole (index_select), shorter ones gathered: both as torch
    g = torch.Generator().manual_seed(0)
    leaves = {
        "image": torch.randint(0, 255, (10, 3, 4, 4), dtype=torch.uint8, generator=g),
        "short": torch.randn(10, 3, generator=g),
        "t": torch.randn(4, 10, 8, generator=g).transpose(0, 1),  # rows of 32, not contiguous
        "sub": {"c": torch.randn(10, 2, 40, generator=g)},
    }
    td = tt.TensorDict({**leaves, "sub": tt.TensorDict(leaves["sub"], [10, 2])}, [10])
    out = td[index]
    positions = torch.tensor(index) if isinstance(index, list) else index
    assert_equal(
        out,
        {k: v[positions] for k, v in leaves.items() if k != "sub"} | {"sub": {"c": leaves["sub"]["c"][positions]}},
    )
    assert out.batch_size == torch.empty(10)[positions].shape and out["sub"].batch_size == (*out.batch_size, 2)
    assert out["image"].untyped_storage().data_ptr() != td["image"].untyped_storage().data_ptr()


def test_rows_out_of_range_raise_index_error() -> None:
    td = tt.TensorDict({"image": torch.zeros(10, 3, 4, 4)}, [10])
    for bad in ([10], [-11]):
        with pytest.raises(IndexError):
            td[torch.tensor(bad)]


def test_index_tensors_that_do_not_broadcast_raise_batch_dim_error_as_torch_raises_index_error() -> None:
    td = tt.TensorDict({"a": torch.zeros(3, 3)}, [3, 3])
    with pytest.raises(IndexError, match="shape mismatch"):
        torch.zeros(3, 3)[torch.tensor([], dtype=torch.long), torch.tensor([0, 0])]
    for call in (lambda: td[[], [0, 0]], lambda: td.at[[], [0, 0]].set_(1.0), lambda: td.at[[], [0, 0]].set(1.0)):
        with pytest.raises(BatchDimError, match=r"could not be broadcast together with shapes \[0\], \[2\]"):
            call()
    assert bool((td["a"] == 0).all())
