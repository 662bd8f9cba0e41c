"""Laws of the conversions to and from tensordict and named tuples, over random nodes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import assert_equal, tensordicts

from ._snapshot import assert_unchanged, holds_data, snapshot

try:
    import tensordict
except ImportError:
    tensordict = None

needs_tensordict = pytest.mark.skipif(tensordict is None, reason="tensordict is not installed: pip install tensordict")

# The ways a node gets tags, each paired with the tags it must have.
TAGGINGS = {
    "none": (lambda td: td, frozenset()),
    "lock": (lambda td: td.lock(), frozenset({tt.Locked})),
    "share_memory": (lambda td: td.share_memory(), frozenset({tt.Shared, tt.Locked})),
    "share_memory_unlocked": (lambda td: td.share_memory().unlock(), frozenset({tt.Shared})),
}


@needs_tensordict
@given(tensordicts(extra_batch_dims=True, noncontiguous=True), st.sampled_from(sorted(TAGGINGS)))
def test_from_tensordict_inverts_to_tensordict(td: tt.TensorDict, tagging: str) -> None:
    make, tags = TAGGINGS[tagging]
    node = make(td)
    assert node.tags == tags
    before = snapshot(node)
    back = tt.from_tensordict(tt.to_tensordict(node))
    # With no data nothing can be checked by storage, and tensordict keeps its
    # shared flag only while locked: an unlocked data-less node comes back untagged.
    expected = node if holds_data(node) or node.is_locked else tt.TensorDict(node, node.batch_size, node.device)
    assert_equal(back, expected)
    assert all(a is b for a, b in zip(tt.tree.leaves(back), tt.tree.leaves(node), strict=True))
    assert_unchanged(node, before)


def _same(a: Any, b: Any) -> None:
    assert set(a.keys()) == set(b.keys()) and a.batch_size == b.batch_size and a.device == b.device
    for key in a.keys():
        x, y = a.get(key), b.get(key)
        if isinstance(x, tensordict.TensorDict):
            _same(x, y)
        else:
            assert x is y


def _tensordict_like(node: tt.TensorDict) -> Any:
    data = {k: _tensordict_like(v) if isinstance(v, tt.TensorDict) else v for k, v in node.items()}
    return tensordict.TensorDict(data, batch_size=node.batch_size, device=node.device)


@needs_tensordict
@given(tensordicts(extra_batch_dims=True, noncontiguous=True), st.booleans())
def test_to_tensordict_inverts_from_tensordict(node: tt.TensorDict, lock: bool) -> None:
    td = _tensordict_like(node)
    if lock:
        td.lock_()
    back = tt.to_tensordict(tt.from_tensordict(td))
    _same(back, td)
    assert back.is_locked == lock


@given(tensordicts(extra_batch_dims=False))
def test_from_namedtuple_inverts_to_namedtuple(td: tt.TensorDict) -> None:
    before = snapshot(td)
    record = td.to_namedtuple()
    back = tt.TensorDict.from_namedtuple(record, batch_size=td.batch_size)
    assert_equal(back, td)
    assert all(a is b for a, b in zip(tt.tree.leaves(back), tt.tree.leaves(td), strict=True))
    assert_unchanged(td, before)
