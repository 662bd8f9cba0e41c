"""The node operations a tensorclass gained (issue 17): each compared with torch on the fields
directly, and a table that every TensorDict operation is either on tensorclasses or named as not
applying to a record."""

from __future__ import annotations

import operator
import pickle
import pickletools
from collections.abc import Callable
from typing import Any

import pytest
import torch

import tdtree as tt
from tdtree import Locked, TensorDict
from tdtree.errors import LockedError


class Inner(tt.TensorClass):
    y: torch.Tensor
    label: str = "inner"


class Rec(tt.TensorClass):
    x: torch.Tensor
    inner: Inner
    scale: float = 0.5


def make_rec() -> Rec:
    g = torch.Generator().manual_seed(0)
    inner = Inner(y=torch.randn(4, 2, generator=g) + 0.5, label="deep", batch_size=[4])
    return Rec(torch.randn(4, 3, generator=g) + 0.5, inner, 2.0, batch_size=[4])


def assert_fields(out: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    """``out`` is a Rec with the static fields of make_rec() and leaves equal to ``x`` and ``y``."""
    assert type(out) is Rec and type(out.inner) is Inner
    assert out.scale == 2.0 and out.inner.label == "deep"
    torch.testing.assert_close(out.x, x, equal_nan=True)
    torch.testing.assert_close(out.inner.y, y, equal_nan=True)


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "sign": torch.sign,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_operations(name: str) -> None:
    rec = make_rec()
    assert_fields(getattr(rec, name)(), UNARY[name](rec.x), UNARY[name](rec.inner.y))


BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("reflected", [False, True])
def test_binary_operations_with_a_number_and_an_instance(name: str, reflected: bool) -> None:
    rec, op = make_rec(), BINARY[name]
    if reflected:
        assert_fields(op(3.0, rec), op(3.0, rec.x), op(3.0, rec.inner.y))
    else:
        assert_fields(op(rec, 3.0), op(rec.x, 3.0), op(rec.inner.y, 3.0))
    other = rec + 1
    assert_fields(op(rec, other), op(rec.x, other.x), op(rec.inner.y, other.inner.y))


def test_pow_method() -> None:
    rec = make_rec()
    assert_fields(rec.pow(2), rec.x**2, rec.inner.y**2)
    assert_fields(rec.pow(rec), rec.x**rec.x, rec.inner.y**rec.inner.y)
    with pytest.raises(TypeError, match="got str"):
        rec.pow("x")


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_amax_amin(name: str) -> None:
    rec = make_rec()
    fn = getattr(torch, name)
    out = getattr(rec, name)(0, keepdim=True)
    assert out.batch_size == (1,)
    assert_fields(out, fn(rec.x, 0, keepdim=True), fn(rec.inner.y, 0, keepdim=True))
    whole = getattr(rec, name)()
    assert whole.batch_size == ()
    assert_fields(whole, fn(rec.x, 0), fn(rec.inner.y, 0))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_norm(name: str) -> None:
    rec = make_rec()
    fn = getattr(torch, name)
    out = getattr(rec, name)(0)
    assert type(out) is getattr(torch.return_types, name) and type(out.values) is Rec
    assert_fields(out.values, fn(rec.x, 0).values, fn(rec.inner.y, 0).values)
    assert_fields(out.indices, fn(rec.x, 0).indices, fn(rec.inner.y, 0).indices)
    assert_fields(
        getattr(rec, name)(), getattr(torch, "a" + name)(rec.x, 0), getattr(torch, "a" + name)(rec.inner.y, 0)
    )
    norms = rec.norm()
    assert norms.batch_size == ()
    assert_fields(norms, torch.linalg.vector_norm(rec.x), torch.linalg.vector_norm(rec.inner.y))


def test_named_apply_sees_field_paths() -> None:
    rec = make_rec()
    seen: list[Any] = []

    def fn(key: Any, leaf: torch.Tensor) -> torch.Tensor:
        seen.append(key)
        return leaf * 2

    assert_fields(rec.named_apply(fn), rec.x * 2, rec.inner.y * 2)
    assert sorted(seen, key=str) == sorted([("inner", "y"), "x"], key=str)


def test_bfloat16() -> None:
    rec = make_rec()
    out = rec.bfloat16()
    assert out.x.dtype == torch.bfloat16 and out.inner.y.dtype == torch.bfloat16
    assert_fields(out.float(), rec.x.bfloat16().float(), rec.inner.y.bfloat16().float())


def test_at_set_get_and_set_in_place() -> None:
    rec = make_rec()
    row = rec[0] * 0
    out = rec.at[1].set(row)
    x, y = rec.x.clone(), rec.inner.y.clone()
    x[1], y[1] = 0, 0
    assert_fields(out, x, y)
    assert not torch.equal(rec.x, x)  # the input is unchanged
    assert_fields(rec.at[2].get(), rec.x[2], rec.inner.y[2])
    locked = rec.lock()
    with pytest.raises(LockedError):
        locked.at[1].set(row)
    assert locked.at[1].set_(row) is locked
    assert locked.tags == frozenset({Locked})
    assert_fields(locked, x, y)


def test_update_and_fill_in_place() -> None:
    rec = make_rec()
    x, y = rec.x.clone(), rec.inner.y.clone()
    assert rec.update_({"x": torch.zeros(3)}) is rec
    assert_fields(rec, torch.zeros(4, 3), y)
    assert rec.update_(rec * 0 + 1) is rec
    assert_fields(rec, torch.ones_like(x), torch.ones_like(y))
    assert rec.fill_(("inner", "y"), 5.0) is rec
    assert_fields(rec, torch.ones_like(x), torch.full_like(y, 5.0))


def test_pin_memory_and_cuda_are_forwarded_to_the_inner_node() -> None:
    rec = make_rec()
    if torch.cuda.is_available():
        assert rec.cuda().x.is_cuda and rec.pin_memory().x.is_pinned()
    else:  # the node's own refusal, unchanged
        with pytest.raises(Exception) as node_err:
            rec.to_node().cuda()
        with pytest.raises(type(node_err.value)):
            rec.cuda()


# TensorDict's public operations a tensorclass does not have: each edits or reads keys, which a
# record has as declared fields (read them as attributes, change them with replace), or builds a
# TensorDict from other data; as_dataset gives a node's rows the dataset protocol an instance has itself.
NOT_ON_RECORDS = {
    "__class_getitem__",
    "__contains__",
    "__deepcopy__",  # a record deep-copies through its __reduce__, which deep-copies its inner node
    "__delitem__",
    "__iter__",
    "as_dataset",
    "__setitem__",
    "exclude",
    "flatten_keys",
    "from_dataclass",
    "from_dict",
    "from_namedtuple",
    "get",
    "items",
    "keys",
    "rename",
    "select",
    "set",
    "setdefault",
    "to_dict",
    "to_namedtuple",
    "unflatten_keys",
    "update",
    "values",
}


def test_every_node_operation_is_on_tensorclasses_or_named_as_not_applying() -> None:
    public = {n for n in dir(TensorDict) if not n.startswith("_") or (n.startswith("__") and n.endswith("__"))}
    missing = sorted(n for n in public - set(dir(Rec)) if n not in NOT_ON_RECORDS)
    assert missing == []
    assert not NOT_ON_RECORDS & set(dir(Rec)) - set(dir(object))


def test_results_keep_tags_as_the_node_does() -> None:
    rec = make_rec().lock()
    assert rec.abs().tags == rec.to_node().abs().tags == frozenset()
    assert rec.amax().tags == frozenset()
    assert rec.bfloat16().bfloat16().tags == frozenset()  # the cast makes new storage


def test_a_pickle_names_the_rebuild_function_where_older_pickles_found_it() -> None:
    rec = make_rec()
    ops = [arg for op, arg, _ in pickletools.genops(pickle.dumps(rec)) if isinstance(arg, str)]
    assert "tdtree._tensorclass" in ops and "_unpickle" in ops
    back = pickle.loads(pickle.dumps(rec))
    assert_fields(back, rec.x, rec.inner.y)


def test_detach_keeps_storage_and_tags() -> None:
    rec = make_rec().apply(lambda t: t.requires_grad_())
    out = rec.detach()
    assert_fields(out, rec.x.detach(), rec.inner.y.detach())
    assert not out.x.requires_grad and out.x.data_ptr() == rec.x.data_ptr()
    assert rec.lock().detach().tags == frozenset({Locked})
