"""Laws of the tag engine itself: tag_rule's decision and retag, over random trees with mixed tags.

The decision is checked against the rule as DESIGN.md states it, computed here
from ``untyped_storage().data_ptr()``: a result keeps the common tags of its
node inputs exactly when every leaf of it that holds data uses a storage one
of the inputs used. Results mix the inputs' own leaf objects, views of them,
fresh copies and fresh zero-byte tensors, and their sub-nodes carry any tags.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree._base import Node, with_meta
from tdtree._tags import retag, tag_rule, tagged_type
from tdtree.testing import tensordicts

from ._snapshot import assert_unchanged, snapshot

TAG_SETS = st.sets(st.sampled_from([tt.Locked, tt.Shared, tt.Memmap])).map(frozenset)
NODES = tensordicts(noncontiguous=True, extra_batch_dims=True)

# What a result leaf is, made from an input leaf.
LEAF_MAKERS = {
    "same": lambda t: t,
    "view": lambda t: t.view(t.shape),
    "slice": lambda t: t[:1] if t.dim() else t.view(t.shape),
    "detach": lambda t: t.detach(),
    "clone": lambda t: t.clone(),
    "zero_bytes": lambda t: torch.empty(0, dtype=t.dtype)[:0],
}


def _mixed(draw: st.DrawFn, node: Node) -> Node:
    """``node`` with every sub-node re-typed to a drawn tag set (its leaves and metadata kept)."""
    data = {k: _mixed(draw, v) if isinstance(v, Node) else v for k, v in node._data.items()}
    cls = tagged_type(type(node)._root, draw(TAG_SETS))
    keys, batch_size, device, _ = node._meta
    return with_meta(cls, data, (keys, batch_size, device, cls._tags))


def _remade(draw: st.DrawFn, node: Node, sources: list[torch.Tensor]) -> Node:
    """A tree of ``node``'s structure whose leaves are made (by a drawn maker) from drawn ``sources``."""
    data: dict[str, Any] = {}
    for k, v in node._data.items():
        if isinstance(v, Node):
            data[k] = _remade(draw, v, sources)
        else:
            data[k] = LEAF_MAKERS[draw(st.sampled_from(sorted(LEAF_MAKERS)))](draw(st.sampled_from(sources)))
    cls = tagged_type(type(node)._root, draw(TAG_SETS))
    keys, batch_size, device, _ = node._meta
    return with_meta(cls, data, (keys, batch_size, device, cls._tags))


def _leaves(node: Node) -> list[torch.Tensor]:
    return list(node.values(include_nested=True, leaves_only=True))


def _sub_nodes(node: Node) -> list[Node]:
    return [node, *(v for v in node.values(include_nested=True) if isinstance(v, Node))]


def _storages(node: Node) -> set[tuple[torch.device, int]]:
    return {(t.device, t.untyped_storage().data_ptr()) for t in _leaves(node) if t.untyped_storage().nbytes()}


def _structure(node: Node) -> list[tuple[type, tuple, dict]]:
    """Every sub-node's type, metadata and entries (a copy of the dict, its values by identity)."""
    return [(type(n), n._meta, dict(n._data)) for n in _sub_nodes(node)]


def _assert_same_structure(node: Node, before: list[tuple[type, tuple, dict]]) -> None:
    after = _structure(node)
    assert len(after) == len(before)
    for (cls, meta, data), (cls0, meta0, data0) in zip(after, before):
        assert cls is cls0 and meta == meta0 and list(data) == list(data0)
        assert all(a is b for a, b in zip(data.values(), data0.values()))


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[Node], list[Node]]:
    """Tagged input nodes and results remade from their leaves (or from a leaf outside them)."""
    inputs = [_mixed(draw, draw(NODES)) for _ in range(draw(st.integers(1, 2)))]
    outside = torch.ones(3)  # a storage no input uses
    sources = [t for n in inputs for t in _leaves(n)] + [outside]
    results = [_remade(draw, draw(st.sampled_from(inputs)), sources) for _ in range(draw(st.integers(1, 3)))]
    return inputs, results


@given(_cases(), st.booleans())
def test_tag_rule_keeps_the_common_tags_exactly_when_no_leaf_has_new_storage(case, as_list):
    inputs, results = case
    root_tags = [n.tags for n in inputs]
    before = [(snapshot(n), _structure(n)) for n in inputs]
    made = [_structure(r) for r in results]

    @tag_rule
    def op(*nodes: Node) -> Any:
        return list(results) if as_list else results[0]

    out = op(*inputs)
    out = out if as_list else [out]
    assert len(out) == (len(results) if as_list else 1)
    common = frozenset.intersection(*root_tags)
    known = set().union(*(_storages(n) for n in inputs))
    for result, got, structure in zip(results, out, made):
        expected = common if _storages(result) <= known else frozenset()
        if any(root_tags):
            assert {n.tags for n in _sub_nodes(got)} == {expected}
        else:  # untagged inputs skip the rule: the result comes back as it was made
            assert got is result
        assert all(type(n)._root is tt.TensorDict for n in _sub_nodes(got))
        assert all(a is b for a, b in zip(_leaves(got), _leaves(result), strict=True))
        assert [n._meta[:3] for n in _sub_nodes(got)] == [n._meta[:3] for n in _sub_nodes(result)]
        if any(root_tags) and all(n.tags == expected for n in _sub_nodes(result)):
            assert got is result
        _assert_same_structure(result, structure)
    for node, (leaves, structure) in zip(inputs, before):
        assert_unchanged(node, leaves)
        _assert_same_structure(node, structure)


@given(st.data(), NODES, TAG_SETS)
def test_retag_makes_every_node_carry_the_tags_and_changes_nothing_else(data, td, tags):
    tree = _mixed(data.draw, td)
    before = _structure(tree)
    out = retag(tree, tags)
    assert {n.tags for n in _sub_nodes(out)} == {tags}
    assert all(type(n) is tagged_type(tt.TensorDict, tags) for n in _sub_nodes(out))
    assert all(a is b for a, b in zip(_leaves(out), _leaves(tree), strict=True))
    assert [n._meta[:3] for n in _sub_nodes(out)] == [n._meta[:3] for n in _sub_nodes(tree)]
    for old, new in zip(_sub_nodes(tree), _sub_nodes(out)):
        # a sub-tree already carrying the tags everywhere comes back as the same object
        assert (new is old) == all(n.tags == tags for n in _sub_nodes(old))
    _assert_same_structure(tree, before)
