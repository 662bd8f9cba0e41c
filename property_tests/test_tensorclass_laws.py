"""Laws of tensorclasses: every operation agrees with the same operation on ``to_node()``,
keeps the class and its static fields, leaves the input unchanged; pytree round trips are exact."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree
from _tcstatics import statics
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree._tags import retag
from tdtree.testing import assert_equal, batch_sizes, tensordicts
from tdtree.testing.laws import assert_pure


class Mode(enum.Enum):
    A = 1
    B = 2


class Part(tt.TensorClass):
    y: torch.Tensor
    name: str = "part"


class Rec(tt.TensorClass):
    x: torch.Tensor
    part: Part
    extras: tt.TensorDict
    mode: Mode = Mode.A
    weight: float = 1.0


@st.composite
def records(draw: st.DrawFn, min_dims: int = 1) -> Rec:
    """A Rec whose tensors and sub-node come from the tdtree.testing strategies; maybe locked."""
    bs = draw(batch_sizes(min_dims=min_dims, max_dims=2, max_side=3))
    pair = draw(tensordicts(bs, max_depth=0, min_keys=2, max_keys=2, names=st.sampled_from(["x", "y"])))
    extras = draw(tensordicts(bs, max_depth=1, noncontiguous=True))
    part = Part(pair["y"], draw(st.text(max_size=3)), batch_size=bs)
    rec = Rec(pair["x"], part, extras, draw(st.sampled_from(Mode)), draw(st.floats(-2, 2)), batch_size=bs)
    return rec.lock() if draw(st.booleans()) else rec


def agrees(out: Any, rec: Rec, expected: Any) -> None:
    assert type(out) is Rec and type(out.part) is Part
    assert statics(out) == statics(rec)
    assert out.tags == expected.tags
    assert_equal(out.to_node(), expected)
    inner = out.to_node()
    assert out.x is inner["x"] and out.part.y is inner["part", "y"] and out.extras is inner["extras"]


OPS: dict[str, Callable[[Any], Any]] = {
    "slice": lambda r: r[:1],
    "ellipsis-none": lambda r: r[..., None],
    "unsqueeze": lambda r: r.unsqueeze(0),
    "reshape": lambda r: r.reshape(-1),
    "transpose": lambda r: r.transpose(0, -1),
    "expand": lambda r: r.unsqueeze(0).expand(2, *r.batch_size),
    "clone": lambda r: r.clone(),
    "clone-shallow": lambda r: r.clone(recurse=False),
    "apply": lambda r: r.apply(lambda t: t.clone()),
    "eq": lambda r: r == r,
    "to-float64": lambda r: r.to(torch.float64),
    "contiguous": lambda r: r.contiguous(),
    "lock": lambda r: r.lock(),
    "unlock": lambda r: r.unlock(),
    "stack": lambda r: tt.stack([r, r], -1),
    "cat": lambda r: tt.cat([r, r], 0),
}


@pytest.mark.parametrize("name", OPS)
@given(rec=records())
def test_operation_agrees_with_the_tensordict(name, rec):
    op = OPS[name]
    out = assert_pure(op, rec)
    agrees(out, rec, op(rec.to_node()))


@given(rec=records(), dim=st.integers(0, 1))
def test_unbind_agrees_with_the_tensordict(rec, dim):
    dim = min(dim, rec.ndim - 1)
    outs = assert_pure(lambda r: r.unbind(dim), rec)
    expected = rec.to_node().unbind(dim)
    assert len(outs) == len(expected)
    for out, td in zip(outs, expected):
        agrees(out, rec, td)


@given(rec=records(), data=st.data())
def test_replace_agrees_with_set(rec, data):
    rec = rec.unlock()
    new_x = data.draw(tensordicts(rec.batch_size, max_depth=0, min_keys=1, max_keys=1, names=st.just("x")))["x"]
    out = assert_pure(lambda r: r.replace(x=new_x, weight=3.0), rec)
    assert out.weight == 3.0 and statics(out)[:-1] == statics(rec)[:-1]
    assert_equal(out.to_node(), rec.to_node().set("x", new_x))


@given(rec=records(min_dims=0), data=st.data())
def test_replace_of_tensors_agrees_with_set(rec, data):
    rec = rec.unlock()
    new = data.draw(tensordicts(rec.batch_size, max_depth=0, min_keys=2, max_keys=2, names=st.sampled_from(["x", "y"])))
    out = assert_pure(lambda r: r.replace(x=new["x"]), rec)
    agrees(out, rec, rec.to_node().set("x", new["x"]))
    assert out.part is rec.part and out.extras is rec.extras
    both = out.replace(x=new["y"], part=rec.part.replace(y=new["x"]))
    agrees(both, rec, rec.to_node().set("x", new["y"]).set(("part", "y"), new["x"]))


@given(rec=records(min_dims=0))
def test_optree_round_trip(rec):
    """Unflatten rebuilds the instance untagged (DESIGN 3.1; it kept the tags before)."""
    leaves, spec = optree.tree_flatten(rec, namespace="tdtree")
    back = optree.tree_unflatten(spec, leaves)
    agrees(back, rec, retag(rec.to_node(), frozenset()))
    assert back.tags == frozenset()
    assert (tt.tree.structure(back) == spec) == (not rec.tags)  # structures differ by tags only


@given(rec=records(min_dims=0))
def test_torch_pytree_round_trip(rec):
    leaves, spec = torch_pytree.tree_flatten(rec)
    back = torch_pytree.tree_unflatten(leaves, spec)
    agrees(back, rec, retag(rec.to_node(), frozenset()))
    assert leaves == tt.tree.leaves(rec)


@given(rec=records(min_dims=0))
def test_from_node_inverts_to_node(rec):
    back = Rec.from_node(rec.to_node(), mode=rec.mode, weight=rec.weight)
    assert_equal(back.to_node(), rec.to_node())
    assert back.mode is rec.mode and back.weight == rec.weight and back.part.name == "part"
