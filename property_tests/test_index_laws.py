"""Laws of indexing over the batch dims and of the scatter td.at[idx].set / set_."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import batch_sizes, tensordicts

from ._snapshot import assert_unchanged, snapshot

NODES = tensordicts(batch_sizes(min_dims=1, max_dims=3), extra_batch_dims=True, noncontiguous=True)


def _item(draw, kind, size, length):
    if kind == "none":
        return None
    if kind == "slice" or size == 0:
        bound = st.none() | st.integers(-5, 5)
        return slice(draw(bound), draw(bound), draw(st.none() | st.integers(1, 3)))
    if kind == "int":
        return draw(st.integers(-size, size - 1))
    values = draw(st.lists(st.integers(-size, size - 1), min_size=length, max_size=length))
    if kind == "list":
        return values
    shape = draw(st.sampled_from([(), (len(values),), (1, len(values))]))
    return torch.tensor(values[0]) if shape == () else torch.tensor(values).reshape(shape)


@st.composite
def indices(draw, batch):
    """An index over ``batch``: an optional leading mask, then ints, slices, None, lists, long tensors, one ``...``."""
    n = len(batch)
    head = []
    start = 0
    if n and draw(st.integers(0, 5)) == 0:
        start = draw(st.integers(1, n))
        gen = torch.Generator().manual_seed(draw(st.integers(0, 1000)))
        head.append(torch.rand(tuple(batch[:start]), generator=gen) > 0.5)
    kinds = []
    free = n - start
    for _ in range(draw(st.integers(0, n + 1))):
        allowed = ["none", "slice", "int"] + ([] if head else ["list", "tensor"])  # index tensors must broadcast
        kind = draw(st.sampled_from(allowed if free else ["none"]))
        free -= kind != "none"
        kinds.append(kind)
    length = draw(st.integers(1, 3))
    at = draw(st.none() | st.integers(0, len(kinds)))
    after = sum(k != "none" for k in kinds[at:]) if at is not None else 0
    items = []
    dim = start
    for i, kind in enumerate(kinds):
        if i == at:
            items.append(Ellipsis)
            dim = n - after
        items.append(_item(draw, kind, batch[dim] if kind != "none" else 0, length))
        dim += kind != "none"
    if at == len(kinds):
        items.append(Ellipsis)
    items = head + items
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


def leaf_index(index, leaf, n):
    """The index of a leaf: ``index`` followed by full slices over the leaf's dims past the batch dims."""
    parts = index if isinstance(index, tuple) else (index,)
    return (*parts, *(slice(None),) * (leaf.dim() - n))


def storages(td):
    return {x.untyped_storage().data_ptr() for x in tt.tree.leaves(td) if x.untyped_storage().nbytes()}


def basic(index):
    """True when torch indexes a tensor with ``index`` by views: ints, slices, None, ``...``, and 0-dim
    integer tensors (torch reads those as ints)."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(
        p is None
        or p is Ellipsis
        or type(p) in (int, slice)
        or (isinstance(p, torch.Tensor) and p.dim() == 0 and not p.is_floating_point() and p.dtype != torch.bool)
        for p in parts
    )


@given(NODES, st.data())
def test_index_agrees_with_each_leaf(td, data):
    index = data.draw(indices(td.batch_size))
    snap = snapshot(td)
    out = td[index]
    assert out.batch_size == torch.empty(td.batch_size)[index].shape
    n = td.ndim
    for key, value in td.items(include_nested=True):
        if isinstance(value, tt.TensorDict):
            assert out[key].batch_size == (*out.batch_size, *value.batch_size[n:])
        else:
            expected = value[leaf_index(index, value, n)]
            assert out[key].shape == expected.shape and torch.equal(out[key], expected)
    assert_unchanged(td, snap)
    locked = td.lock()[index]
    assert (tt.Locked in locked.tags) == (storages(locked) <= storages(td))
    if basic(index):
        assert type(locked) is tt.TensorDict[tt.Locked] and storages(out) <= storages(td)
    elif storages(out):
        assert type(locked) is tt.TensorDict


def bump(x):
    return ~x if x.dtype == torch.bool else x + 1


@given(NODES, st.data())
def test_at_set_is_clone_then_write(td, data):
    index = data.draw(indices(td.batch_size))
    value = tt.tree.map(bump, td[index])
    snap = snapshot(td)
    out = td.at[index].set(value)
    assert_unchanged(td, snap)
    n = td.ndim
    assert out.batch_size == td.batch_size
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        expected = leaf.clone()
        expected[leaf_index(index, leaf, n)] = value[key]
        assert torch.equal(out[key], expected)
        assert out[key].untyped_storage().data_ptr() != leaf.untyped_storage().data_ptr() or not leaf.numel()


@given(NODES, st.data())
def test_at_set_inplace_writes_each_leaf(td, data):
    index = data.draw(indices(td.batch_size))
    value = tt.tree.map(bump, td[index])
    expected = {}
    n = td.ndim
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        e = leaf.clone()
        e[leaf_index(index, leaf, n)] = value[key]
        expected[key] = e
    locked = td.lock()
    objects = tt.tree.leaves(td)
    assert locked.at[index].set_(value) is locked
    assert all(a is b for a, b in zip(tt.tree.leaves(td), objects))
    for key, e in expected.items():
        assert torch.equal(td[key], e)


@given(NODES, st.data())
def test_at_set_scalar(td, data):
    index = data.draw(indices(td.batch_size))
    out = td.at[index].set(True)
    n = td.ndim
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        expected = leaf.clone()
        expected[leaf_index(index, leaf, n)] = True
        assert torch.equal(out[key], expected)
