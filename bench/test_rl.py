"""Small RL training: a PPO-style update of an actor-critic MLP and a rollout buffer filled row by row.

``test_ppo_update``: one update as a PPO learner runs it on a rollout of ``[T, B] = [64, 8]`` steps
(obs, action, reward, done, value, log_prob): advantages and returns by GAE (a Python loop over
time), then 12 Adam steps on the clipped surrogate plus the value loss, over the whole rollout.
tdtree: ``tdtree.func.grad`` of the loss over the parameter node (``from_module``) and the rollout
node, ``tdtree.optim.adam``; tensordict: the module, ``loss.backward()`` and ``torch.optim.Adam``
over a TensorDict rollout, as its users write it; pytree, the floor: ``torch.func.grad`` over a
nested dict of parameters and a dict rollout, with torch's own functional Adam
(``torch.optim.adam.adam``, foreach) on their leaves. Every row starts from the same parameters and a
fresh optimiser state and returns the trained parameters, which each row checks against the same
update written with the module and ``torch.optim.Adam``.

``test_rollout_row_writes``: a nested buffer ``[T, B]`` filled one row per step from step nodes
``[B]``: ``buf.at[t].set_(step)``, tensordict's ``buf[t] = step``, and the floor writing each leaf's
row from the step's leaves.
"""

from __future__ import annotations

import functools
from typing import Any

import optree
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.adam import adam as functional_adam

import tdtree
import tdtree.func
from tdtree import optim
from tdtree.nn import from_module

from .impls import Impl, tensordict

T, B, OBS, ACTIONS, HIDDEN = 64, 8, 8, 4, 64
EPOCHS, LR, GAMMA, LAMBDA, CLIP = 12, 3e-4, 0.99, 0.95, 0.2


class ActorCritic(nn.Module):
    """Two MLPs on the observation: action logits and the state value."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.Sequential(
            nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, ACTIONS)
        )
        self.critic = nn.Sequential(
            nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)
        )


def _net() -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic()


def _rollout() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "obs": torch.randn(T, B, OBS, generator=g),
        "action": torch.randint(ACTIONS, (T, B), generator=g),
        "reward": torch.randn(T, B, generator=g),
        "done": torch.rand(T, B, generator=g) < 0.05,
        "value": torch.randn(T, B, generator=g),
        "log_prob": -1 - torch.rand(T, B, generator=g),
    }


def _gae(reward: torch.Tensor, done: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns by generalised advantage estimation, the last step bootstrapping from 0."""
    not_done = (~done).float()
    advantages = []
    last = next_value = torch.zeros_like(reward[0])
    for t in range(T - 1, -1, -1):
        delta = reward[t] + GAMMA * next_value * not_done[t] - value[t]
        last = delta + GAMMA * LAMBDA * not_done[t] * last
        advantages.append(last)
        next_value = value[t]
    advantage = torch.stack(advantages[::-1])
    return advantage, advantage + value


def _mlp(p: Any, x: torch.Tensor) -> torch.Tensor:
    """The actor's or critic's forward over its parameters (a node or a nested dict)."""
    x = torch.tanh(F.linear(x, p["0"]["weight"], p["0"]["bias"]))
    x = torch.tanh(F.linear(x, p["2"]["weight"], p["2"]["bias"]))
    return F.linear(x, p["4"]["weight"], p["4"]["bias"])


def _ppo_loss(logits: torch.Tensor, value: torch.Tensor, batch: Any) -> torch.Tensor:
    log_prob = torch.log_softmax(logits, -1).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    ratio = (log_prob - batch["log_prob"]).exp()
    advantage = batch["advantage"]
    surrogate = -torch.min(ratio * advantage, ratio.clamp(1 - CLIP, 1 + CLIP) * advantage).mean()
    return surrogate + 0.5 * ((value.squeeze(-1) - batch["returns"]) ** 2).mean()


def _functional_loss(params: Any, batch: Any) -> torch.Tensor:
    obs = batch["obs"]
    return _ppo_loss(_mlp(params["actor"], obs), _mlp(params["critic"], obs), batch)


def _module_loss(module: ActorCritic, batch: Any) -> torch.Tensor:
    obs = batch["obs"]
    return _ppo_loss(module.actor(obs), module.critic(obs), batch)


@functools.cache
def _reference() -> dict[str, torch.Tensor]:
    """The trained parameters of the update written with the module, a dict rollout and torch.optim.Adam."""
    module, rollout = _net(), _rollout()
    advantage, returns = _gae(rollout["reward"], rollout["done"], rollout["value"])
    batch = {**rollout, "advantage": advantage, "returns": returns}
    opt = torch.optim.Adam(module.parameters(), lr=LR)
    for _ in range(EPOCHS):
        opt.zero_grad()
        _module_loss(module, batch).backward()
        opt.step()
    return {k: v.detach() for k, v in module.named_parameters()}


def _tdtree_update() -> tuple[Any, Any]:
    params, rollout = from_module(_net()), tdtree.TensorDict(_rollout(), [T, B])
    grad = tdtree.func.grad(_functional_loss)

    def update() -> Any:
        advantage, returns = _gae(rollout["reward"], rollout["done"], rollout["value"])
        batch = rollout.update({"advantage": advantage, "returns": returns})
        p, state = params, optim.adam_init(params)
        for _ in range(EPOCHS):
            p, state = optim.adam(p, grad(p, batch), state, lr=LR)
        return p

    return update, lambda p: p.flatten_keys(".")


def _tensordict_update() -> tuple[Any, Any]:
    module, rollout = _net(), tensordict.TensorDict(_rollout(), [T, B])
    weights = list(module.parameters())
    initial = [w.detach().clone() for w in weights]

    def update() -> Any:
        with torch.no_grad():
            torch._foreach_copy_(weights, initial)
        opt = torch.optim.Adam(weights, lr=LR)
        advantage, returns = _gae(rollout["reward"], rollout["done"], rollout["value"])
        batch = rollout.clone(False)
        batch["advantage"] = advantage
        batch["returns"] = returns
        for _ in range(EPOCHS):
            opt.zero_grad()
            _module_loss(module, batch).backward()
            opt.step()
        return module

    return update, lambda m: dict(m.named_parameters())


def _dict_update() -> tuple[Any, Any]:
    net = _net()
    params = {
        part: {layer: dict(getattr(net, part)[int(layer)].named_parameters()) for layer in ("0", "2", "4")}
        for part in ("actor", "critic")
    }
    initial, spec = optree.tree_flatten({k: optree.tree_map(torch.Tensor.detach, v) for k, v in params.items()})
    rollout = _rollout()
    grad = torch.func.grad(_functional_loss)

    def update() -> Any:
        advantage, returns = _gae(rollout["reward"], rollout["done"], rollout["value"])
        batch = {**rollout, "advantage": advantage, "returns": returns}
        leaves = [w.clone() for w in initial]
        p = optree.tree_unflatten(spec, leaves)
        exp_avgs = [torch.zeros_like(w) for w in leaves]
        exp_avg_sqs = [torch.zeros_like(w) for w in leaves]
        steps = [torch.zeros(()) for _ in leaves]
        for _ in range(EPOCHS):
            grads = optree.tree_leaves(grad(p, batch))
            with torch.no_grad():
                functional_adam(
                    leaves, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True,
                    amsgrad=False, beta1=0.9, beta2=0.999, lr=LR, weight_decay=0.0, eps=1e-8, maximize=False,
                )  # fmt: skip
        return p

    return update, lambda p: {".".join(path): v for path, v in zip(*optree.tree_flatten_with_path(p)[:2])}


@pytest.mark.pytree
def test_ppo_update(benchmark, impl: Impl) -> None:
    """GAE over the rollout and 12 Adam steps of the PPO loss (see the module doc for each row)."""
    make = {"tdtree": _tdtree_update, "tensordict": _tensordict_update, "pytree": _dict_update}[impl.name]
    update, named = make()
    trained = named(benchmark(update))
    expected = _reference()
    assert sorted(trained) == sorted(expected)
    for k, v in expected.items():
        torch.testing.assert_close(trained[k].detach(), v, rtol=1e-4, atol=1e-5)


def _step_source(t: int, *batch: int) -> dict[str, Any]:
    """The nested entries of step ``t`` (zeros for the empty buffer): a transition with its next step."""
    g = torch.Generator().manual_seed(t)
    return {
        "obs": torch.randn(*batch, OBS, generator=g),
        "action": torch.randint(ACTIONS, batch, generator=g),
        "reward": torch.randn(batch, generator=g),
        "done": torch.rand(batch, generator=g) < 0.05,
        "next": {"obs": torch.randn(*batch, OBS, generator=g), "reward": torch.randn(batch, generator=g)},
    }


@torch.no_grad()
@pytest.mark.pytree
def test_rollout_row_writes(benchmark, impl: Impl) -> None:
    """A [64, 8] nested buffer filled row by row from 64 step nodes [8]. tdtree: ``buf.at[t].set_(step)``;
    tensordict: ``buf[t] = step``; pytree: ``leaf[t] = value`` for the buffer's and the step's leaves."""
    buf = impl.node(optree.tree_map(torch.zeros_like, _step_source(0, T, B)), (T, B))
    steps = [impl.node(_step_source(t, B), (B,)) for t in range(T)]
    if impl.name == "tdtree":

        def fill() -> Any:
            for t, step in enumerate(steps):
                buf.at[t].set_(step)
            return buf
    elif impl.name == "tensordict":

        def fill() -> Any:
            for t, step in enumerate(steps):
                buf[t] = step
            return buf
    else:
        rows = optree.tree_leaves(buf)

        def fill() -> Any:
            for t, step in enumerate(steps):
                for row, value in zip(rows, optree.tree_leaves(step)):
                    row[t] = value
            return buf

    out = benchmark(fill)
    expected = optree.tree_map(lambda *xs: torch.stack(xs), *[_step_source(t, B) for t in range(T)])
    for path, value in zip(*optree.tree_flatten_with_path(expected)[:2]):
        entry = out
        for part in path:
            entry = entry[part]
        assert torch.equal(entry, value), path
