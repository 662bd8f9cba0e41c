"""Tags never lie (issue 16, DESIGN 3.1): the repro lines of the issue, each asserting the fixed behaviour.

Nodes rebuilt from leaves (every unflatten, so torch.func outputs) are untagged; a tagged type cannot
be called; tdtree's own tree functions and optimisers apply the rule; a node put into another is
retagged; LockedError guards every sub-node on an edited path.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree
from _tagsets import tag_sets

import tdtree as tt
import tdtree.optim as optim
from tdtree._base import UNDECIDED, _retagged_traced, alike, from_meta, make, make_tagged, retagged, with_meta
from tdtree._pytree import variant
from tdtree._tags import tagged_type
from tdtree.errors import LockedError


def _shared() -> tt.TensorDict:
    return tt.TensorDict({"x": torch.zeros(4), "n": {"y": torch.arange(4.0)}}, [4]).share_memory()


def _plain_dict(td: tt.TensorDict) -> dict[str, Any]:
    return td.to_dict()


def _storages(td: tt.TensorDict) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in td.values(include_nested=True, leaves_only=True)}


def _assert_values(node: tt.TensorDict, expected: dict[str, Any]) -> None:
    got = optree.tree_flatten(node.to_dict())
    want = optree.tree_flatten(expected)
    assert got[1] == want[1]
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0]))


# -- the factories --------------------------------------------------------------------------------------


def test_result_factories_build_untagged_nodes_of_the_root_type() -> None:
    sh = _shared()
    cls = type(sh)
    data, meta = dict(sh._data), sh._meta
    for node in (
        make(cls, data, meta[1], meta[2]),
        from_meta(cls, meta, list(data.values())),
        with_meta(cls, data, meta),
        *alike(cls, [data, data], meta),
    ):
        assert type(node) is tt.TensorDict and node.tags == frozenset() and node._meta[:3] == meta[:3]
    # the two that write tags: a whole tree (retag's) and one node
    plain = with_meta(cls, data, meta)
    tree = retagged(plain, cls, sh.tags, variant)
    assert type(tree) is type(tree["n"]) is cls and tree.tags == tree["n"].tags == sh.tags
    tagged = make_tagged(cls, data, meta)
    assert type(tagged) is cls and tagged.tags == sh.tags


@pytest.mark.parametrize("depth", [2, 70], ids=["recursed", "past_the_recursion"])
def test_retagged_builds_only_when_every_node_s_storages_pass(depth: int) -> None:
    """``only_if`` is asked of the storages of every node's tensors, the nodes already carrying the
    tags too; one False answer anywhere and nothing comes back but UNDECIDED. The traced twin, which
    no rule asks it of, never builds on it."""
    top: dict[str, Any] = {}
    level = top
    for i in range(depth):
        level["x"] = torch.full((4,), float(i))
        if i < depth - 1:
            level = level.setdefault("n", {})
    plain = tt.TensorDict(top, [4])
    sh = plain.share_memory()
    cls = type(sh)
    leaves = list(plain.values(include_nested=True, leaves_only=True))
    for tree in (plain, sh):
        asked: list[list[torch.UntypedStorage]] = []

        def record(storages: Any, asked: list = asked) -> bool:
            asked.append(list(storages))
            return True

        out = retagged(tree, cls, sh.tags, variant, 0, False, record)
        own = [t.untyped_storage().data_ptr() for t in tree.values(include_nested=True, leaves_only=True)]
        assert sorted(s.data_ptr() for level in asked for s in level) == sorted(own) and len(asked) == depth
        if tree is sh:
            assert out is None  # every node carries the tags already: nothing to build
        else:
            assert tag_sets(out) == {sh.tags}
            assert all(a is b for a, b in zip(out.values(True, True), leaves))
    for refused in (0, depth - 1):  # the root's storages, the deepest node's
        ptr = leaves[refused].untyped_storage().data_ptr()

        def refuse(storages: Any, ptr: int = ptr) -> bool:
            return all(s.data_ptr() != ptr for s in storages)

        assert retagged(plain, cls, sh.tags, variant, 0, False, refuse) is UNDECIDED
    assert _retagged_traced(plain, cls, sh.tags, variant, 0, False, lambda storages: True) is UNDECIDED


# -- tt.tree ----------------------------------------------------------------------------------------


def test_tree_map_to_new_storage_is_untagged_and_pickles() -> None:
    sh = _shared()
    m = tt.tree.map(lambda x: x + 1, sh)
    assert tag_sets(m) == {frozenset()}
    _assert_values(m, optree.tree_map(lambda x: x + 1, _plain_dict(sh)))
    again = pickle.loads(pickle.dumps(m))
    assert type(again) is tt.TensorDict
    _assert_values(again, optree.tree_map(lambda x: x + 1, _plain_dict(sh)))


def test_tree_map_reusing_the_leaves_keeps_the_tags() -> None:
    sh = _shared()
    same = tt.tree.map(lambda x: x, sh)
    assert type(same) is type(sh) and tag_sets(same) == {sh.tags}
    views = tt.tree.map_with_path(lambda path, x: x[:2], sh)
    assert tag_sets(views) == {sh.tags} and _storages(views) == _storages(sh)


def test_tree_map_over_a_memmapped_node_pickles(tmp_path: Any) -> None:
    mm = tt.TensorDict({"x": torch.zeros(4)}, [4]).memmap(tmp_path / "m")
    out = tt.tree.map(lambda x: x + 1, mm)
    assert out.tags == frozenset()
    _assert_values(pickle.loads(pickle.dumps(out)), {"x": torch.ones(4)})


def test_tree_map_pairs_nodes_that_differ_only_in_tags() -> None:
    sh = _shared()
    plain = tt.TensorDict({"x": torch.ones(4), "n": {"y": torch.ones(4)}}, [4])
    total = tt.tree.map(torch.add, sh, plain)
    assert tag_sets(total) == {frozenset()}
    _assert_values(total, optree.tree_map(torch.add, _plain_dict(sh), _plain_dict(plain)))
    # the first tree's leaves: every leaf is one of the inputs', so the common tags (none here) are kept
    first = tt.tree.map(lambda a, b: a, sh, sh.unlock())
    assert tag_sets(first) == {frozenset({tt.Shared})}


def test_tree_map_finds_nodes_inside_containers() -> None:
    sh = _shared()
    out = tt.tree.map(lambda x: x, {"a": [sh]})
    assert tag_sets(out["a"][0]) == {sh.tags}
    out = tt.tree.map(lambda x: x * 2, {"a": [sh]})
    assert tag_sets(out["a"][0]) == {frozenset()}


def test_tree_unflatten_builds_untagged_nodes() -> None:
    sh = _shared()
    leaves, spec = tt.tree.flatten(sh)
    assert tt.tree.structure(sh) != tt.tree.structure(sh.unlock())  # structures still differ by tags
    again = tt.tree.unflatten(spec, leaves)
    assert tag_sets(again) == {frozenset()}


@pytest.mark.parametrize(
    "tree_map", [lambda f, t: optree.tree_map(f, t, namespace="tdtree"), torch_pytree.tree_map], ids=["optree", "torch"]
)
def test_foreign_tree_maps_build_untagged_nodes(tree_map: Any) -> None:
    sh = _shared()
    assert tag_sets(tree_map(lambda x: x, sh)) == {frozenset()}


# -- torch.func -------------------------------------------------------------------------------------


def test_grad_of_a_shared_node_is_untagged() -> None:
    sh = _shared()
    g = torch.func.grad(lambda q: (q["x"] * 2).sum())(sh)
    assert tag_sets(g) == {frozenset()}
    want = torch.func.grad(lambda q: (q["x"] * 2).sum())(_plain_dict(sh))
    _assert_values(g, want)


def test_vmap_outputs_are_untagged() -> None:
    sh = tt.TensorDict({"x": torch.arange(6.0).view(2, 3)}).share_memory()
    out = torch.func.vmap(lambda q: q.apply(torch.sin))(sh)
    assert tag_sets(out) == {frozenset()}
    _assert_values(out, torch.func.vmap(lambda q: optree.tree_map(torch.sin, q))(_plain_dict(sh)))
    assert tag_sets(torch.func.vmap(lambda q: q)(sh)) == {frozenset()}


# -- tagged types cannot be called --------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: tt.TensorDict[tt.Shared]({"x": torch.zeros(4)}, batch_size=[4]),
        lambda: tt.TensorDict[tt.Locked].from_dict({"x": torch.zeros(4)}),
        lambda: tt.TensorDict[tt.Memmap, tt.Locked]({}),
    ],
    ids=["call", "from_dict", "empty"],
)
def test_calling_a_tagged_type_raises_naming_the_ways_to_tag(build: Any) -> None:
    with pytest.raises(TypeError, match=r"call \.lock\(\), \.share_memory\(\) or \.memmap\(prefix\) on it"):
        build()


# -- inserting nodes, and LockedError below the root ------------------------------------------------


def test_an_inserted_tagged_node_is_retagged_by_the_rule() -> None:
    u = tt.TensorDict({"a": torch.zeros(3)})
    s2 = tt.TensorDict({"n": {"x": torch.zeros(3)}}).share_memory()
    for r in (u.update({"n": s2}), u.update(tt.TensorDict({"n": s2})), u.set("n", s2), u.setdefault("n", s2)):
        assert tag_sets(r) == {frozenset()}
        edited = r.set(("n", "n", "x"), torch.ones(3))
        assert tag_sets(edited) == {frozenset()}
        _assert_values(edited, {"a": torch.zeros(3), "n": {"n": {"x": torch.ones(3)}}})
    # a Shared root given its own sub-tree back keeps Shared everywhere (the node in the mapping is an input)
    s = tt.TensorDict({"a": torch.zeros(3)}).share_memory().unlock()
    r = s.update({"n": {"m": s.select("a")}})
    assert tag_sets(r) == {frozenset({tt.Shared})}


def _mixed() -> tt.TensorDict:
    """An untagged root over a Locked sub-node: what the factories cannot make, built by hand."""
    locked = tt.TensorDict({"x": torch.zeros(3)}).lock()
    inner: Any = tagged_type(tt.TensorDict, frozenset({tt.Locked}))
    sub = make_tagged(inner, {"n": locked}, (("n",), torch.Size(()), torch.device("cpu"), frozenset({tt.Locked})))
    data = {"a": torch.zeros(3), "m": sub}
    return with_meta(tt.TensorDict, data, (("a", "m"), torch.Size(()), torch.device("cpu"), frozenset()))


@pytest.mark.parametrize(
    ("op", "where", "edit"),
    [
        ("set", "m", lambda td: td.set(("m", "n", "x"), torch.ones(3))),
        ("set", "m", lambda td: td.set(("m", "new"), torch.ones(3))),
        ("update", "m", lambda td: td.update({"m": {"n": {"x": torch.ones(3)}}})),
        ("rename", "m", lambda td: td.rename({("m", "n", "x"): "y"})),
        ("rename", "m", lambda td: td.rename({"a": ("m", "n", "b")})),
        ("setdefault", "m", lambda td: td.setdefault(("m", "n", "z"), torch.ones(3))),
        ("at[...].set", "m", lambda td: td.at[...].set(0.0)),
    ],
    ids=["set", "set-new-key", "update", "rename-from", "rename-to", "setdefault", "at-set"],
)
def test_locked_error_guards_every_sub_node_on_the_edited_path(op: str, where: Any, edit: Any) -> None:
    td = _mixed()
    with pytest.raises(LockedError, match=re.escape(f"{op}() on a locked node (the sub-node at {where!r} is locked)")):
        edit(td)
    # editing beside the locked sub-node is allowed
    assert torch.equal(td.set("other", torch.ones(3))["other"], torch.ones(3))


def test_tensorclass_replace_on_a_locked_instance_names_replace() -> None:
    class Rec(tt.TensorClass):
        x: torch.Tensor

    with pytest.raises(LockedError, match=r"^replace\(\) on a locked node"):
        Rec(x=torch.zeros(2)).lock().replace(x=torch.ones(2))


# -- tdtree.optim ---------------------------------------------------------------------------------------


class Params(tt.TensorClass):
    w: torch.Tensor
    name: str = "p"


@pytest.mark.parametrize("wrap", ["dict", "list"])
def test_sgd_over_containers_of_tagged_nodes_is_untagged(wrap: str) -> None:
    s = tt.TensorDict({"w": torch.ones(3)}).share_memory()
    params: Any = {"p": s} if wrap == "dict" else [s]
    new, _ = optim.sgd(params, params, 0.1)
    node = new["p"] if wrap == "dict" else new[0]
    assert tag_sets(node) == {frozenset()}
    assert _storages(node).isdisjoint(_storages(s))
    _assert_values(node, {"w": torch.ones(3) - 0.1 * torch.ones(3)})


def test_sgd_and_adam_on_a_shared_tensorclass_are_untagged() -> None:
    p = Params(w=torch.ones(3)).share_memory()
    new, _ = optim.sgd(p, p, 0.1)
    assert type(new) is Params and new.name == "p" and new.tags == frozenset()
    assert torch.equal(new.w, torch.ones(3) - 0.1 * torch.ones(3))
    new, state = optim.adam(p, p, optim.adam_init(p), lr=0.1)
    assert type(new) is Params and new.tags == frozenset() and state.exp_avg.tags == frozenset()
    ref = torch.ones(3, requires_grad=True)
    adam = torch.optim.Adam([ref], lr=0.1)
    ref.grad = torch.ones(3)
    adam.step()
    assert torch.allclose(new.w, ref.detach())


# -- the rule on containers under torch.compile -----------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize(
    "fn",
    [
        lambda t: tt.tree.map(lambda x: x, {"a": [t]}),
        lambda t: tt.tree.map(lambda x: x + 1, {"a": t}),
        lambda t: optim.sgd({"p": t}, {"p": t}, 0.1)[0],
        lambda t: t.unlock().update({"n": t}),
    ],
    ids=["map-keeps", "map-drops", "sgd-dict", "update-with-node"],
)
def test_compiled_rule_finds_nodes_in_containers_as_eager(backend: str, fn: Any) -> None:
    torch._dynamo.reset()
    sh = _shared()
    out = torch.compile(fn, fullgraph=True, backend=backend)(sh)
    want = fn(sh)

    def tags(tree: Any) -> list[set[frozenset]]:
        return [tag_sets(n) for n in tt.tree.leaves(tree, is_leaf=lambda x: isinstance(x, tt.TensorDict))]

    assert tags(out) == tags(want)
    assert all(torch.equal(a, b) for a, b in zip(tt.tree.leaves(out), tt.tree.leaves(want), strict=True))


def test_every_editor_call_on_a_locked_node_is_refused_even_when_it_would_change_nothing() -> None:
    # found by the stateful tag machine: rename({}) of a Locked node went through
    td = tt.TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2]).lock()
    for edit in (
        lambda t: t.rename({}),
        lambda t: t.update({}),
        lambda t: t.select().rename({}),
        lambda t: t.setdefault("a", torch.ones(2)),
    ):
        with pytest.raises(tt.LockedError):
            edit(td)
