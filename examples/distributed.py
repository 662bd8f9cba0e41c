"""Nodes over torch.distributed: run with torchrun, on one machine or several.

One machine, two processes (from a checkout, after `make demo`; elsewhere the torchrun of your environment):

    .venv/bin/torchrun --nproc-per-node 2 examples/distributed.py

Two machines (run on each; node 0's address is reachable from node 1):

    .venv/bin/torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 examples/distributed.py
    .venv/bin/torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 examples/distributed.py

Each process makes a batch of "experience", the ranks average a node of parameters with
``all_reduce``, gather every rank's batch with ``all_gather``, and pass batches around a ring
with ``isend`` / ``recv``; then rank 1 streams a few batches to rank 0 over a ``Channel`` (the
structure agreed once, one message per batch after that). Rank 0 prints what it saw.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import tdtree as tt
import tdtree.distributed as ttd


def main() -> None:
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)

    batch = tt.TensorDict(
        {"obs": torch.randn(8, 4), "action": torch.randint(0, 3, (8,)), "next": {"reward": torch.randn(8, 1)}},
        batch_size=[8],
    )
    params = tt.TensorDict({"w": torch.full((4, 3), float(rank)), "b": torch.zeros(3) + rank})

    mean = ttd.all_reduce(params) / world  # a new node; params is unchanged
    everyone = ttd.all_gather(batch)  # batch_size (world, 8): entry i from rank i
    config = ttd.broadcast(tt.TensorDict({"lr": torch.tensor(0.1 * (rank + 1))}), src=0)

    # a ring: send to the next rank, receive from the previous one, shaped like our own batch
    right, left = (rank + 1) % world, (rank - 1) % world
    sending = ttd.isend(batch, right)
    from_left = ttd.recv(batch, left)
    sending.wait()

    # a stream between two fixed peers (an actor feeding a learner): the channel checks the
    # structure once, when both ends make it, then each batch is one message
    streamed = []
    if world >= 2 and rank < 2:
        channel = ttd.Channel(batch.set("step", torch.zeros(8, dtype=torch.int64)), peer=1 - rank, tag=1)
        if rank == 1:
            for step in range(3):
                channel.send(batch.set("step", torch.full((8,), step)))
        else:
            streamed = [channel.recv() for _ in range(3)]

    if rank == 0:
        print(f"world size {world}")
        print(f"mean of w over the ranks: {mean['w'][0, 0].item():.2f} (expected {(world - 1) / 2:.2f})")
        print(
            f"gathered batch size: {tuple(everyone.batch_size)}, next/reward {tuple(everyone['next', 'reward'].shape)}"
        )
        print(f"lr from rank 0: {config['lr'].item():.2f}")
        print(
            f"received from rank {left}: obs equal to its gathered entry: {torch.equal(from_left['obs'], everyone['obs'][left])}"
        )
        print(
            f"streamed from rank 1: steps {[int(b['step'][0]) for b in streamed]}, "
            f"obs equal to its gathered entry: {all(torch.equal(b['obs'], everyone['obs'][1]) for b in streamed)}"
        )
    # every rank done before any tears down: a rank that leaves while two others still exchange (rank 2
    # here, outside the stream) can abort in gloo's teardown
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
