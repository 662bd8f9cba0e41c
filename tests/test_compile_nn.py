"""tdtree.nn and tdtree.optim under torch.compile(fullgraph=True): no graph breaks, same results as eager."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import tdtree as tt
from tdtree.nn import TDModule, TDSequential, from_module, functional_call
from tdtree.optim import adam, adam_init, sgd
from tdtree.testing import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: a fresh dynamo cache


def check(fn: Callable[..., Any], *args: Any, backend: str = "aot_eager") -> Any:
    """No graph break, and the compiled result equals eager; returns the compiled result."""
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    eager = fn(*args)
    assert tt.tree.structure(compiled) == tt.tree.structure(eager)
    for a, b in zip(tt.tree.leaves(compiled), tt.tree.leaves(eager)):
        torch.testing.assert_close(a, b)
    return compiled


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def batch() -> tt.TensorDict:
    torch.manual_seed(1)
    return tt.TensorDict({"x": torch.randn(8, 4), "y": torch.randn(8, 1)}, batch_size=[8])


def test_tdmodule_forward() -> None:
    mod = TDModule(nn.Linear(4, 3), "x", ("out", "h"))
    out = check(lambda td: mod(td), batch())
    assert type(out) is tt.TensorDict and out["out"].batch_size == torch.Size([8])


def test_tdsequential_forward_with_selected_keys() -> None:
    torch.manual_seed(2)
    seq = TDSequential(
        TDModule(nn.Linear(4, 8), "x", "h"),
        TDModule(nn.ReLU(), "h", "h"),
        TDModule(nn.Linear(8, 1), "h", ("pred", "y")),
    ).select_out_keys(("pred", "y"))
    out = check(lambda td: seq(td), batch())
    assert list(out.keys()) == ["pred", "x", "y"]


def test_functional_call_grad_adam_step() -> None:
    model = mlp()
    params = tt.tree.map(torch.Tensor.detach, from_module(model))

    def step(params: tt.TensorDict, state: Any, td: tt.TensorDict) -> tuple[Any, Any, torch.Tensor]:
        def loss(p: tt.TensorDict) -> torch.Tensor:
            return ((functional_call(model, p, td["x"]) - td["y"]) ** 2).mean()

        grads, value = torch.func.grad_and_value(loss)(params)
        params, state = adam(params, grads, state, lr=1e-2)
        return params, state, value

    new, state, _ = check(step, params, adam_init(params), batch())
    assert state.step.item() == 1
    # a second step with the new step count reuses the graph: the count is a tensor
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    p, s, _ = compiled(params, adam_init(params), batch())
    for _ in range(3):
        p, s, _ = compiled(p, s, batch())
    assert counter.frame_count == 1
    assert s.step.item() == 4


def test_sgd_momentum_step() -> None:
    params = tt.tree.map(torch.Tensor.detach, from_module(mlp()))
    grads = tt.tree.map(torch.ones_like, params)
    check(lambda p, g, b: sgd(p, g, 0.1, momentum=0.9, momentum_state=b), params, grads, grads)


def test_vmap_ensemble() -> None:
    model = mlp()
    stacked = tt.tree.map(
        lambda *xs: torch.stack(xs), *(tt.tree.map(torch.randn_like, from_module(model)) for _ in range(5))
    )
    x = torch.randn(8, 4)
    out = check(lambda p, x: torch.func.vmap(lambda q: functional_call(model, q, x))(p), stacked, x)
    assert out.shape == (5, 8, 1)


@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs a C++ compiler")
def test_inductor_training_step() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    params = tt.tree.map(torch.Tensor.detach, from_module(model))
    td = batch()

    def step(params: tt.TensorDict, state: Any) -> tuple[Any, Any]:
        grads = torch.func.grad(lambda p: ((functional_call(model, p, td["x"]) - td["y"]) ** 2).mean())(params)
        return adam(params, grads, state, lr=1e-2)

    compiled = torch.compile(step, fullgraph=True)
    p_c, s_c = params, adam_init(params)
    p_e, s_e = params, adam_init(params)
    for _ in range(3):
        p_c, s_c = compiled(p_c, s_c)
        p_e, s_e = step(p_e, s_e)
    assert_close(p_c, p_e)
    assert_close(s_c.exp_avg_sq, s_e.exp_avg_sq)
