"""A typed tensorclass: mypy checks the fields, the constructor and the methods' return types.

``make test`` runs mypy over this file; run it with ``python examples/typed_tensorclass.py``.
"""

from __future__ import annotations

import enum
from typing import assert_type

import torch

import tdtree as tt


class Phase(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Obs(tt.TensorClass):
    pixels: torch.Tensor
    position: torch.Tensor


class Step(tt.TensorClass):
    obs: Obs
    reward: torch.Tensor
    extras: tt.TensorDict
    phase: Phase = Phase.TRAIN
    episode: int = 0


def make_step(n: int) -> Step:
    obs = Obs(pixels=torch.zeros(n, 3, 8, 8), position=torch.randn(n, 2), batch_size=[n])
    extras = tt.TensorDict({"done": torch.zeros(n, dtype=torch.bool)}, batch_size=[n])
    return Step(obs=obs, reward=torch.ones(n), extras=extras, batch_size=[n])


def discounted(step: Step, gamma: float) -> Step:
    return step.replace(reward=step.reward * gamma)


def main() -> None:
    step = make_step(8)
    # assert_type fails under mypy when a method's result is not exactly the class (Any included)
    first = assert_type(step[0], Step)
    halves = assert_type(step.split(4), tuple[Step, ...])
    pair = assert_type(tt.stack([step, discounted(step, 0.5)], dim=0), Step)
    moved = assert_type(step.to(torch.float64).clone().reshape(2, 4), Step)
    size = assert_type(moved.batch_size, torch.Size)
    position = assert_type(pair.obs.position, torch.Tensor)
    phase = assert_type(first.phase, Phase)
    episode = assert_type(step.episode + 1, int)
    locked = assert_type(step.lock().apply(lambda t: t), Step)
    back = assert_type(Step.from_node(locked.unlock().to_node(), phase=Phase.EVAL), Step)
    print(size, position.shape, phase, episode, len(halves), back.phase, (step + 1).reward[0].item())


if __name__ == "__main__":
    main()
