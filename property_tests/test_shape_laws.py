"""Laws of the batch shape operations: torch's op leaf by leaf, input unchanged (the purity law), views
share storage, tags (the tag law: the rule computed from storages, on locked and on every tagged draw)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import batch_sizes, check_tags, tensordicts
from tdtree.testing.laws import assert_pure, assert_tags

NODES = tensordicts(batch_sizes(min_dims=1, max_dims=3), extra_batch_dims=True, noncontiguous=True)
CONTIGUOUS = tensordicts(batch_sizes(min_dims=1, max_dims=3), extra_batch_dims=True)


def storages(td):
    return {leaf.untyped_storage().data_ptr() for leaf in tt.tree.leaves(td) if leaf.untyped_storage().nbytes()}


def shares(out, td):
    return storages(out) <= storages(td)


def check_leafwise(td, out, batch_op, leaf_op):
    """``out`` has torch's batch size and ``leaf_op(leaf, n)`` for every leaf, sub-nodes keeping extra dims."""
    want = batch_op(torch.empty(td.batch_size))
    assert out.batch_size == want.shape
    n = td.ndim
    for key, leaf in td.items(include_nested=True):
        got = out[key]
        if isinstance(leaf, tt.TensorDict):
            assert got.batch_size == (*want.shape, *leaf.batch_size[n:])
        else:
            expected = leaf_op(leaf, n)
            assert got.shape == expected.shape and got.dtype == expected.dtype
            assert torch.equal(got, expected)


def check_all(td, op, batch_op, leaf_op, view=True):
    out = assert_pure(op, td)  # the batch size is part of the structure the law compares
    check_leafwise(td, out, batch_op, leaf_op)
    locked_out = assert_tags(op, td.lock())  # Locked exactly when every leaf with data reuses a storage
    if view:
        assert shares(out, td)
        assert type(locked_out) is tt.TensorDict[tt.Locked]


@given(CONTIGUOUS, st.data())
def test_view(td, data):
    shape = data.draw(st.permutations(list(td.batch_size)))
    if td.numel():
        shape[data.draw(st.integers(0, len(shape) - 1))] = -1
    sized = torch.empty(td.batch_size).view(*shape).shape
    check_all(td, lambda t: t.view(*shape), lambda b: b.view(*shape), lambda x, n: x.view(*sized, *x.shape[n:]))


@given(NODES, st.data())
def test_reshape(td, data):
    shape = data.draw(st.sampled_from([(-1,), (td.numel(),), tuple(reversed(td.batch_size)), (1, *td.batch_size)]))
    sized = torch.empty(td.batch_size).reshape(shape).shape
    check_all(
        td,
        lambda t: t.reshape(shape),
        lambda b: b.reshape(shape),
        lambda x, n: x.reshape(*sized, *x.shape[n:]),
        view=False,
    )


def test_reshape_locked_both_ways():
    td = tt.TensorDict({"a": torch.randn(2, 3, 4)}, [2, 3]).lock()
    assert type(td.reshape(6)) is tt.TensorDict[tt.Locked]
    assert type(td.transpose(0, 1).reshape(6)) is tt.TensorDict


@given(NODES, st.data())
def test_permute(td, data):
    order = data.draw(st.permutations(range(td.ndim)))
    check_all(
        td, lambda t: t.permute(*order), lambda b: b.permute(*order), lambda x, n: x.permute(*order, *range(n, x.dim()))
    )


@given(NODES, st.data())
def test_transpose(td, data):
    d0, d1 = data.draw(st.tuples(st.integers(-td.ndim, td.ndim - 1), st.integers(-td.ndim, td.ndim - 1)))
    check_all(
        td,
        lambda t: t.transpose(d0, d1),
        lambda b: b.transpose(d0, d1),
        lambda x, n: x.transpose(d0 % n, d1 % n),
    )


@given(NODES, st.data())
def test_squeeze_unsqueeze(td, data):
    d = data.draw(st.integers(-td.ndim - 1, td.ndim))
    check_all(td, lambda t: t.unsqueeze(d), lambda b: b.unsqueeze(d), lambda x, n: x.unsqueeze(d % (n + 1)))
    s = data.draw(st.integers(-td.ndim, td.ndim - 1))
    check_all(td, lambda t: t.squeeze(s), lambda b: b.squeeze(s), lambda x, n: x.squeeze(s % n))
    ones = tuple(i for i, size in enumerate(td.batch_size) if size == 1)
    check_all(td, lambda t: t.squeeze(), lambda b: b.squeeze(), lambda x, n: x.squeeze(ones))


@given(NODES, st.data())
def test_flatten_unflatten(td, data):
    s = data.draw(st.integers(0, td.ndim - 1))
    e = data.draw(st.integers(s, td.ndim - 1))
    check_all(td, lambda t: t.flatten(s, e), lambda b: b.flatten(s, e), lambda x, n: x.flatten(s, e), view=False)
    d = data.draw(st.integers(0, td.ndim - 1))
    sizes = (1, td.batch_size[d]) if data.draw(st.booleans()) else (td.batch_size[d], 1)
    check_all(td, lambda t: t.unflatten(d, sizes), lambda b: b.unflatten(d, sizes), lambda x, n: x.unflatten(d, sizes))


@given(NODES, st.data())
def test_expand(td, data):
    lead = data.draw(st.lists(st.integers(0, 3), max_size=2))
    grown = [data.draw(st.integers(1, 3)) if size == 1 else size for size in td.batch_size]
    shape = (*lead, *grown)
    check_all(td, lambda t: t.expand(*shape), lambda b: b.expand(*shape), lambda x, n: x.expand(*shape, *x.shape[n:]))


def check_pieces(td, pieces, d, count, join):
    """``pieces`` cut ``td`` along batch dim ``d``: ``join`` of their leaves gives every input leaf back."""
    assert len(pieces) == count
    n = td.ndim
    for p in pieces:
        assert type(p) is tt.TensorDict and shares(p, td)
    if not pieces:
        return
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        assert torch.equal(join([p[key] for p in pieces], d), leaf)
    for key, sub in td.items(include_nested=True):
        if isinstance(sub, tt.TensorDict):
            for p in pieces:
                assert p[key].batch_size[p.ndim :] == sub.batch_size[n:]


@given(NODES, st.data())
def test_unbind_stack_identity(td, data):
    d = data.draw(st.integers(-td.ndim, td.ndim - 1))
    batch = td.batch_size
    pieces = assert_pure(lambda n: n.unbind(d), td)
    check_pieces(td, pieces, d % td.ndim, batch[d], torch.stack)
    for i, p in enumerate(pieces):
        assert p.batch_size == torch.empty(batch).select(d, i).shape
    for p in assert_tags(lambda n: n.unbind(d), td.lock()):
        assert type(p) is tt.TensorDict[tt.Locked]


@given(NODES, st.data())
def test_split_cat_identity(td, data):
    d = data.draw(st.integers(-td.ndim, td.ndim - 1))
    length = td.batch_size[d]
    size = data.draw(st.integers(1, 4)) if length else 1
    batch = td.batch_size
    pieces = assert_pure(lambda n: n.split(size, d), td)
    reference = torch.empty(batch).split(size, d)
    check_pieces(td, pieces, d % td.ndim, len(reference), torch.cat)
    assert [p.batch_size for p in pieces] == [r.shape for r in reference]
    for p in assert_tags(lambda n: n.split(size, d), td.lock()):
        assert type(p) is tt.TensorDict[tt.Locked]


@given(NODES, st.data())
def test_chunk_cat_identity(td, data):
    d = data.draw(st.integers(-td.ndim, td.ndim - 1))
    chunks = data.draw(st.integers(1, 5))
    pieces = td.chunk(chunks, d)
    reference = torch.empty(td.batch_size).chunk(chunks, d)
    check_pieces(td, pieces, d % td.ndim, len(reference), torch.cat)
    assert [p.batch_size for p in pieces] == [r.shape for r in reference]
    assert math.prod(td.batch_size) == sum(p.numel() for p in pieces)


SHAPE_OPS = {
    "unsqueeze": lambda n: n.unsqueeze(0),
    "flatten": lambda n: n.flatten(),
    "reshape": lambda n: n.reshape(-1),
    "transpose": lambda n: n.transpose(0, -1) if n.ndim else n,
    "unbind": lambda n: n.unbind(0) if n.ndim else n,
    "expand": lambda n: n.expand(2, *n.batch_size),
    "contiguous": lambda n: n.contiguous(),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_tags_of_every_tag_set_follow_the_rule(name):
    """The tag law over every reachable tag set and aliased, non-contiguous leaves."""
    nodes = tensordicts(tags=True, aliasing=True, noncontiguous=True, extra_batch_dims=True)
    check_tags(SHAPE_OPS[name], nodes, settings=settings(max_examples=10))
