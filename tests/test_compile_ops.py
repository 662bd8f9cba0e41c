"""Operations under torch.compile(fullgraph=True): no graph break, and the same result as eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import tdtree as tt
from tdtree import TensorDict
from tdtree.nn import TDModule, TDSequential
from tdtree.testing import assert_equal


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def flat() -> TensorDict:
    return TensorDict({"a": torch.randn(4, 3), "b": torch.randn(4)}, [4])


def nested() -> TensorDict:
    return TensorDict({"a": torch.randn(4, 3), "sub": {"c": torch.randn(4, 2, 2), "d": torch.arange(4)}}, [4])


def check_compiled(fn: Callable[[TensorDict], Any], td: TensorDict, backend: str) -> None:
    explained = torch._dynamo.explain(fn)(td)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    assert_equal(compiled(td), fn(td))


CASES: dict[str, tuple[Callable[[TensorDict], Any], Callable[[], TensorDict]]] = {
    "add-flat": (lambda td: td + 1, flat),
    "add-nested": (lambda td: td + 1, nested),
    "apply": (lambda td: td.apply(lambda x: x * 2 - 1), nested),
    "stack": (lambda td: tt.stack([td, td + 1], 1), nested),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", CASES)
def test_compiled_equals_eager(name, backend):
    fn, make = CASES[name]
    check_compiled(fn, make(), backend)


def test_tensor_on_the_left_and_reduction_compile():
    check_compiled(lambda td: (torch.arange(4.0) * td).sum(0), nested(), "eager")


def test_torch_stack_of_nodes_compiles():
    check_compiled(lambda td: torch.stack([td, td], 0), flat(), "eager")


def test_constructor_guards_batch_dims_only():
    # With dynamic shapes, comparing two leaves' whole shapes would guard on their other dims, and a
    # call where those dims relate differently (here: equal after unequal) would compile again.
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    fn = torch.compile(
        lambda x, y: TensorDict({"a": x, "b": y}, [x.shape[0]])["b"] * 2, fullgraph=True, backend=counter, dynamic=True
    )
    for x, y in [(torch.ones(4, 3), torch.ones(4, 5)), (torch.ones(5, 6), torch.ones(5, 6))]:
        assert_equal(fn(x, y), y * 2)
    assert counter.frame_count == 1


def _seq() -> TDSequential:
    ident = torch.nn.Identity()
    return TDSequential(TDModule(ident, "a", "h"), TDModule(ident, "h", ("c", "d")), selected_out_keys=[("c", "d")])


# Each editor with a tensor op beside it (dynamo keeps no guards for a frame without a graph).
EDITORS: dict[str, Callable[[TensorDict], Any]] = {
    "set-new-nested-key": lambda td: td.set(("c", "d"), td["a"] * 2),
    "setdefault": lambda td: td.setdefault(("c", "d"), td["a"] * 2),
    "update-dict": lambda td: td.update({"e": td["a"] * 2, ("sub", "f"): td["a"]}),
    "rename": lambda td: (td.rename({"a": ("z", "q")}), td["a"] * 2),
    "exclude": lambda td: (td.exclude("a", ("sub", "c")), td["a"] * 2),
    "tdsequential": lambda td, seq=_seq(): seq(td).set("e", td["a"] * 2),
}


@pytest.mark.parametrize("name", EDITORS)
def test_compiled_editors_guard_nothing_of_dynamo_polyfills(name):
    # dict(x), reversed(...) and typing.cast in traced code make dynamo trace its polyfills and
    # guard on them (and on the builtins), which every call of the compiled function then pays.
    guards = {g.name for g in torch._dynamo.explain(EDITORS[name])(nested()).out_guards}
    assert guards, "no graph: nothing was checked"
    assert not [g for g in guards if "polyfills" in g or g.endswith((".cast", "['reversed']"))]
