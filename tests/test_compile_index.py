"""Indexing and shape ops under torch.compile(fullgraph=True): no graph break, same result as eager."""

from collections.abc import Callable

import pytest
import torch
import torch._dynamo

import tdtree as tt
from tdtree.testing import assert_equal


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_td() -> tt.TensorDict:
    return tt.TensorDict({"a": torch.randn(3, 4, 2), "n": {"b": torch.randn(3, 4)}}, [3, 4])


INDEX = torch.tensor([2, 0])

CASES: dict[str, Callable[[tt.TensorDict], object]] = {
    "int": lambda td: td[1],
    "slice": lambda td: td[1:3, ::2],
    "tensor": lambda td: td[INDEX],
    "ellipsis": lambda td: td[..., 0],
    "reshape": lambda td: td.reshape(-1),
    "unbind": lambda td: td.unbind(0),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_equals_eager(name: str, backend: str) -> None:
    f = CASES[name]
    td = make_td()
    assert torch._dynamo.explain(f)(td).graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    got, want = compiled(td), f(td)
    if isinstance(want, tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_equal(g, w)
    else:
        assert_equal(got, want)
