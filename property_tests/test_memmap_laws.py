"""Laws of memmap, load_memmap, save/load and pickling, over random nodes with any str keys."""

from __future__ import annotations

import os
import pickle
import tempfile

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree import Locked, Memmap, TensorDict
from tdtree._base import Node
from tdtree._maps import map_leaves
from tdtree._memmap import origin
from tdtree._pickle import reference
from tdtree._tags import retag
from tdtree.errors import MemmapError
from tdtree.testing import assert_equal, tensordicts
from tdtree.testing.laws import assert_pure

MM = frozenset({Memmap, Locked})
# tensordicts() draws integers from [-50, 50), which torch refuses for uint8: int16 leaves are
# drawn in its place and cast (keeping their strides), until the strategy draws uint8 itself.
DTYPES = (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64, torch.int16, torch.float64)


def _uint8_for_int16(node: TensorDict) -> TensorDict:
    return map_leaves(lambda t: t.to(torch.uint8) if t.dtype == torch.int16 else t, node)


NODES = tensordicts(
    names=st.text(min_size=1, max_size=20), dtypes=DTYPES, noncontiguous=True, extra_batch_dims=True
).map(_uint8_for_int16)


def leaves(node: TensorDict) -> list[torch.Tensor]:
    return list(node.values(include_nested=True, leaves_only=True))


def sub_nodes(node: TensorDict) -> list[TensorDict]:
    return [node, *(v for v in node.values(include_nested=True) if isinstance(v, Node))]


def assert_same_files(a_node: TensorDict, b_node: TensorDict) -> None:
    """Every leaf holding data is mapped from the same file in both nodes."""
    for a, b in zip(leaves(a_node), leaves(b_node), strict=True):
        if a.numel():
            assert reference(a)[1:3] == reference(b)[1:3]


@given(NODES, st.booleans())
def test_memmap_then_load_memmap_is_the_node(td, locked):
    td = td.lock() if locked else td
    with tempfile.TemporaryDirectory() as parent:
        prefix = os.path.join(parent, "mm")
        out = assert_pure(lambda n: n.memmap(prefix), td)
        assert_equal(out, retag(td, MM))
        back = tt.load_memmap(prefix)
        assert_equal(back, out)
        for node in (*sub_nodes(out), *sub_nodes(back)):
            assert node.tags == MM
        assert_same_files(out, back)
        for a in leaves(out):
            if a.numel():
                assert reference(a)[1] == prefix
        assert os.listdir(parent) == ["mm"]
        assert len(os.listdir(prefix)) == len(leaves(td)) + 1


@given(NODES)
def test_memmap_node_pickles_to_the_same_files(td):
    with tempfile.TemporaryDirectory() as parent:
        out = td.memmap(os.path.join(parent, "mm"))
        back = pickle.loads(pickle.dumps(out))
        assert_equal(back, out)
        assert all(node.tags == MM for node in sub_nodes(back))
        assert_same_files(out, back)


@given(NODES, st.sampled_from(["r+", "r", "c"]))
def test_a_pickled_memmap_node_is_itself_or_refused(td, mode):
    with tempfile.TemporaryDirectory() as parent:
        prefix = os.path.join(parent, "mm")
        td.memmap(prefix)
        node = tt.load_memmap(prefix, mode=mode)
        blob = pickle.dumps(node)
        back = pickle.loads(blob)
        mapped = any(leaf.untyped_storage().nbytes() for leaf in leaves(node))
        if mode == "c" and mapped:  # by value, as its clone: new storage, no tag
            assert_equal(back, node.unlock().clone())
            assert all(n.tags == frozenset() for n in sub_nodes(back))
        else:
            assert_equal(back, node)
            assert all(n.tags == MM for n in sub_nodes(back))
            for a, b in zip(leaves(node), leaves(back), strict=True):
                assert b.numel() == 0 or origin(a) == origin(b)  # same files, same mode
        td.memmap(prefix, existsok=True)  # the same values, written again by another writer
        if mode != "c" and mapped:
            with pytest.raises(MemmapError, match="another writer replaced it"):
                pickle.loads(blob)
        else:  # nothing is mapped again
            assert_equal(pickle.loads(blob), back)


@given(NODES, st.booleans())
def test_load_of_save_is_the_node(td, locked):
    td = td.lock() if locked else td
    with tempfile.TemporaryDirectory() as parent:
        path = os.path.join(parent, "td.pt")
        assert_pure(lambda n: tt.save(n, path), td)
        back = tt.load(path)
        assert_equal(back, td)
        assert os.listdir(parent) == ["td.pt"]
    for a, b in zip(leaves(td), leaves(back), strict=True):
        assert b.numel() == 0 or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


@given(NODES, st.booleans())
def test_pickle_keeps_values_and_tags(td, locked):
    td = td.lock() if locked else td
    back = pickle.loads(pickle.dumps(td))
    assert_equal(back, td)
