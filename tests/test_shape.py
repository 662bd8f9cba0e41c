"""Shape operations on the batch dims: results, views, tags, sub-nodes with extra batch dims, errors."""

import pytest
import torch

import tdtree as tt
from tdtree.errors import BatchDimError, BatchSizeError
from tdtree.testing import assert_equal


def make_td() -> tt.TensorDict:
    return tt.TensorDict(
        {"a": torch.arange(24.0).reshape(2, 3, 4), "n": {"b": torch.arange(12).reshape(2, 3, 2)}}, [2, 3]
    )


def extra_td() -> tt.TensorDict:
    sub = tt.TensorDict({"c": torch.randn(2, 3, 5, 7)}, [2, 3, 5])
    return tt.TensorDict({"a": torch.randn(2, 3, 4), "sub": sub}, [2, 3])


def ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_view_and_reshape() -> None:
    td = make_td()
    v = td.view(6)
    assert v.batch_size == (6,) and v["a"].shape == (6, 4) and v["n", "b"].shape == (6, 2)
    assert ptr(v["a"]) == ptr(td["a"])
    assert td.view((3, -1)).batch_size == (3, 2)
    assert td.view(torch.Size([6])).batch_size == (6,)
    r = td.reshape(-1)
    assert_equal(r["a"], td["a"].reshape(6, 4))


def test_view_errors() -> None:
    td = make_td()
    with pytest.raises(BatchSizeError, match=r"shape \(4,\) is invalid for the batch_size \(2, 3\)"):
        td.view(4)
    with pytest.raises(BatchSizeError, match="at most one -1"):
        td.reshape(-1, -1)
    with pytest.raises(BatchSizeError, match="invalid for the batch_size"):
        td.reshape(4, -1)


def test_reshape_tags_follow_views() -> None:
    locked = make_td().lock()
    assert type(locked.reshape(6)) is tt.TensorDict[tt.Locked]
    copied = locked.transpose(0, 1).reshape(6)
    assert type(copied) is tt.TensorDict
    assert_equal(copied["a"], make_td()["a"].transpose(0, 1).reshape(6, 4))


def test_permute_transpose() -> None:
    td = make_td()
    p = td.permute(1, 0)
    assert p.batch_size == (3, 2) and p["a"].shape == (3, 2, 4)
    assert_equal(p["a"], td["a"].permute(1, 0, 2))
    assert_equal(td.permute((-1, 0))["a"], p["a"])
    t = td.transpose(-1, 0)
    assert_equal(t["n", "b"], td["n", "b"].transpose(0, 1))
    with pytest.raises(BatchDimError, match=r"not a permutation of the 2 batch dims.*\(2, 3\)"):
        td.permute(0, 0)
    with pytest.raises(BatchDimError, match=r"dim 2 is out of range.*batch_size \(2, 3\)"):
        td.transpose(0, 2)


def test_squeeze_unsqueeze() -> None:
    td = make_td().unsqueeze(1)
    assert td.batch_size == (2, 1, 3) and td["a"].shape == (2, 1, 3, 4)
    assert make_td().unsqueeze(-1).batch_size == (2, 3, 1)
    assert td.squeeze().batch_size == (2, 3)
    assert td.squeeze(1)["a"].shape == (2, 3, 4)
    assert td.squeeze(0).batch_size == (2, 1, 3)
    assert td.squeeze((0, 1)).batch_size == (2, 3)
    ones = tt.TensorDict({"x": torch.zeros(1, 1)}, [1])
    assert ones.squeeze()["x"].shape == (1,)  # feature dims are never squeezed
    with pytest.raises(BatchDimError, match=r"unsqueeze: dim 4 is out of range.*\[-3, 2\]"):
        make_td().unsqueeze(4)
    with pytest.raises(BatchDimError, match="squeeze: dim 3"):
        td.squeeze(3)


def test_flatten_unflatten() -> None:
    td = make_td().unsqueeze(2)
    f = td.flatten()
    assert f.batch_size == (6,) and f["a"].shape == (6, 4)
    assert td.flatten(1).batch_size == (2, 3)
    u = f.unflatten(0, (2, -1))
    assert_equal(u["a"], make_td()["a"])
    scalar = tt.TensorDict({"x": torch.zeros(3)}, [])
    assert scalar.flatten().batch_size == (1,) and scalar.flatten()["x"].shape == (1, 3)
    with pytest.raises(BatchDimError, match="start_dim 1 comes after end_dim 0"):
        td.flatten(1, 0)
    with pytest.raises(BatchSizeError, match=r"unflatten: shape \(4, -1\) is invalid"):
        f.unflatten(0, (4, -1))


def test_expand() -> None:
    td = tt.TensorDict({"a": torch.randn(1, 3, 4)}, [1, 3])
    e = td.expand(5, 2, -1)
    assert e.batch_size == (5, 2, 3) and e["a"].shape == (5, 2, 3, 4)
    assert ptr(e["a"]) == ptr(td["a"])
    with pytest.raises(BatchSizeError, match=r"cannot be expanded to \(2, 4\)"):
        td.expand(2, 4)
    with pytest.raises(BatchSizeError, match="fewer dims than the batch_size"):
        td.expand(3)


def test_unbind() -> None:
    td = make_td()
    parts = td.unbind(1)
    assert type(parts) is tuple and len(parts) == 3
    for i, p in enumerate(parts):
        assert p.batch_size == (2,)
        assert_equal(p["a"], td["a"][:, i])
    assert tt.TensorDict({}, [2]).unbind(0)[1].batch_size == ()
    assert make_td()[:, :0].unbind(1) == ()
    with pytest.raises(BatchDimError, match="unbind: dim -3"):
        td.unbind(-3)


def test_split_chunk() -> None:
    td = make_td()
    parts = td.split(2, dim=1)
    assert [p.batch_size[1] for p in parts] == [2, 1]
    assert_equal(torch.cat([p["a"] for p in parts], 1), td["a"])
    assert [p.batch_size[0] for p in td.split([0, 2])] == [0, 2]
    assert [p.batch_size[1] for p in td.chunk(2, 1)] == [2, 1]
    assert len(make_td()[:0].chunk(3)) == 3
    with pytest.raises(BatchSizeError, match=r"sections \[1, 2\] do not add up to the size 2 of batch dim 0"):
        td.split([1, 2])
    with pytest.raises(BatchSizeError, match="split_size 0 is invalid for batch dim 0 of size 2"):
        td.split(0)
    with pytest.raises(ValueError, match="chunks must be at least 1"):
        td.chunk(0)


def test_extra_batch_dims_kept() -> None:
    td = extra_td()
    assert td.reshape(6)["sub"].batch_size == (6, 5)
    assert td.permute(1, 0)["sub", "c"].shape == (3, 2, 5, 7)
    assert td.unsqueeze(-1)["sub"].batch_size == (2, 3, 1, 5)
    assert [p["sub"].batch_size for p in td.unbind(-1)] == [torch.Size([2, 5])] * 3
    assert td.squeeze()["sub"].batch_size == (2, 3, 5)
    with pytest.raises(BatchDimError, match="dim 2 is out of range"):
        td.transpose(0, 2)


def test_view_ops_keep_locked() -> None:
    locked = make_td().lock()
    for out in (locked.view(6), locked.permute(1, 0), locked.unsqueeze(0), locked.flatten(), locked.expand(4, 2, 3)):
        assert type(out) is tt.TensorDict[tt.Locked]
        assert type(out["n"]) is tt.TensorDict[tt.Locked]
    for part in (*locked.unbind(0), *locked.split(1, 1), *locked.chunk(2)):
        assert type(part) is tt.TensorDict[tt.Locked]


def test_input_unchanged() -> None:
    td = make_td()
    before = td["a"].clone()
    version = td["a"]._version
    td.reshape(3, 2)
    td.unbind(0)
    assert td.batch_size == (2, 3) and td["a"]._version == version
    assert_equal(td["a"], before)


class _Marked(torch.Tensor):
    """A tensor subclass with its own unbind and split_with_sizes (Python methods, no __torch_function__)."""

    def unbind(self, dim=0):
        return tuple(part.as_subclass(torch.Tensor) + 100 for part in super().unbind(dim))

    def split_with_sizes(self, split_sizes, dim=0):
        return tuple(part.as_subclass(torch.Tensor) + 100 for part in super().split_with_sizes(split_sizes, dim))


def test_unbind_and_split_call_a_subclass_own_methods():
    td = tt.TensorDict({"a": torch.zeros(2, 3).as_subclass(_Marked)}, [2])
    assert [float(p["a"].sum()) for p in td.unbind(0)] == [300.0, 300.0]
    assert [float(p["a"].sum()) for p in td.split(1, 0)] == [300.0, 300.0]
