"""Nodes and tensorclasses as datasets (``td.as_dataset()``, a tensorclass itself), ``tdtree.data.minibatches``
and ``memmap_like``, each against the same job done with plain torch (a ``TensorDataset`` of the same tensors
through ``DataLoader``, the same sampler generator) and, where cheap, tensordict in the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from _tensordict_side import needs_tensordict
from torch.utils.data import ConcatDataset, DataLoader, RandomSampler, Subset, TensorDataset

import tdtree as tt
from tdtree.testing import assert_equal

N = 10


def _tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, generator=g), torch.arange(N), torch.randn(N, 2, 2, generator=g)


def _node() -> tt.TensorDict:
    obs, label, reward = _tensors()
    return tt.TensorDict({"obs": obs, "label": label, "next": {"reward": reward}}, batch_size=[N])


class Pair(tt.TensorClass):
    obs: torch.Tensor
    label: torch.Tensor


def _torch_batches(batch_size: int, seed: int | None, drop_last: bool = False) -> list[list[torch.Tensor]]:
    """The batches plain torch gives: a TensorDataset of the same tensors through DataLoader."""
    ds = TensorDataset(*_tensors())
    sampler = None if seed is None else RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
    return list(DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=drop_last))


def _same_as_torch(batches: list[Any], expected: list[list[torch.Tensor]]) -> None:
    assert len(batches) == len(expected)
    for got, (obs, label, reward) in zip(batches, expected, strict=True):
        assert isinstance(got, tt.TensorDict) and got.batch_size == (len(label),)
        assert_equal(got, {"obs": obs, "label": label, "next": {"reward": reward}})


def _sampler(ds: Any, seed: int) -> RandomSampler:
    return RandomSampler(ds, generator=torch.Generator().manual_seed(seed))


# -- a node's dataset view ----------------------------------------------------------------------


def test_len_of_a_node_counts_keys_and_its_dataset_counts_rows() -> None:
    td = _node()
    ds = td.as_dataset()
    assert len(td) == 3 == len({"obs": 0, "label": 0, "next": 0})
    assert len(ds) == N == len(TensorDataset(*_tensors()))
    assert isinstance(ds, torch.utils.data.Dataset) and isinstance(ds, tt.data.TensorDictDataset)
    assert ds.data is td
    assert_equal(ds[3], td[3])
    assert ds[3]["obs"].data_ptr() == td["obs"][3].data_ptr()  # a row is a view
    assert_equal(ds.__getitems__([4, 1, 1]), td[torch.tensor([4, 1, 1])])


@pytest.mark.parametrize("collate", ["default", "identity"])
@pytest.mark.parametrize("seed", [None, 7])
def test_dataloader_over_the_dataset_gives_the_batches_of_a_tensor_dataset(collate: str, seed: int | None) -> None:
    ds = _node().as_dataset()
    sampler = None if seed is None else _sampler(ds, seed)
    kwargs: dict[str, Any] = {} if collate == "default" else {"collate_fn": lambda x: x}
    _same_as_torch(list(DataLoader(ds, batch_size=4, sampler=sampler, **kwargs)), _torch_batches(4, seed))


def test_a_batch_is_read_in_one_index_operation() -> None:
    class NoRows(tt.data.TensorDictDataset):
        def __getitem__(self, index: Any) -> Any:
            raise AssertionError("a batch was read row by row")

    _same_as_torch(list(DataLoader(NoRows(_node()), batch_size=4)), _torch_batches(4, None))


def test_default_collate_stacks_rows_read_one_by_one() -> None:
    # ConcatDataset has no __getitems__: DataLoader reads rows one by one and collates the list
    ds = _node().as_dataset()
    both = list(DataLoader(ConcatDataset([ds, ds]), batch_size=4, drop_last=True))
    ours = tt.cat([_node(), _node()])
    assert len(both) == 2 * N // 4
    for i, batch in enumerate(both):
        assert_equal(batch, ours[4 * i : 4 * i + 4])


def test_subset_of_the_dataset_reads_through_getitems() -> None:
    ds = _node().as_dataset()
    indices = [9, 2, 5]
    (batch,) = DataLoader(Subset(ds, indices), batch_size=3)
    (obs, label, reward) = next(iter(DataLoader(Subset(TensorDataset(*_tensors()), indices), batch_size=3)))
    assert_equal(batch, {"obs": obs, "label": label, "next": {"reward": reward}})


def test_a_node_handed_to_dataloader_as_a_dataset_raises_naming_as_dataset() -> None:
    td = _node()
    # without the error DataLoader would take len(td) == 3 keys for 3 rows and quietly yield rows 0..2
    with pytest.raises(TypeError, match=r"counts its 3 keys.*td\.as_dataset\(\)"):
        list(DataLoader(td, batch_size=2, collate_fn=lambda x: x))
    with pytest.raises(TypeError, match=r"as_dataset"):
        list(DataLoader(Subset(td, [0, 1]), batch_size=2))


def test_a_dataset_needs_a_batch_dim() -> None:
    with pytest.raises(TypeError, match="no batch dims"):
        tt.TensorDict({"w": torch.zeros(3)}).as_dataset()
    with pytest.raises(TypeError, match="got dict"):
        tt.data.TensorDictDataset({"w": torch.zeros(3)})


def test_the_rows_of_a_locked_node_are_views_and_a_batch_is_new_storage() -> None:
    td = _node().lock()
    ds = td.as_dataset()
    assert ds[0].tags == {tt.Locked}
    (batch,) = DataLoader(ds, batch_size=N)
    assert batch.tags == frozenset()
    assert_equal(batch, td, check_tags=False)


@needs_tensordict
def test_a_node_dataset_gives_what_tensordicts_dataloader_gives() -> None:
    import tensordict  # optional dependency

    td = _node()
    theirs = tensordict.TensorDict(
        {"obs": td["obs"], "label": td["label"], "next": {"reward": td["next", "reward"]}}, batch_size=[N]
    )
    ours = list(DataLoader(td.as_dataset(), batch_size=4, sampler=_sampler(td.as_dataset(), 3)))
    expected = list(DataLoader(theirs, batch_size=4, sampler=_sampler(theirs, 3), collate_fn=lambda x: x))
    for got, exp in zip(ours, expected, strict=True):
        assert_equal(got, tt.from_tensordict(exp))


# -- a tensorclass is a dataset itself ------------------------------------------------------------


def _pair() -> Pair:
    obs, label, _ = _tensors()
    return Pair(obs, label, batch_size=[N])


def test_len_of_a_tensorclass_is_its_first_batch_dim() -> None:
    assert len(_pair()) == N == len(_tensors()[0])
    assert len(_pair().reshape(2, 5)) == 2
    with pytest.raises(TypeError, match="Pair with no batch dims"):
        len(_pair()[0])


@pytest.mark.parametrize("collate", ["default", "identity"])
def test_dataloader_over_a_tensorclass_yields_instances(collate: str) -> None:
    data = _pair()
    kwargs: dict[str, Any] = {} if collate == "default" else {"collate_fn": lambda x: x}
    batches = list(DataLoader(data, batch_size=4, sampler=_sampler(data, 5), **kwargs))
    expected = _torch_batches(4, 5)
    assert len(batches) == len(expected)
    for got, (obs, label, _) in zip(batches, expected, strict=True):
        assert type(got) is Pair and got.batch_size == (len(label),)
        assert torch.equal(got.obs, obs) and torch.equal(got.label, label)
    assert_equal(data.__getitems__([3, 0]), data[torch.tensor([3, 0])])


def test_default_collate_stacks_tensorclass_rows_read_one_by_one() -> None:
    data = _pair()
    (batch,) = DataLoader(ConcatDataset([data]), batch_size=N)
    assert type(batch) is Pair
    assert_equal(batch, data)


@needs_tensordict
def test_a_tensorclass_loads_as_tensordicts_tensorclass_does() -> None:
    import tensordict  # optional dependency

    @tensordict.tensorclass
    class TheirPair:
        obs: torch.Tensor
        label: torch.Tensor

    obs, label, _ = _tensors()
    theirs = TheirPair(obs=obs, label=label, batch_size=[N])
    ours = _pair()
    assert len(ours) == len(theirs)
    # tensordict's tutorial: DataLoader(data, batch_size=64, collate_fn=lambda x: x) yields instances
    expected = list(DataLoader(theirs, batch_size=4, sampler=_sampler(theirs, 2), collate_fn=lambda x: x))
    got = list(DataLoader(ours, batch_size=4, sampler=_sampler(ours, 2), collate_fn=lambda x: x))
    for a, b in zip(got, expected, strict=True):
        assert type(a) is Pair and type(b) is TheirPair
        assert torch.equal(a.obs, b.obs) and torch.equal(a.label, b.label)


# -- minibatches --------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_shuffled_minibatches_are_a_random_samplers_batches(drop_last: bool) -> None:
    batches = tt.data.minibatches(_node(), 4, generator=torch.Generator().manual_seed(11), drop_last=drop_last)
    expected = _torch_batches(4, 11, drop_last=drop_last)
    assert len(batches) == len(expected) == (2 if drop_last else 3)
    _same_as_torch(list(batches), expected)


def test_unshuffled_minibatches_are_views_keeping_tags() -> None:
    td = _node().lock()
    batches = list(tt.data.minibatches(td, 4, shuffle=False))
    _same_as_torch([b.unlock() for b in batches], _torch_batches(4, None))
    assert all(b.tags == {tt.Locked} for b in batches)
    assert batches[1]["obs"].data_ptr() == td["obs"][4].data_ptr()


def test_shuffled_minibatches_are_new_storage_and_a_new_order_each_pass() -> None:
    td = _node().lock()
    batches = tt.data.minibatches(td, 3, generator=torch.Generator().manual_seed(0))
    first, second = list(batches), list(batches)
    assert all(b.tags == frozenset() for b in first)
    orders = [torch.cat([b["label"] for b in p]) for p in (first, second)]
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(orders[0], torch.randperm(N, generator=gen))
    assert torch.equal(orders[1], torch.randperm(N, generator=gen))
    assert not torch.equal(orders[0], orders[1])


def test_minibatches_without_a_generator_use_the_global_rng() -> None:
    torch.manual_seed(123)
    got = torch.cat([b["label"] for b in tt.data.minibatches(_node(), 4)])
    torch.manual_seed(123)
    assert torch.equal(got, torch.randperm(N))


def test_minibatches_of_a_tensorclass_are_instances() -> None:
    data = _pair()
    batches = list(tt.data.minibatches(data, 4, generator=torch.Generator().manual_seed(1)))
    expected = list(DataLoader(data, batch_size=4, sampler=_sampler(data, 1), collate_fn=lambda x: x))
    assert [type(b) for b in batches] == [Pair] * 3
    for a, b in zip(batches, expected, strict=True):
        assert_equal(a, b)


def test_minibatches_refuse_what_is_not_a_batch() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        tt.data.minibatches(_node(), 0)
    with pytest.raises(TypeError, match="no batch dims"):
        tt.data.minibatches(tt.TensorDict({"w": torch.zeros(2)}), 1)
    with pytest.raises(TypeError, match="got Tensor"):
        tt.data.minibatches(torch.zeros(4), 2)


# -- memmap_like --------------------------------------------------------------------------------


def _spec(rows: int) -> tt.TensorDict:
    return tt.TensorDict(
        {
            "image": torch.empty(rows, 3, 4, 4, dtype=torch.uint8, device="meta"),
            "meta": {"label": torch.empty(rows, dtype=torch.int64, device="meta")},
        },
        batch_size=[rows],
    )


def test_memmap_like_of_a_spec_is_memmap_of_zeros(tmp_path: Any) -> None:
    spec = _spec(6)
    zeros = tt.TensorDict(
        {"image": torch.zeros(6, 3, 4, 4, dtype=torch.uint8), "meta": {"label": torch.zeros(6, dtype=torch.int64)}},
        batch_size=[6],
    )
    data = spec.memmap_like(tmp_path / "like")
    assert_equal(data, zeros.memmap(tmp_path / "written"))
    assert data.tags == {tt.Memmap, tt.Locked} and data.device == torch.device("cpu")
    assert sorted(os.listdir(tmp_path / "like")) == sorted(os.listdir(tmp_path / "written"))
    for name in os.listdir(tmp_path / "written"):
        if name.endswith(".bin"):
            assert os.path.getsize(tmp_path / "like" / name) == os.path.getsize(tmp_path / "written" / name)
    data.at[2:4].set_(
        tt.TensorDict(
            {"image": torch.ones(2, 3, 4, 4, dtype=torch.uint8), "meta": {"label": torch.tensor([5, 6])}}, [2]
        )
    )
    expected = zeros.at[2:4].set(
        tt.TensorDict(
            {"image": torch.ones(2, 3, 4, 4, dtype=torch.uint8), "meta": {"label": torch.tensor([5, 6])}}, [2]
        )
    )
    assert_equal(tt.load_memmap(tmp_path / "like"), expected.memmap(tmp_path / "expected"))


def test_memmap_like_of_an_expanded_row_and_of_a_tensorclass(tmp_path: Any) -> None:
    row = Pair(torch.randn(1, 3), torch.ones(1, dtype=torch.int64), batch_size=[1])
    data = row.expand(1000).memmap_like(tmp_path / "pairs")
    assert type(data) is Pair and data.tags == {tt.Memmap, tt.Locked}
    assert data.obs.shape == (1000, 3) and data.label.dtype == torch.int64 and not data.obs.any()
    data.at[10:20].set_(Pair(torch.ones(10, 3), torch.arange(10), batch_size=[10]))
    back = tt.load_memmap(tmp_path / "pairs")
    assert type(back) is Pair
    assert_equal(back[10:20], Pair(torch.ones(10, 3), torch.arange(10), batch_size=[10]), check_tags=False)
    assert not back.obs[:10].any() and not back.obs[20:].any() and not back.label[20:].any()


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_memmap_like_refuses_as_memmap_does_and_leaves_nothing(tmp_path: Any) -> None:
    spec = _spec(3)
    spec.memmap_like(tmp_path / "a")
    with pytest.raises(tt.errors.MemmapError, match="exists"):
        spec.memmap_like(tmp_path / "a")
    bad = tt.TensorDict(
        {"ok": torch.empty(3, device="meta"), "q": torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8)}, [3]
    )
    with pytest.raises(tt.errors.MemmapError, match="'q'"):
        bad.memmap_like(tmp_path / "b")
    assert sorted(os.listdir(tmp_path)) == ["a"]


# -- a 50k-image dataset, end to end --------------------------------------------------------------

_IMAGES = 50_000
_CHUNK = 5_000

_CREATE = r"""
import json, re, sys, torch, tdtree as tt
rows, chunk, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
# this process's peak resident set (VmHWM, KiB): getrusage's ru_maxrss would carry the parent's peak
# over exec, so a large pytest process would hide the probe
peak = lambda: int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
before = peak()
spec = tt.TensorDict(
    {"image": torch.empty(rows, 3, 32, 32, dtype=torch.uint8, device="meta"),
     "label": torch.empty(rows, dtype=torch.int64, device="meta")},
    batch_size=[rows],
)
data = spec.memmap_like(prefix)
created = peak()
# the probe sees an allocation of the dataset's size: the same images built in memory
in_memory = torch.ones(rows, 3, 32, 32, dtype=torch.uint8)
built = peak()
del in_memory
for start in range(0, rows, chunk):
    ids = torch.arange(start, start + chunk)
    image = (ids % 251).to(torch.uint8).view(-1, 1, 1, 1).expand(chunk, 3, 32, 32)
    data.at[start : start + chunk].set_(tt.TensorDict({"image": image, "label": ids % 10}, batch_size=[chunk]))
print(json.dumps({"before": before, "created": created, "built": built}))
"""


def test_a_50k_image_dataset_is_preallocated_filled_in_chunks_and_loaded(tmp_path: Any) -> None:
    size = _IMAGES * 3 * 32 * 32
    prefix = str(tmp_path / "images")
    run = subprocess.run(
        [sys.executable, "-c", _CREATE, str(_IMAGES), str(_CHUNK), prefix],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    rss = json.loads(run.stdout)
    assert rss["created"] - rss["before"] < size // 10  # created without the dataset in memory
    assert rss["built"] - rss["created"] > size // 2  # ... which the probe would have seen

    data = tt.load_memmap(prefix)
    assert data.tags == {tt.Memmap, tt.Locked} and data.batch_size == (_IMAGES,)
    ids = torch.arange(_IMAGES)
    assert torch.equal(data["label"], ids % 10)
    assert torch.equal(data["image"][:, 2, 31, 31], (ids % 251).to(torch.uint8))

    plain = TensorDataset(data["image"], data["label"])  # plain torch over the same (file-backed) tensors
    batch = 10_000
    # the sampler draws the order in this process, whatever the workers: one expected list for all
    expected = list(DataLoader(plain, batch_size=batch, sampler=_sampler(plain, 0)))

    def check(ours: list[Any], expected: list[list[torch.Tensor]]) -> None:
        assert len(ours) == len(expected) == _IMAGES // batch
        for got, (image, label) in zip(ours, expected, strict=True):
            assert got.tags == frozenset()  # gathered rows: new tensors
            assert torch.equal(got["image"], image) and torch.equal(got["label"], label)

    check(list(tt.data.minibatches(data, batch, generator=torch.Generator().manual_seed(0))), expected)
    ds = data.as_dataset()
    check(list(DataLoader(ds, batch_size=batch, sampler=_sampler(ds, 0))), expected)
    check(list(DataLoader(ds, batch_size=batch, sampler=_sampler(ds, 0), num_workers=2)), expected)
