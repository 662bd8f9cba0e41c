"""A typed tensorclass: mypy checks the fields, the constructor and the methods' return types.

``make test`` runs mypy over this file; run it with ``python examples/typed_tensorclass.py``.
"""

from __future__ import annotations

import enum

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
    first: Step = step[0]
    halves: tuple[Step, ...] = step.split(4)
    pair: Step = tt.stack([step, discounted(step, 0.5)], dim=0)
    moved: Step = step.to(torch.float64).clone().reshape(2, 4)
    size: torch.Size = moved.batch_size
    position: torch.Tensor = pair.obs.position
    phase: Phase = first.phase
    episode: int = step.episode + 1
    locked: Step = step.lock()
    back: Step = Step.from_tensordict(locked.unlock().to_tensordict(), phase=Phase.EVAL)
    print(size, position.shape, phase, episode, len(halves), back.phase, (step + 1).reward[0].item())


if __name__ == "__main__":
    main()
