"""Laws for stack, cat, the *_like functions, to(), contiguous() and nbytes.

Inputs stay unchanged; results equal torch's op leaf by leaf; stack and cat
drop ``Locked`` (new storage), while ``to`` the same device or dtype and
``contiguous`` of a contiguous node reuse every storage and keep it.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import example, given
from hypothesis import strategies as st

import tdtree as tt
from tdtree import Locked, TensorDict
from tdtree._tags import storage_key
from tdtree.testing import assert_equal, batch_sizes, tensordicts

from ._snapshot import assert_drops_tags, assert_shares_storage, assert_unchanged, snapshot

nodes = tensordicts(extra_batch_dims=True, noncontiguous=True)


@given(st.data(), nodes, st.integers(1, 3))
def test_stack_is_torch_stack_leaf_by_leaf(data, td, count):
    n = td.ndim
    dim = data.draw(st.integers(-n - 1, n))
    others = [td.apply(lambda x, i=i: x * 0 + i) for i in range(count - 1)]
    befores = [snapshot(x) for x in (td, *others)]
    out = tt.stack([td, *others], dim)
    for x, before in zip((td, *others), befores):
        assert_unchanged(x, before)
    d = dim % (n + 1)
    assert out.batch_size == torch.Size((*td.batch_size[:d], count, *td.batch_size[d:]))
    columns = [tt.tree.leaves(x) for x in (td, *others)]
    for got, group in zip(tt.tree.leaves(out), zip(*columns), strict=True):
        assert_equal(got, torch.stack(group, d))
    for sub_out, sub_in in zip(out.values(include_nested=True), td.values(include_nested=True)):
        if isinstance(sub_in, TensorDict):
            assert sub_out.batch_size == out.batch_size + sub_in.batch_size[n:]
    assert_drops_tags(tt.stack([td.lock(), *(o.lock() for o in others)], dim))
    assert_equal(torch.stack([td, *others], dim), out)


@given(st.data(), tensordicts(batch_sizes(min_dims=1), extra_batch_dims=True, noncontiguous=True))
def test_cat_is_torch_cat_leaf_by_leaf(data, td):
    n = td.ndim
    dim = data.draw(st.integers(-n, n - 1))
    d = dim % n
    grown = torch.Size((*td.batch_size[:d], 2 * td.batch_size[d], *td.batch_size[d + 1 :]))
    other = td.apply(lambda x: torch.cat([x, x], d), batch_size=grown)
    before, before_other = snapshot(td), snapshot(other)
    out = tt.cat([td, other], dim)
    assert_unchanged(td, before)
    assert_unchanged(other, before_other)
    assert out.batch_size[d] == 3 * td.batch_size[d]
    for got, x, y in zip(tt.tree.leaves(out), tt.tree.leaves(td), tt.tree.leaves(other), strict=True):
        assert_equal(got, torch.cat([x, y], d))
    assert_drops_tags(tt.cat([td.lock(), other.lock()], dim))
    assert_equal(torch.cat([td, other], dim), out)


LIKE = {"zeros_like": (), "ones_like": (), "full_like": (3,)}


@given(nodes, st.sampled_from(sorted(LIKE)))
def test_like_functions(td, name):
    fn = getattr(torch, name)
    before = snapshot(td)
    out = fn(td, *LIKE[name])
    assert_unchanged(td, before)
    assert_equal(out, tt.tree.map(lambda x: fn(x, *LIKE[name]), td))
    assert_drops_tags(fn(td.lock(), *LIKE[name]))


@given(nodes, st.sampled_from([torch.float64, torch.int32, torch.bool]))
# found by the random profile: the one leaf converted is empty, so its new storage holds no bytes and
# does not decide; the other leaf is returned as it is, and Locked stays
@example(TensorDict({"a": torch.zeros(0), "b": torch.tensor(True)}), torch.bool)
def test_to_dtype(td, dtype):
    before = snapshot(td)
    out = td.to(dtype)
    assert_unchanged(td, before)
    assert_equal(out, tt.tree.map(lambda x: x.to(dtype), td))
    locked = td.lock().to(dtype)
    if all(x.dtype == dtype for x in tt.tree.leaves(td)):
        assert locked.tags == frozenset({Locked})
        assert_shares_storage(locked, td)
    elif all(x.numel() == 0 for x in tt.tree.leaves(td) if x.dtype != dtype):
        # the converted leaves are empty: new storages without bytes, which never decide
        assert locked.tags == frozenset({Locked})
    else:
        assert_drops_tags(locked)


@given(nodes)
def test_to_same_device_reuses_storage_and_keeps_tags(td):
    before = snapshot(td)
    out = td.lock().to("cpu")
    assert_unchanged(td, before)
    assert_shares_storage(out, td)
    assert out.tags == frozenset({Locked})
    assert all(x.device == torch.device("cpu") for x in out.values(include_nested=True) if isinstance(x, TensorDict))
    assert out.device == torch.device("cpu")


@given(nodes)
def test_contiguous(td):
    before = snapshot(td)
    out = td.contiguous()
    assert_unchanged(td, before)
    assert_equal(out, tt.tree.map(torch.Tensor.contiguous, td))
    assert all(x.is_contiguous() for x in tt.tree.leaves(out))
    locked = out.lock().contiguous()
    assert locked.tags == frozenset({Locked})
    assert_shares_storage(locked, out)
    rebuilt = td.lock().contiguous()
    if all(x.is_contiguous() for x in tt.tree.leaves(td)):
        assert rebuilt.tags == frozenset({Locked})
    else:
        copied = [x for x in tt.tree.leaves(td) if not x.is_contiguous() and storage_key(x) is not None]
        assert rebuilt.tags == (frozenset() if copied else frozenset({Locked}))


@given(nodes)
def test_nbytes_counts_each_storage_once(td):
    leaves: list[Any] = tt.tree.leaves(td)
    assert td.nbytes == sum(x.untyped_storage().nbytes() for x in leaves)
    twice = TensorDict({"x": td, "y": td}, td.batch_size)
    assert twice.nbytes == td.nbytes
    assert (td + 1).nbytes == sum(x.untyped_storage().nbytes() for x in tt.tree.leaves(td + 1))
