"""Laws of the tag engine itself: tag_rule's decision and retag, over random trees with mixed tags.

The decision is checked against the rule as DESIGN.md states it, computed here
from ``untyped_storage().data_ptr()``: a result keeps the common tags of its
node inputs exactly when every leaf of it that holds data uses a storage one
of the inputs used. Results mix the inputs' own leaf objects, views of them,
fresh copies and fresh zero-byte tensors, and their sub-nodes carry any tags.
The rule finds inputs and results wherever they sit (dicts, lists, tuples,
named tuples, tensorclasses). DESIGN 3.1: unflatten builds untagged nodes and a
tagged type cannot be called.
"""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from typing import Any

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree._base import Node, make_tagged, with_meta
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


def _typed(root: type, tags: frozenset, data: dict[str, Any], meta: tuple) -> Node:
    """A node of ``root`` carrying exactly ``tags`` over ``data`` (sub-nodes as given: mixed trees on purpose)."""
    keys, batch_size, device, _ = meta
    if not tags:
        return with_meta(root, data, (keys, batch_size, device, frozenset()))
    cls: Any = tagged_type(root, tags)
    return make_tagged(cls, data, (keys, batch_size, device, cls._tags))


def _mixed(draw: st.DrawFn, node: Node) -> Node:
    """``node`` with every sub-node re-typed to a drawn tag set (its leaves and metadata kept)."""
    data = {k: _mixed(draw, v) if isinstance(v, Node) else v for k, v in node._data.items()}
    return _typed(type(node)._root, draw(TAG_SETS), data, node._meta)


def _remade(draw: st.DrawFn, node: Node, sources: list[torch.Tensor]) -> Node:
    """A tree of ``node``'s structure whose leaves are made (by a drawn maker) from drawn ``sources``."""
    data: dict[str, Any] = {}
    for k, v in node._data.items():
        if isinstance(v, Node):
            data[k] = _remade(draw, v, sources)
        else:
            data[k] = LEAF_MAKERS[draw(st.sampled_from(sorted(LEAF_MAKERS)))](draw(st.sampled_from(sources)))
    return _typed(type(node)._root, draw(TAG_SETS), data, node._meta)


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


# -- the rule finds nodes wherever they sit -------------------------------------------------------------

Pair = namedtuple("Pair", ["first", "second"])


class Box(tt.TensorClass):
    """A tensorclass around a node (a static field too): the rule reaches its inner node."""

    inner: tt.TensorDict
    label: str = "box"


CONTAINERS = ["bare", "dict", "list", "tuple", "namedtuple", "nested"]


def _put(how: str, node: Node) -> Any:
    """``node`` inside a container of kind ``how``."""
    if how == "dict":
        return {"n": node}
    if how == "list":
        return [node]
    if how == "tuple":
        return (node, 1.0)
    if how == "namedtuple":
        return Pair(node, None)
    if how == "nested":
        return {"a": [Pair(torch.zeros(1), (node,))]}
    return node


def _take(how: str, tree: Any) -> Node:
    """The node :func:`_put` put into ``tree``."""
    if how == "dict":
        return tree["n"]
    if how == "list":
        return tree[0]
    if how in ("tuple", "namedtuple"):
        return tree[0]
    if how == "nested":
        return tree["a"][0].second[0]
    return tree


@given(_cases(), st.lists(st.sampled_from(CONTAINERS), min_size=3, max_size=3))
def test_tag_rule_finds_nodes_in_containers(case, hows):
    """The decision is the same wherever the inputs and results sit: bare, in dicts, lists, tuples,
    named tuples, nested containers (inputs found through the pytree registry)."""
    inputs, results = case
    in_how, out_how, kw_how = hows

    @tag_rule
    def bare(*nodes: Node) -> Any:
        return list(results)

    @tag_rule
    def contained(wrapped: Any, *, more: Any) -> Any:
        return [_put(out_how, r) for r in results]

    expected = bare(*inputs)
    got = contained(_put(in_how, inputs[0]), more=[_put(kw_how, n) for n in inputs[1:]])
    for want, tree in zip(expected, got):
        out = _take(out_how, tree)
        assert [n.tags for n in _sub_nodes(out)] == [n.tags for n in _sub_nodes(want)]
        assert all(a is b for a, b in zip(_leaves(out), _leaves(want), strict=True))


def _boxed(node: Node, tags: frozenset) -> Box:
    """A Box around ``node`` whose inner node carries ``tags`` everywhere (the constructor untags)."""
    box = Box(inner=node)
    return box._wrap(retag(box.to_node(), tags))


@given(_cases())
def test_tag_rule_finds_and_rewraps_tensorclasses(case):
    """A tensorclass argument is an input (its inner node), a tensorclass result is decided and
    rebuilt as the same class with its static fields."""
    inputs, results = case
    boxes = [_boxed(n, n.tags) for n in inputs]
    result = Box(inner=results[0], label="out")  # untagged, as the constructor makes it

    @tag_rule
    def op(*given: Box) -> Box:
        return result

    got = op(*boxes)
    assert type(got) is Box and got.label == "out"
    assert all(a is b for a, b in zip(_leaves(got.to_node()), _leaves(results[0]), strict=True))
    if not any(n.tags for n in inputs):
        assert got is result
        return
    common = frozenset.intersection(*(n.tags for n in inputs))
    known = set().union(*(_storages(n) for n in inputs))
    expected = common if _storages(results[0]) <= known else frozenset()
    assert {n.tags for n in _sub_nodes(got.to_node())} == {expected}
    assert got.inner.tags == expected


@given(NODES, st.data())
def test_a_result_with_mixed_tags_comes_out_uniform(td, data):
    """Tagged sub-nodes reused under a root the factories made untagged: the rule makes the result
    carry one tag set everywhere."""
    node = retag(td, data.draw(TAG_SETS.filter(bool)))

    @tag_rule
    def shallow(n: Node) -> Node:
        return with_meta(type(n), n._data, n._meta)  # an untagged root over n's tagged sub-nodes

    out = shallow(node)
    assert {n.tags for n in _sub_nodes(out)} == {node.tags}


# -- DESIGN 3.1: nodes built from leaves carry no tags ---------------------------------------------------


@given(NODES, TAG_SETS)
def test_unflatten_is_untagged_for_every_tagged_type(td, tags):
    node = retag(td, tags)
    for again in (
        optree.tree_unflatten(*reversed(optree.tree_flatten(node, namespace="tdtree"))),
        tt.tree.unflatten(tt.tree.structure(node), tt.tree.leaves(node)),
        torch_pytree.tree_unflatten(*torch_pytree.tree_flatten(node)),
    ):
        assert all(type(n) is tt.TensorDict for n in _sub_nodes(again))
        assert all(a is b for a, b in zip(_leaves(again), _leaves(node), strict=True))
        assert [n._meta[:3] for n in _sub_nodes(again)] == [n._meta[:3] for n in _sub_nodes(node)]


@given(NODES, TAG_SETS)
def test_unflatten_of_a_tensorclass_is_untagged(td, tags):
    box = Box(inner=td)._wrap(retag(Box(inner=td).to_node(), tags))
    leaves, spec = optree.tree_flatten(box, namespace="tdtree")
    for again in (optree.tree_unflatten(spec, leaves), torch_pytree.tree_unflatten(*torch_pytree.tree_flatten(box))):
        assert type(again) is Box and again.label == "box"
        assert again.tags == frozenset() and again.inner.tags == frozenset()
        assert all(a is b for a, b in zip(_leaves(again.to_node()), leaves, strict=True))


@dataclasses.dataclass
class _Record:
    x: torch.Tensor


_Named = namedtuple("_Named", ["x"])

CALLS = {
    "call": lambda cls, d: cls(d),
    "from_dict": lambda cls, d: cls.from_dict(d),
    "from_dataclass": lambda cls, d: cls.from_dataclass(_Record(d["x"])),
    "from_namedtuple": lambda cls, d: cls.from_namedtuple(_Named(d["x"])),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@given(tags=TAG_SETS.filter(bool))
def test_calling_a_tagged_type_raises(call, tags):
    cls = tagged_type(tt.TensorDict, tags)
    with pytest.raises(TypeError, match=r"\.lock\(\), \.share_memory\(\) or \.memmap\(prefix\)"):
        CALLS[call](cls, {"x": torch.zeros(2)})
    assert type(CALLS[call](tt.TensorDict, {"x": torch.zeros(2)})) is tt.TensorDict
