"""A tensorclass's ``replace`` under torch.compile: its results, its errors and the reuse of the
compiled frame across instances are those of eager code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import pytest
import torch

import tdtree as tt
from tdtree._torch_private import compile_counter
from tdtree.errors import BatchSizeError, FieldError


class Leaf(tt.TensorClass):
    y: torch.Tensor
    label: str = "leaf"


class Rec(tt.TensorClass):
    x: torch.Tensor
    leaf: Leaf
    note: Optional[str] = None
    extra: Optional[torch.Tensor] = None


def make_rec(seed: int = 0) -> Rec:
    g = torch.Generator().manual_seed(seed)
    leaf = Leaf(torch.randn(4, 2, generator=g), "deep", batch_size=[4])
    return Rec(torch.randn(4, 3, generator=g), leaf, "hi", batch_size=[4])


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: a fresh dynamo cache


REPLACED: dict[str, Callable[[Rec], Rec]] = {
    "tensor": lambda r: r.replace(x=r.x + 1),
    "nested": lambda r: r.replace(leaf=r.leaf.replace(y=r.leaf.y * 2)),
    "static": lambda r: r.replace(note="bye", x=r.x - r.leaf.y.sum(-1, keepdim=True)),
    "static-to-data": lambda r: r.replace(extra=r.x[:, 0]),
    "chained": lambda r: r.replace(x=r.x * 2).replace(note=None).replace(x=r.x + 3),
}


@pytest.mark.parametrize("name", REPLACED)
def test_compiled_replace_agrees_with_eager(name: str) -> None:
    fn = REPLACED[name]
    rec = make_rec()
    want = fn(rec)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(rec)
    assert type(got) is Rec and type(got.leaf) is Leaf
    assert got._static == want._static and got.leaf._static == want.leaf._static
    tt.testing.assert_equal(got.to_node(), want.to_node())
    for field in ("x", "leaf", "extra"):
        value = getattr(got, field)
        node = got.to_node()
        if value is None:
            assert field not in node.keys()
        else:  # each data field's slot holds what the inner node holds
            assert (value._td if isinstance(value, tt.TensorClass) else value) is node[field]


def test_compiled_replace_serves_other_instances_without_recompiling() -> None:
    counter = compile_counter("eager")
    fn = torch.compile(REPLACED["nested"], fullgraph=True, backend=counter)
    for seed in range(3):
        rec = make_rec(seed)
        tt.testing.assert_equal(fn(rec).to_node(), REPLACED["nested"](rec).to_node())
    assert counter.frame_count == 1


REFUSED: dict[str, tuple[Callable[[Rec], Any], type[Exception], str]] = {
    "type": (lambda r: r.replace(x="no"), FieldError, r"Rec\.x expects Tensor, got str"),
    "optional": (lambda r: r.replace(note=3), FieldError, r"Rec\.note expects Optional\[str\], got int"),
    "nested": (lambda r: r.replace(leaf=r.x), FieldError, r"Rec\.leaf expects Leaf, got Tensor"),
    "unknown": (lambda r: r.replace(nope=r.x), FieldError, r"Rec has no field 'nope'"),
    "batch-size": (lambda r: r.replace(x=r.x[:2]), BatchSizeError, r"Rec\.replace: "),
}


@pytest.mark.parametrize("name", REFUSED)
def test_compiled_replace_raises_as_eager(name: str) -> None:
    # fullgraph=False: dynamo traces to the raise, and the user gets the error itself
    fn, error, message = REFUSED[name]
    with pytest.raises(error, match=message):
        fn(make_rec())
    torch._dynamo.reset()
    with pytest.raises(error, match=message):
        torch.compile(fn, backend="eager")(make_rec())
