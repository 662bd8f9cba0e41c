"""A corpus of representative nodes reused across tests, with readable ids, and the fixtures several test modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import tdtree as tt


def _corpus() -> dict[str, tt.TensorDict]:
    g = torch.Generator().manual_seed(0)
    return {
        "flat": tt.TensorDict({"a": torch.randn(4, 3, generator=g), "b": torch.arange(4)}, batch_size=[4]),
        "nested": tt.TensorDict(
            {
                "obs": torch.randn(4, 3, generator=g),
                "next": {"reward": torch.randn(4, 1, generator=g), "done": torch.zeros(4, 1, dtype=torch.bool)},
            },
            batch_size=[4],
        ),
        "deep": tt.TensorDict({"a": {"b": {"c": torch.randn(2, 3, generator=g)}}, "x": torch.ones(2, 3)}, [2, 3]),
        "zero_size": tt.TensorDict({"a": torch.zeros(0, 3), "b": {"c": torch.zeros(0)}}, batch_size=[0]),
        "noncontiguous": tt.TensorDict(
            {"a": torch.randn(3, 4, generator=g).t(), "b": torch.randn(4, 2, generator=g)}, [4]
        ),
        "extra_batch": tt.TensorDict(
            {"a": torch.randn(4, 2), "sub": tt.TensorDict({"c": torch.randn(4, 5, 2)}, [4, 5])}, [4]
        ),
        "no_batch": tt.TensorDict({"w": torch.randn(3, 3, generator=g), "b": torch.randn(3, generator=g)}),
        "empty": tt.TensorDict({}, batch_size=[2]),
        "locked": tt.TensorDict({"a": torch.randn(4, 3, generator=g), "s": {"t": torch.ones(4)}}, [4]).lock(),
    }


CORPUS = _corpus()


@pytest.fixture(params=sorted(CORPUS), ids=sorted(CORPUS))
def corpus_td(request: pytest.FixtureRequest) -> tt.TensorDict:
    return CORPUS[request.param]


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """An empty dynamo cache before and after the test: compiled tests count their compiles, graphs
    and guards, which another test's cached code would change."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
