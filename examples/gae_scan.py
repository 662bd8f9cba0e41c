"""Generalised advantage estimation by a reverse ``tdtree.control.scan`` over a rollout node of shape [T, B].

The advantages equal the Python loop's, eager and compiled with ``fullgraph=True``; the script prints the
largest difference and the times of the loop, the scan over the node and the same scan over a dict of
tensors (torch's own operator), side by side.
"""

from __future__ import annotations

import timeit
from typing import Any

import torch
from torch._higher_order_ops import scan as torch_scan

import tdtree as tt

T, B = 128, 16
GAMMA, LAM = 0.99, 0.95


def rollout(seed: int = 0) -> tt.TensorDict:
    g = torch.Generator().manual_seed(seed)
    return tt.TensorDict(
        {
            "reward": torch.randn(T, B, generator=g),
            "value": torch.randn(T, B, generator=g),
            "next_value": torch.randn(T, B, generator=g),
            "done": torch.rand(T, B, generator=g) < 0.05,
        },
        batch_size=[T, B],
    )


def gae_loop(r: Any) -> torch.Tensor:
    adv, last = torch.zeros(T, B), torch.zeros(B)
    for t in reversed(range(T)):
        notdone = (~r["done"][t]).float()
        delta = r["reward"][t] + GAMMA * r["next_value"][t] * notdone - r["value"][t]
        last = delta + GAMMA * LAM * notdone * last
        adv[t] = last
    return adv


def step(carry: Any, x: Any) -> tuple[Any, torch.Tensor]:
    """One step back in time: JAX style, the new advantage is both the carry and the output."""
    notdone = (~x["done"]).float()
    delta = x["reward"] + GAMMA * x["next_value"] * notdone - x["value"]
    adv = delta + GAMMA * LAM * notdone * carry["adv"]
    return carry.set("adv", adv), adv


def gae_node(r: tt.TensorDict) -> torch.Tensor:
    init = tt.TensorDict({"adv": torch.zeros(B)}, batch_size=[B])
    _, adv = tt.control.scan(step, init, r, reverse=True)
    return adv


def step_dict(
    carry: dict[str, torch.Tensor], x: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    notdone = (~x["done"]).float()
    delta = x["reward"] + GAMMA * x["next_value"] * notdone - x["value"]
    adv = delta + GAMMA * LAM * notdone * carry["adv"]
    return {"adv": adv}, adv.clone()  # torch refuses one tensor twice among the outputs


def gae_dict(r: dict[str, torch.Tensor]) -> torch.Tensor:
    _, adv = torch_scan(step_dict, {"adv": torch.zeros(B)}, r, reverse=True)
    return adv


def best(runs: list[tuple[Any, Any]], rounds: int = 15, number: int = 3) -> list[float]:
    """The best time of a call of each ``(fn, arg)``, rounds interleaved so that each sees the same machine."""
    times = [float("inf")] * len(runs)
    for _ in range(rounds):
        for i, (fn, arg) in enumerate(runs):
            times[i] = min(times[i], timeit.timeit(lambda: fn(arg), number=number) / number)
    return times


def main() -> None:
    r = rollout()
    d = r.to_dict()
    want = gae_loop(r)
    eager = (gae_node(r) - want).abs().max().item()
    compiled_fn = torch.compile(gae_node, backend="aot_eager", fullgraph=True)
    compiled = (compiled_fn(r) - want).abs().max().item()
    print(f"rollout batch_size {tuple(r.batch_size)}: advantages by reverse scan")
    print(f"max abs difference from the Python loop, eager: {eager:.2e}")
    print(f"max abs difference from the Python loop, compiled fullgraph: {compiled:.2e}")
    gae_dict(d)  # torch's first call compiles its scan
    t_loop, t_node, t_dict = best([(gae_loop, r), (gae_node, r), (gae_dict, d)])
    print(f"time: Python loop {t_loop * 1e3:.2f} ms, node scan {t_node * 1e3:.2f} ms, dict scan {t_dict * 1e3:.2f} ms")
    print(f"node scan / dict scan: {t_node / t_dict:.2f}")
    assert eager < 1e-5 and compiled < 1e-5


if __name__ == "__main__":
    main()
