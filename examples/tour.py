"""A short tour of tdtree: build a node, read it, edit it functionally, lock it, map over it."""

from __future__ import annotations

import torch

import tdtree as tt


def main() -> None:
    td = tt.TensorDict(
        {"obs": torch.randn(4, 3), "next": {"reward": torch.zeros(4, 1), "done": torch.zeros(4, 1, dtype=torch.bool)}},
        batch_size=[4],
    )
    print(td)
    print("nested keys:", list(td.keys(include_nested=True)))
    print("td['next', 'reward'].shape:", tuple(td["next", "reward"].shape))

    acted = td.set("action", torch.ones(4, 2))
    print("set returns a new node; the input still has", sorted(td.keys()), "and the result", sorted(acted.keys()))
    print("untouched entries are shared:", acted["obs"] is td["obs"])

    flat = acted.flatten_keys()
    print("flatten_keys:", list(flat.keys()))
    print("select/exclude:", list(acted.select("obs", ("next", "done")).keys(True)), list(acted.exclude("next").keys()))

    locked = acted.lock()
    print(
        "type after lock():",
        type(locked).__name__,
        "| select keeps it:",
        type(locked.select("obs")).__name__,
        "| clone drops it:",
        type(locked.clone()).__name__,
    )
    try:
        locked.set("x", torch.zeros(4))
    except tt.LockedError as err:
        print("LockedError:", err)

    doubled = tt.tree.map(lambda x: x * 2 if x.is_floating_point() else x, acted)
    print("tree.map keeps the structure:", tt.tree.structure(doubled) == tt.tree.structure(acted))

    per_row = tt.vmap(lambda row: row.set("obs_sum", row["obs"].sum()))(acted)
    print(
        "tdtree.vmap: inside, batch_size is () per row; outside",
        tuple(per_row.batch_size),
        "and obs_sum",
        tuple(per_row["obs_sum"].shape),
    )

    grads = torch.func.grad(lambda p: (p["w"] ** 2).sum())(tt.TensorDict({"w": torch.ones(3)}))
    print("torch.func.grad over a node returns a node:", type(grads).__name__, grads["w"].tolist())


if __name__ == "__main__":
    main()
