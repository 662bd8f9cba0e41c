"""Model ensembling and per-sample gradients with nodes: the two torch.func tutorials, with tdtree.

* Ensembling: five MLPs, their parameters from ``tdtree.nn.from_module`` stacked into one node,
  trained for a few steps with one Adam step per member inside ``tdtree.vmap`` (a node of batch
  size [5]) and inside ``torch.func.vmap`` (a node of batch size () whose leaves lead with the
  member dim). The step adds weight decay to the gradients with node arithmetic and updates with
  ``tdtree.optim.adam``; both are checked against a loop of ``torch.optim.Adam`` over the five models.
* Per-sample gradients: ``vmap(grad(loss))`` over the samples of a batch, the parameters unmapped,
  checked against a loop of ``backward()`` over the samples.

Run: ``python examples/ensemble.py`` (seconds).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import tdtree
import tdtree.optim as optim
from tdtree.nn import from_module, functional_call

MEMBERS, SAMPLES, STEPS, LR, WEIGHT_DECAY = 5, 64, 5, 1e-2, 1e-2
TOLERANCE = 1e-5


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.fc2 = nn.Linear(32, 32)
        self.out = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def max_abs_difference(node: tdtree.TensorDict, module: nn.Module) -> float:
    """The largest difference between the node's leaves and the module's parameters."""
    own = from_module(module)
    return max((a - b).abs().max().item() for a, b in zip(tdtree.tree.leaves(node), tdtree.tree.leaves(own)))


def main() -> None:
    torch.manual_seed(0)
    models = [MLP() for _ in range(MEMBERS)]
    x, y = torch.randn(SAMPLES, 10), torch.randint(0, 3, (SAMPLES,))
    # The module functional_call runs; its own parameters are never used.
    base = copy.deepcopy(models[0])

    def loss_fn(params: tdtree.TensorDict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(base, params, x), y)

    def train_step(params: tdtree.TensorDict, state: optim.AdamState) -> tuple[tdtree.TensorDict, optim.AdamState]:
        grads = torch.func.grad(loss_fn)(params, x, y)
        grads = grads + WEIGHT_DECAY * params  # node arithmetic: torch.optim.Adam's weight_decay
        return optim.adam(params, grads, state, lr=LR)

    members = [tdtree.tree.map(lambda p: p.detach().clone(), from_module(m)) for m in models]

    # -- model ensembling inside tdtree.vmap: one node of batch size [5] --
    params = tdtree.stack(members)
    predictions = tdtree.vmap(lambda p: functional_call(base, p, x))(params)
    expected = torch.stack([m(x) for m in models])
    print(
        f"ensemble of {MEMBERS} MLPs, batch_size {tuple(params.batch_size)}: predictions {tuple(predictions.shape)}, "
        f"max abs difference from the five models: {(predictions - expected).abs().max().item():.1e}"
    )
    state = tdtree.vmap(optim.adam_init)(params)
    for _ in range(STEPS):
        params, state = tdtree.vmap(train_step)(params, state)

    # -- the same inside torch.func.vmap: batch size (), leaves stacked along a new dim 0 --
    stacked = tdtree.tree.map(lambda *leaves: torch.stack(leaves), *members)
    stacked_state = torch.func.vmap(optim.adam_init)(stacked)
    for _ in range(STEPS):
        stacked, stacked_state = torch.func.vmap(train_step)(stacked, stacked_state)

    # -- the reference: torch.optim.Adam over each model in turn --
    for model in models:
        opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        for _ in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    trained = {
        "tdtree.vmap": [params[i] for i in range(MEMBERS)],
        "torch.func.vmap": [tdtree.tree.map(lambda t: t[i], stacked) for i in range(MEMBERS)],
    }
    for name, nodes in trained.items():
        diff = max(max_abs_difference(node, model) for node, model in zip(nodes, models))
        print(f"{STEPS} Adam steps inside {name}: max abs difference from torch.optim.Adam: {diff:.1e}")
        assert diff < TOLERANCE, f"{name}: {diff}"

    # -- per-sample gradients: vmap over the samples, the parameters unmapped --
    model = models[0]
    single = tdtree.tree.map(lambda p: p.detach(), from_module(model))

    def sample_loss(params: tdtree.TensorDict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return loss_fn(params, xi.unsqueeze(0), yi.unsqueeze(0))

    per_sample = tdtree.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))(single, x, y)
    per_sample_func = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))(single, x, y)
    diff = 0.0
    for i in range(SAMPLES):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads = {name: p.grad for name, p in model.named_parameters()}
        for got in (per_sample[i], tdtree.tree.map(lambda t: t[i], per_sample_func)):
            for name, g in grads.items():
                diff = max(diff, (got[tuple(name.split("."))] - g).abs().max().item())
    print(
        f"per-sample gradients of {SAMPLES} samples, batch_size {tuple(per_sample.batch_size)}: "
        f"max abs difference from a loop over the samples: {diff:.1e}"
    )
    assert diff < TOLERANCE, diff


if __name__ == "__main__":
    main()
