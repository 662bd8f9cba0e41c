"""Laws of the node and its key operations, over random nodes."""

from __future__ import annotations

import functools

import torch
import torch.utils._pytree as torch_pytree
from hypothesis import assume, given
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import assert_equal, nested_keys, tensordicts
from tdtree.testing.laws import assert_tags

from ._snapshot import assert_unchanged, snapshot


@given(tensordicts(extra_batch_dims=True, noncontiguous=True))
def test_pytree_round_trips(td: tt.TensorDict) -> None:
    leaves, spec = tt.tree.flatten(td)
    assert_equal(tt.tree.unflatten(spec, leaves), td)
    tleaves, tspec = torch_pytree.tree_flatten(td)
    assert_equal(torch_pytree.tree_unflatten(tleaves, tspec), td)
    assert all(a is b for a, b in zip(leaves, tleaves))


@given(st.data(), tensordicts(extra_batch_dims=True, min_keys=1))
def test_select_and_exclude_partition_the_node(data: st.DataObject, td: tt.TensorDict) -> None:
    keys = data.draw(st.lists(st.sampled_from(list(td.keys(include_nested=True))), max_size=4))
    before = snapshot(td)
    selected, excluded = td.select(*keys), td.exclude(*keys)
    assert_equal(excluded.update(selected), td)
    for key in keys:
        assert selected[key] is td[key] and key not in excluded
    assert_unchanged(td, before)


@given(tensordicts(extra_batch_dims=False))
def test_unflatten_inverts_flatten(td: tt.TensorDict) -> None:
    before = snapshot(td)
    flat = td.flatten_keys()
    assert all(not isinstance(v, tt.TensorDict) or len(v) == 0 for v in flat.values())
    assert_equal(flat.unflatten_keys(), td)
    assert_equal(td.flatten_keys("/").unflatten_keys("/"), td)
    assert_unchanged(td, before)


@given(st.data(), tensordicts(max_depth=1), nested_keys(max_depth=2))
def test_set_then_get_is_the_value(data: st.DataObject, td: tt.TensorDict, key: tuple | str) -> None:
    path = (key,) if isinstance(key, str) else key
    for depth in range(1, len(path)):
        assume(not isinstance(td.get(path[:depth], None), torch.Tensor))
    feature = data.draw(st.lists(st.integers(0, 3), max_size=2))
    value = torch.zeros((*td.batch_size, *feature))
    before = snapshot(td)
    out = td.set(key, value)
    assert out.get(key) is value
    for other in td.keys(include_nested=True, leaves_only=True):
        other_path = (other,) if isinstance(other, str) else other
        if other_path[: len(path)] != path:
            assert out[other] is td[other]
    assert_unchanged(td, before)


def _prefix_is_leaf(td: tt.TensorDict, key: tuple | str) -> bool:
    path = (key,) if isinstance(key, str) else key
    return any(isinstance(td.get(path[:d], None), torch.Tensor) for d in range(1, len(path)))


@given(tensordicts(batch_size=(2,), max_depth=2), tensordicts(batch_size=(2,), max_depth=2))
def test_update_is_a_sequence_of_set(td: tt.TensorDict, other: tt.TensorDict) -> None:
    leaf_items = list(other.items(include_nested=True, leaves_only=True))
    assume(all(len(v) for v in other.values(include_nested=True) if isinstance(v, tt.TensorDict)))
    assume(not any(_prefix_is_leaf(td, k) for k, _ in leaf_items))
    before = snapshot(td)
    expected = functools.reduce(lambda acc, kv: acc.set(*kv), leaf_items, td)
    assert_equal(td.update(other), expected)
    assert_unchanged(td, before)


@given(tensordicts(extra_batch_dims=False))
def test_from_dict_inverts_to_dict(td: tt.TensorDict) -> None:
    before = snapshot(td)
    assert_equal(tt.TensorDict.from_dict(td.to_dict(), batch_size=td.batch_size), td)
    auto = tt.TensorDict.from_dict(td.to_dict())
    assert auto.batch_size[: td.ndim] == td.batch_size or not len(td.keys(True, True))
    assert_unchanged(td, before)


@given(tensordicts(noncontiguous=True))
def test_clone_copies_values_not_storage(td: tt.TensorDict) -> None:
    before = snapshot(td)
    out = td.clone()
    assert_equal(out, td)
    for a, b in zip(tt.tree.leaves(out), tt.tree.leaves(td)):
        assert a is not b
        if b.untyped_storage().nbytes():
            assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert_unchanged(td, before)


@given(st.data(), tensordicts(min_keys=1, extra_batch_dims=True))
def test_rename_moves_values(data: st.DataObject, td: tt.TensorDict) -> None:
    old = data.draw(st.sampled_from(list(td.keys(include_nested=True))))
    before = snapshot(td)
    out = td.rename({old: "zz_renamed"})
    assert out["zz_renamed"] is td[old] and old not in out
    assert_unchanged(td, before)


@given(tensordicts(extra_batch_dims=True))
def test_lock_keeps_leaves_and_changes_only_the_type(td: tt.TensorDict) -> None:
    locked = td.lock()
    assert all(a is b for a, b in zip(tt.tree.leaves(locked), tt.tree.leaves(td)))
    assert all(type(v) is tt.TensorDict[tt.Locked] for v in locked.values(True) if isinstance(v, tt.TensorDict))
    assert_equal(locked.unlock(), td)
    assert type(locked.select(*locked.keys())) is tt.TensorDict[tt.Locked]


def _identical(node: object, plain: object, where: tuple = ()) -> None:
    """``node`` (nested plain dicts of a result's ``to_dict()``) holds exactly ``plain``'s keys and the same
    tensor objects."""
    if isinstance(plain, dict):
        assert isinstance(node, dict) and list(node) == sorted(plain), where
        for k, v in plain.items():
            _identical(node[k], v, (*where, k))
    else:
        assert node is plain, where


def _plain_select(d: dict, path: tuple) -> dict:
    return {path[0]: d[path[0]] if len(path) == 1 else _plain_select(d[path[0]], path[1:])}


def _plain_exclude(d: dict, path: tuple) -> dict:
    out = {**d}
    if len(path) == 1:
        del out[path[0]]
    else:
        out[path[0]] = _plain_exclude(d[path[0]], path[1:])
    return out


@given(st.data(), tensordicts(extra_batch_dims=True, min_keys=1, max_depth=3, tags=True))
def test_select_and_exclude_of_one_key_are_the_plain_dicts(data: st.DataObject, td: tt.TensorDict) -> None:
    # one key takes a path of its own (no trie): the same entries as plain nested dicts, each node on
    # the key's path with the batch size of the node it copies, and the rule's tags
    key = data.draw(st.sampled_from(list(td.keys(include_nested=True))))
    path = (key,) if isinstance(key, str) else key
    before = snapshot(td)
    selected = assert_tags(lambda n: n.select(key), td)
    excluded = assert_tags(lambda n: n.exclude(key), td)
    _identical(selected.to_dict(), _plain_select(td.to_dict(), path))
    _identical(excluded.to_dict(), _plain_exclude(td.to_dict(), path))
    for depth in range(1, len(path)):
        size = td.get(path[:depth]).batch_size
        assert selected.get(path[:depth]).batch_size == size == excluded.get(path[:depth]).batch_size
    assert selected.batch_size == excluded.batch_size == td.batch_size
    assert selected.tags == excluded.tags == td.tags  # no data made: the rule keeps them
    assert_unchanged(td, before)


@given(st.data(), tensordicts(max_depth=2), st.booleans(), st.booleans())
def test_membership_is_being_among_the_listed_keys(
    data: st.DataObject, td: tt.TensorDict, nested: bool, leaves: bool
) -> None:
    view = td.keys(include_nested=nested, leaves_only=leaves)
    listed = list(view)
    known = [k if isinstance(k, tuple) else (k,) for k in td.keys(include_nested=True)]
    parts = sorted({p for k in known for p in k} | {"zz"})
    drawn = data.draw(st.lists(st.sampled_from(parts), min_size=1, max_size=3).map(tuple))
    for key in [*listed, *known, drawn, drawn[0]]:
        # ("a",) spells "a" for the nested views; the plain view is the node's dict view of str keys
        spelled = key[0] if isinstance(key, tuple) and len(key) == 1 and (nested or leaves) else key
        assert (key in view) == (spelled in listed), key
