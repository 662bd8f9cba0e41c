"""A user's replay buffer, tested the way a user would: with the public ``tdtree.testing`` API only.

The buffer keeps transitions in memmapped storage, writes batches in place
with ``at[idx].set_`` (a ring over ``capacity`` rows), and samples rows at
random. Its tests use the strategies, ``st.from_type``, a fixture, and every law.
"""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import (
    assert_close,
    assert_equal,
    batch_sizes,
    check_compiles,
    check_grad,
    check_pure,
    check_tags,
    check_vmap,
    same_structure,
    tensordicts,
)
from tdtree.testing.fixtures import tdtree_memmap_dir  # noqa: F401 - the plugin's fixture, for a checkout not installed

# -- the code under test: what a user writes ----------------------------------------------------

# the leaves and their feature shapes
KEYS = {"obs": (3,), "action": None, "reward": (1,), "value": (1,), ("next", "obs"): (3,), ("next", "value"): (1,)}


class ReplayBuffer:
    """A ring of ``capacity`` transitions in files under ``prefix``."""

    def __init__(self, example: tt.TensorDict, capacity: int, prefix: Path) -> None:
        rows = tt.stack([example] * capacity).apply(torch.zeros_like)
        self.storage = rows.memmap(prefix)
        self.capacity, self.cursor, self.size = capacity, 0, 0

    def extend(self, batch: tt.TensorDict) -> None:
        n = batch.batch_size[0]
        index = (self.cursor + torch.arange(n)) % self.capacity
        self.storage.at[index].set_(batch)
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, n: int, generator: torch.Generator) -> tt.TensorDict:
        return gather(self.storage, torch.randint(self.size, (n,), generator=generator))


def gather(storage: tt.TensorDict, index: torch.Tensor) -> tt.TensorDict:
    """The rows ``index`` of ``storage`` (a copy)."""
    return storage[index]


def recent(storage: tt.TensorDict) -> tt.TensorDict:
    """The last two rows (a view)."""
    return storage[-2:]


def td_error(batch: tt.TensorDict, gamma: float = 0.99) -> torch.Tensor:
    """The squared temporal-difference error of each transition."""
    target = batch["reward"] + gamma * batch["next", "value"]
    return ((target - batch["value"]) ** 2).sum(tuple(range(batch.ndim, batch["value"].ndim)))


# -- strategies ---------------------------------------------------------------------------------

FEW = settings(max_examples=10, deadline=None, derandomize=True, database=None)
transitions = tensordicts(batch_size=(), keys=KEYS, dtypes=(torch.float32,), zero_size=False)
batches = tensordicts(
    batch_size=batch_sizes(min_dims=1, max_dims=1, min_side=1, max_side=5),
    keys=KEYS,
    dtypes=(torch.float32,),
    zero_size=False,
)


@st.composite
def stored(draw: st.DrawFn, nodes: st.SearchStrategy[tt.TensorDict]) -> tuple[tt.TensorDict, torch.Tensor]:
    """A storage node (of any tags) and an index of its rows."""
    storage = draw(nodes)
    rows = storage.batch_size[0]
    index = draw(st.lists(st.integers(0, rows - 1), max_size=6)) if rows else []
    return storage, torch.tensor(index, dtype=torch.long)


storages = stored(tensordicts(batch_size=[6], keys=KEYS, tags=True))


# -- tests --------------------------------------------------------------------------------------


@settings(FEW, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(transitions, st.data())
def test_extend_writes_in_place_like_a_dict_of_tensors(tdtree_memmap_dir, example, data):  # noqa: F811
    buffer = ReplayBuffer(example, 4, tdtree_memmap_dir / f"buffer-{len(list(tdtree_memmap_dir.iterdir()))}")
    model = {
        k: torch.zeros(4, *x.shape, dtype=x.dtype) for k, x in example.items(include_nested=True, leaves_only=True)
    }
    start = buffer.storage
    for _ in range(data.draw(st.integers(1, 3))):
        one = data.draw(same_structure(example))
        n = data.draw(st.integers(1, 5))
        batch = tt.stack([one] * n)
        index = (buffer.cursor + torch.arange(n)) % 4
        for k in model:
            model[k][index] = batch[k]
        buffer.extend(batch)
    assert buffer.storage is start and buffer.storage.tags == frozenset({tt.Memmap, tt.Locked})
    assert_equal(
        buffer.storage.flatten_keys(), {".".join(k) if isinstance(k, tuple) else k: v for k, v in model.items()}
    )
    sample = buffer.sample(3, torch.Generator().manual_seed(0))
    rows = torch.randint(buffer.size, (3,), generator=torch.Generator().manual_seed(0))
    assert_equal(sample, buffer.storage.unlock()[rows].unlock(), check_tags=False)


def test_reads_are_pure():
    check_pure(gather, storages, settings=FEW)
    check_pure(td_error, batches, settings=FEW)
    any_node = st.from_type(tt.TensorDict).filter(lambda td: td.ndim >= 1)
    check_pure(gather, stored(any_node), settings=FEW)


def test_tags_of_reads_follow_the_rule():
    check_tags(gather, storages, settings=FEW)  # a copy: no tags
    check_tags(recent, tensordicts(batch_size=[6], keys=KEYS, tags=True), settings=FEW)  # a view: the storage's tags


def test_td_error_compiles_vmaps_and_differentiates():
    check_compiles(td_error, batches, backend="eager", settings=settings(FEW, max_examples=3))
    check_vmap(td_error, batches, settings=FEW)
    check_grad(td_error, tensordicts(batch_size=[3], keys=KEYS, dtypes=(torch.float64,)), settings=FEW)


def test_td_error_matches_torch():
    batch = tt.TensorDict.from_dict(
        {k: torch.randn(3, 2) for k in ("obs", "action", "reward", "value")}
        | {"next": {"obs": torch.randn(3, 2), "value": torch.randn(3, 2)}},
        [3],
    )
    expected = ((batch["reward"] + 0.99 * batch["next", "value"] - batch["value"]) ** 2).sum(1)
    assert_close(td_error(batch), expected)
