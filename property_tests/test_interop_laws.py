"""Laws of the conversions to and from tensordict and named tuples, over random nodes."""

from __future__ import annotations

import keyword

import pytest
import torch
from _tensordict_side import assert_same_tensordict, needs_tensordict, tensordict_like
from hypothesis import example, given
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import assert_equal, tensordicts
from tdtree.testing.laws import assert_pure

from ._snapshot import holds_data

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
    back = assert_pure(lambda n: tt.from_tensordict(tt.to_tensordict(n)), node)
    # With no data nothing can be checked by storage, and tensordict keeps its
    # shared flag only while locked: an unlocked data-less node comes back untagged.
    expected = node if holds_data(node) or node.is_locked else tt.TensorDict(node, node.batch_size, node.device)
    assert_equal(back, expected)
    assert all(a is b for a, b in zip(tt.tree.leaves(back), tt.tree.leaves(node), strict=True))


@needs_tensordict
@given(tensordicts(extra_batch_dims=True, noncontiguous=True), st.booleans())
def test_to_tensordict_inverts_from_tensordict(node: tt.TensorDict, lock: bool) -> None:
    td = tensordict_like(node)
    if lock:
        td.lock_()
    back = tt.to_tensordict(tt.from_tensordict(td))
    assert_same_tensordict(back, td)
    assert back.is_locked == lock


def _field_names(td: tt.TensorDict) -> bool:
    """Every key part is a named-tuple field name: an identifier, not a keyword, not starting with '_'."""
    parts = {part for key in td.keys(True) for part in ((key,) if isinstance(key, str) else key)}
    return all(p.isidentifier() and not keyword.iskeyword(p) and not p.startswith("_") for p in parts)


@given(tensordicts(extra_batch_dims=False))
# found by the random profile: a key that is a keyword
@example(tt.TensorDict({"def": torch.zeros(())}))
def test_from_namedtuple_inverts_to_namedtuple(td: tt.TensorDict) -> None:
    if not _field_names(td):
        with pytest.raises(ValueError, match="cannot be a named-tuple field"):
            td.to_namedtuple()
        return
    record = assert_pure(lambda n: n.to_namedtuple(), td)
    back = tt.TensorDict.from_namedtuple(record, batch_size=td.batch_size)
    assert_equal(back, td)
    assert all(a is b for a, b in zip(tt.tree.leaves(back), tt.tree.leaves(td), strict=True))
