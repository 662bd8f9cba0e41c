"""Laws of ``tdtree.data.minibatches`` and ``td.as_dataset()``: each batch is the plain computation over each
leaf (the rows of a ``torch.randperm`` of the same generator, or consecutive rows), the input is unchanged, a
DataLoader over the dataset view gives the same batches, and tags follow the storage rule."""

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, RandomSampler

import tdtree as tt
from tdtree.testing import assert_equal, batch_sizes, tensordicts

from ._snapshot import assert_drops_tags, assert_unchanged, snapshot

NODES = tensordicts(batch_sizes(min_dims=1, max_dims=2), extra_batch_dims=True, noncontiguous=True)


def _expected(td, order, size, drop_last):
    """The batches computed leaf by leaf over a plain dict of the node's leaves."""
    leaves = dict(td.items(include_nested=True, leaves_only=True))
    stop = len(order) - len(order) % size if drop_last else len(order)
    return [{k: v[order[i : i + size]] for k, v in leaves.items()} for i in range(0, stop, size)]


def _same(batch, expected):
    got = dict(batch.items(include_nested=True, leaves_only=True))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert_equal(got[key], value)


@given(NODES, st.integers(1, 5), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_minibatches_are_the_rows_of_each_leaf(td, size, shuffle, drop_last, seed):
    locked = td.lock()
    snap = snapshot(locked)
    rows = td.batch_size[0]
    batches = tt.data.minibatches(locked, size, shuffle, torch.Generator().manual_seed(seed), drop_last)
    got = list(batches)
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(rows)
    expected = _expected(td, order, size, drop_last)
    assert len(got) == len(expected) == len(batches)
    for batch, exp in zip(got, expected, strict=True):
        _same(batch, exp)
        if shuffle:
            assert_drops_tags(batch)  # gathered: new storage
        else:
            assert batch.tags == {tt.Locked}  # a slice: a view
    assert_unchanged(locked, snap)


@given(NODES, st.integers(1, 5), st.integers(0, 2**31))
def test_a_dataloader_over_the_dataset_view_gives_the_minibatches(td, size, seed):
    rows = td.batch_size[0]
    snap = snapshot(td)
    ds = td.as_dataset()
    assert len(ds) == rows and len(td) == len(list(td.keys()))
    mini = list(tt.data.minibatches(td, size, generator=torch.Generator().manual_seed(seed)))
    if rows:  # RandomSampler refuses an empty dataset
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
        loaded = list(DataLoader(ds, batch_size=size, sampler=sampler))
        assert len(loaded) == len(mini)
        for a, b in zip(loaded, mini, strict=True):
            assert_equal(a, b)
    assert_unchanged(td, snap)
