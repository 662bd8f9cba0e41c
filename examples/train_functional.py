"""Functional training with tdtree: parameters as a node, torch.func.grad, tdtree.optim.adam.

A small MLP learns a synthetic regression task. The whole training step
(forward, gradient, Adam update) is one pure function of
``(params, opt_state, batch)`` and runs under ``torch.compile(fullgraph=True)``
when a C++ compiler is there for inductor; otherwise it runs eagerly. Each
epoch prints its own time; the compile (the compiled step's first call) is
timed and printed apart. At the end the script times the compiled and the
eager step in the same run.

Run: ``python examples/train_functional.py`` (well under 2 minutes on 2 cores).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import torch
from torch import nn

import tdtree
import tdtree.nn as tnn
import tdtree.optim as optim

SAMPLES, FEATURES, HIDDEN, BATCH, EPOCHS, LR = 512, 16, 64, 32, 5, 3e-3


def make_data(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets from a random teacher network, plus a little noise."""
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    w1 = torch.randn(FEATURES, 8, generator=generator) / FEATURES**0.5
    w2 = torch.randn(8, 1, generator=generator)
    y = torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(SAMPLES, 1, generator=generator)
    return x, y


def batches(x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> list[tdtree.TensorDict]:
    order = torch.randperm(SAMPLES, generator=generator)
    return [tdtree.TensorDict({"x": x[idx], "y": y[idx]}, batch_size=[len(idx)]) for idx in order.split(BATCH)]


def make_train_step(model: nn.Module) -> Any:
    """The pure training step ``(params, state, batch) -> (params, state, loss)`` for ``model``."""

    def loss_fn(params: tdtree.TensorDict, batch: tdtree.TensorDict) -> torch.Tensor:
        out = tnn.functional_call(model, params, batch)
        return ((out["pred"] - out["y"]) ** 2).mean()

    def train_step(
        params: tdtree.TensorDict, state: optim.AdamState, batch: tdtree.TensorDict
    ) -> tuple[tdtree.TensorDict, optim.AdamState, torch.Tensor]:
        grads, loss = torch.func.grad_and_value(loss_fn)(params, batch)
        params, state = optim.adam(params, grads, state, lr=LR)
        return params, state, loss

    return train_step


def steps_per_second(step: Any, params: Any, state: Any, batch: tdtree.TensorDict, n: int = 50) -> float:
    """The best of three timings of ``n`` steps (the machine may be shared)."""
    for _ in range(5):
        params, state, _ = step(params, state, batch)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            params, state, _ = step(params, state, batch)
        best = min(best, time.perf_counter() - start)
    return n / best


def main() -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    x, y = make_data(generator)
    model = tnn.TDModule(
        nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)
        ),
        in_keys="x",
        out_keys="pred",
    )
    train_step = make_train_step(model)
    # from_module hands out the module's own nn.Parameters; detached copies of
    # the same storage keep the first compiled call's guards (requires_grad)
    # equal to later ones, whose params come from adam and need no grad.
    params = tdtree.tree.map(torch.Tensor.detach, tnn.from_module(model))
    state = optim.adam_init(params)

    if shutil.which("g++"):
        step = torch.compile(train_step, fullgraph=True)
        mode = "compiled (inductor, fullgraph)"
    else:
        step = train_step
        mode = "eager"
        print("no C++ compiler (g++) found: torch.compile's inductor backend cannot run, training eagerly")

    first_call: float | None = None  # the first call of a compiled step compiles it: timed apart from the epochs
    for epoch in range(EPOCHS):
        losses = []
        start = time.perf_counter()
        for batch in batches(x, y, generator):
            began = time.perf_counter()
            params, state, loss = step(params, state, batch)
            losses.append(loss.item())
            if first_call is None and step is not train_step:
                first_call = time.perf_counter() - began
                start += first_call
                print(f"compiling the step (its first call): {first_call:.1f}s")
        seconds = time.perf_counter() - start
        print(f"epoch {epoch + 1}/{EPOCHS}  loss {sum(losses) / len(losses):.4f}  ({mode}, {seconds:.2f}s this epoch)")

    batch = batches(x, y, generator)[0]
    eager = steps_per_second(train_step, params, state, batch)
    if step is train_step:
        print(f"eager: {eager:.0f} steps/s")
    else:
        compiled = steps_per_second(step, params, state, batch)
        print(f"compiled: {compiled:.0f} steps/s, eager: {eager:.0f} steps/s ({compiled / eager:.1f}x)")


if __name__ == "__main__":
    main()
