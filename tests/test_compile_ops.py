"""Operations under torch.compile(fullgraph=True): no graph break, and the same result as eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import tdtree as tt
from tdtree import TensorDict
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
