"""Tags as types and the one propagation rule, on nodes from share_memory() and lock()."""

from __future__ import annotations

import abc
import itertools
import pickle
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler

import optree
import pytest
import torch
import torch.multiprocessing  # noqa: F401  (registers the tensor reductions with ForkingPickler)
import torch.utils._pytree as torch_pytree
from _fresh import fresh_python
from _tagsets import tag_sets

import tdtree as tt
from tdtree import _tags
from tdtree._base import make_tagged
from tdtree._tags import retag, tag_rule
from tdtree.errors import LockedError
from tdtree.testing import assert_equal

SL = frozenset({tt.Shared, tt.Locked})


def _plain() -> tt.TensorDict:
    return tt.TensorDict(
        {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2), "n": {"c": torch.zeros(2, 1)}},
        batch_size=[2],
    )


def _shared() -> tt.TensorDict:
    return _plain().share_memory()


def _ptrs(td: tt.TensorDict) -> set[int]:
    return {t.untyped_storage().data_ptr() for _, t in td.items(include_nested=True, leaves_only=True)}


@tag_rule
def _first(a: tt.TensorDict, b: tt.TensorDict) -> tt.TensorDict:
    """A two-input op that returns its first input's leaves (a fresh node over them)."""
    return a.clone(recurse=False)


# -- tags as types -------------------------------------------------------------------


def test_tagged_types_are_cached_and_order_free() -> None:
    assert tt.TensorDict[tt.Locked, tt.Shared] is tt.TensorDict[tt.Shared, tt.Locked]
    assert tt.TensorDict[tt.Shared] is tt.TensorDict[(tt.Shared,)]
    assert tt.TensorDict[tt.Shared] is not tt.TensorDict[tt.Locked]
    assert tt.TensorDict[tt.Locked, tt.Shared].__name__ == "TensorDict[Locked, Shared]"


def test_isinstance_means_at_least_these_tags() -> None:
    td = _shared()
    assert type(td) is tt.TensorDict[tt.Shared, tt.Locked]
    for cls in (tt.TensorDict, tt.TensorDict[tt.Shared], tt.TensorDict[tt.Locked], tt.TensorDict[tt.Locked, tt.Shared]):
        assert isinstance(td, cls)
    assert not isinstance(td, tt.TensorDict[tt.Memmap])
    assert not isinstance(td, tt.TensorDict[tt.Shared, tt.Memmap])
    plain = _plain()
    assert type(plain) is tt.TensorDict
    assert not isinstance(plain, tt.TensorDict[tt.Shared])
    locked = plain.lock()
    assert isinstance(locked, tt.TensorDict[tt.Locked]) and not isinstance(locked, tt.TensorDict[tt.Shared])


def test_tag_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match=r"TensorDict\[\.\.\.\] takes tags \(Locked, Shared, Memmap\), got 'Shared'"):
        tt.TensorDict["Shared"]


def test_tags_properties() -> None:
    td = _shared()
    assert td.tags == SL
    assert td.is_shared and td.is_locked and not td.is_memmap
    assert _plain().tags == frozenset()


def test_different_tags_different_structures() -> None:
    plain, locked, shared = _plain(), _plain().lock(), _shared()
    optree_structs = [optree.tree_structure(t, namespace="tdtree") for t in (plain, locked, shared)]
    torch_structs = [torch_pytree.tree_structure(t) for t in (plain, locked, shared)]
    for structs in (optree_structs, torch_structs):
        assert structs[0] != structs[1] and structs[1] != structs[2] and structs[0] != structs[2]
    assert optree.tree_structure(shared, namespace="tdtree") == optree.tree_structure(_shared(), namespace="tdtree")


@pytest.mark.parametrize("registry", ["optree", "torch"])
def test_unflatten_builds_untagged_nodes(registry: str) -> None:
    """DESIGN 3.1: a node rebuilt from leaves has no inputs to compare storages with, so it claims no tags
    (this test asserted the tagged type came back before)."""
    shared = _shared()
    if registry == "optree":
        leaves, spec = optree.tree_flatten(shared, namespace="tdtree")
        again = optree.tree_unflatten(spec, leaves)
    else:
        leaves, tspec = torch_pytree.tree_flatten(shared)
        again = torch_pytree.tree_unflatten(leaves, tspec)
    assert type(again) is tt.TensorDict and type(again["n"]) is tt.TensorDict
    assert_equal(again, shared, check_tags=False)
    assert all(a is b for a, b in zip(leaves, again.values(include_nested=True, leaves_only=True)))


# -- pickling ------------------------------------------------------------------------------


def test_plain_pickle_keeps_tags_and_re_shares() -> None:
    shared = _shared()
    again = pickle.loads(pickle.dumps(shared))
    assert type(again) is type(shared) and type(again["n"]) is type(shared["n"])
    assert all(t.is_shared() for _, t in again.items(include_nested=True, leaves_only=True))
    assert _ptrs(again).isdisjoint(_ptrs(shared))
    assert_equal(again, shared)
    locked = pickle.loads(pickle.dumps(_plain().lock()))
    assert type(locked) is tt.TensorDict[tt.Locked]
    assert not locked["a"].is_shared()
    assert type(pickle.loads(pickle.dumps(_plain()))) is tt.TensorDict


def test_multiprocessing_pickle_keeps_tags_and_storages() -> None:
    shared = _shared()
    again = pickle.loads(ForkingPickler.dumps(shared))
    assert type(again) is type(shared) and type(again["n"]) is type(shared["n"])
    assert _ptrs(again) == _ptrs(shared)
    again.fill_("b", 5.0)
    assert torch.equal(shared["b"], torch.full((2,), 5.0))


# -- the rule --------------------------------------------------------------------------------


def test_sub_nodes_carry_the_root_tags() -> None:
    td = _shared()
    assert tag_sets(td) == {SL}
    assert type(td["n"]) is tt.TensorDict[tt.Shared, tt.Locked]
    assert tag_sets(_plain().lock()) == {frozenset({tt.Locked})}


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda td: td.select("a", ("n", "c")), id="select"),
        pytest.param(lambda td: td.exclude("b"), id="exclude"),
        pytest.param(lambda td: td.flatten_keys(), id="flatten_keys"),
        pytest.param(lambda td: td.flatten_keys().unflatten_keys(), id="unflatten_keys"),
        pytest.param(lambda td: td.clone(recurse=False), id="clone_shallow"),
        pytest.param(lambda td: td["n"], id="sub_node"),
    ],
)
def test_ops_that_reuse_storage_keep_the_tags(op) -> None:
    td = _shared()
    out = op(td)
    assert tag_sets(out) == {SL}
    assert _ptrs(out) <= _ptrs(td)


def test_clone_drops_the_tags() -> None:
    td = _shared()
    out = td.clone()
    assert tag_sets(out) == {frozenset()}
    assert type(out) is tt.TensorDict
    assert _ptrs(out).isdisjoint(_ptrs(td))


def test_a_result_without_data_keeps_the_common_tags() -> None:
    td = _shared()
    assert type(td.select()) is type(td)
    assert type(td.exclude("a", "b", "n")) is type(td)
    empty = tt.TensorDict({"e": torch.zeros(2, 0), "n": {"f": torch.zeros(2, 0, 3)}}, batch_size=[2]).share_memory()
    assert tag_sets(empty.clone()) == {SL}  # new tensors, but no byte of data: nothing contradicts the claim


def test_zero_byte_storages_never_decide() -> None:
    td = tt.TensorDict({"a": torch.ones(2), "e": torch.zeros(2, 0)}, batch_size=[2]).share_memory().unlock()
    kept = td.set("z", torch.zeros(2, 0))  # a new, unshared, zero-byte storage
    assert type(kept) is tt.TensorDict[tt.Shared]
    assert not kept["z"].is_shared()
    dropped = td.set("z", torch.zeros(2, 1))
    assert type(dropped) is tt.TensorDict


def test_multi_input_ops_keep_only_common_tags() -> None:
    shared = _shared()
    locked_shared_copy = shared.clone(recurse=False)
    assert type(_first(shared, locked_shared_copy)) is type(shared)
    only_shared = shared.unlock()
    assert type(_first(shared, only_shared)) is tt.TensorDict[tt.Shared]
    assert type(_first(only_shared, _plain().lock())) is tt.TensorDict
    assert type(_first(_plain(), shared)) is tt.TensorDict  # common tags of untagged and tagged: none
    assert type(_first([shared][0], shared.select("a"))) is type(shared)


def test_multi_input_fresh_storage_drops_even_common_tags() -> None:
    @tag_rule
    def fresh(a: tt.TensorDict, b: tt.TensorDict) -> tt.TensorDict:
        return a.clone()

    assert type(fresh(_shared(), _shared())) is tt.TensorDict


def test_storage_of_any_input_counts() -> None:
    a, b = _shared(), _shared()

    @tag_rule
    def mix(x: tt.TensorDict, y: tt.TensorDict) -> tt.TensorDict:
        return x.unlock().set("b", y["b"]).lock()

    out = mix(a, b)
    assert type(out) is type(a)
    assert out["b"] is b["b"]


def test_list_results_are_decided_one_by_one() -> None:
    @tag_rule
    def parts(x: tt.TensorDict) -> list[tt.TensorDict]:
        return [x.select("a"), x.clone()]

    kept, dropped = parts(_shared())
    assert type(kept) is tt.TensorDict[tt.Locked, tt.Shared]
    assert type(dropped) is tt.TensorDict


# -- Locked ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, name",
    [
        (lambda td: td.set("z", torch.ones(2)), "set"),
        (lambda td: td.update({"b": torch.zeros(2)}), "update"),
        (lambda td: td.rename({"b": "q"}), "rename"),
        (lambda td: td.setdefault("z", torch.ones(2)), "setdefault"),
    ],
)
def test_functional_editors_refuse_locked_nodes(op, name: str) -> None:
    for td in (_shared(), _plain().lock()):
        with pytest.raises(
            LockedError,
            match=rf"^{name}\(\) on a locked node.*update_\(\), copy_\(\) or at\[idx\]\.set_\(\).*unlock\(\)",
        ):
            op(td)


def test_locked_error_is_a_runtime_error() -> None:
    assert issubclass(LockedError, RuntimeError)


def test_lock_and_unlock() -> None:
    td = _shared()
    unlocked = td.unlock()
    assert tag_sets(unlocked) == {frozenset({tt.Shared})}
    assert _ptrs(unlocked) == _ptrs(td)
    assert type(unlocked.lock()) is type(td)
    assert td.lock() is td  # already carries the tags everywhere
    assert _plain().unlock().tags == frozenset()


def test_unlocked_shared_set_new_storage_drops_tags() -> None:
    td = _shared().unlock()
    out = td.set("z", torch.ones(2))
    assert type(out) is tt.TensorDict and tag_sets(out) == {frozenset()}
    assert type(td) is tt.TensorDict[tt.Shared]


def test_unlocked_shared_set_same_storage_keeps_tags() -> None:
    td = _shared().unlock()
    out = td.set("z", td["a"])
    assert type(out) is tt.TensorDict[tt.Shared]
    assert tag_sets(out) == {frozenset({tt.Shared})}
    nested = td.set(("n", "d"), td["a"][:, 0:1])
    assert tag_sets(nested) == {frozenset({tt.Shared})}


def test_constructor_makes_untagged_nodes() -> None:
    shared = _shared()
    outer = tt.TensorDict({"inner": shared}, batch_size=[2])
    assert tag_sets(outer) == {frozenset()}
    assert tt.TensorDict(shared, batch_size=[2]).tags == frozenset()


def test_retag_reuses_leaves_and_returns_uniform_nodes() -> None:
    td = _plain()
    tagged = retag(td, SL)
    assert tag_sets(tagged) == {SL}
    assert _ptrs(tagged) == _ptrs(td)
    assert retag(tagged, SL) is tagged


def test_editors_on_an_unlocked_shared_node_follow_the_rule() -> None:
    td = _shared().unlock()
    renamed = td.rename({"a": "q", ("n", "c"): ("n", "d")})
    assert type(renamed) is tt.TensorDict[tt.Shared] and list(renamed.keys()) == ["b", "n", "q"]
    assert renamed["q"] is td["a"]
    assert td.setdefault("a", torch.ones(2)) is td
    assert type(td.setdefault("z", torch.ones(2))) is tt.TensorDict
    assert type(td.setdefault("z", torch.zeros(2, 0))) is tt.TensorDict[tt.Shared]
    assert type(td.update({"n": {"c": td["a"][:, :1]}})) is tt.TensorDict[tt.Shared]
    assert type(td.update({"n": {"c": torch.ones(2, 1)}})) is tt.TensorDict


def test_lookups_through_a_tensor_with_a_default_do_not_raise() -> None:
    td = _shared()
    assert ("a", "x") not in td and ("n", "x") not in td and ("n", "c") in td
    assert td.get(("a", "x"), None) is None


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("make", [_shared, lambda: _plain().lock()], ids=["shared", "locked"])
def test_compiled_rule_decides_as_eager(backend: str, make) -> None:
    """Views keep the tags, new storages drop them, and each result of a list is decided on its own,
    as in eager, with no graph break."""

    def f(x: tt.TensorDict, idx: torch.Tensor) -> tuple:
        return x[0], x[idx], x.unbind(0), x.exclude("b"), x.clone(), x.reshape(2, 1)

    def tags_of(out: tuple) -> list[set[frozenset]]:
        return [tag_sets(n) for n in torch_pytree.tree_leaves(out, is_leaf=lambda v: isinstance(v, tt.TensorDict))]

    td, idx = make(), torch.tensor([1, 0])
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)(td, idx)
    kept, dropped = {td.tags}, {frozenset()}
    # x[0], x[idx], the two parts of unbind, exclude, clone, reshape (a view here)
    assert tags_of(f(td, idx)) == [kept, dropped, kept, kept, kept, dropped, kept]
    assert tags_of(compiled) == tags_of(f(td, idx))


def test_leaves_that_are_not_tensors_hold_no_storage() -> None:
    """torch unflattens placeholders (in_dims, None) into node structures; the rule passes over them."""
    td = _shared()
    spec = torch_pytree.tree_flatten(td)[1]

    def returning(out: tt.TensorDict) -> Callable[[tt.TensorDict], tt.TensorDict]:
        return tag_rule(lambda x: out)

    kept = returning(torch_pytree.tree_unflatten([None, 0, td["n", "c"]], spec))(td)
    assert tag_sets(kept) == {SL}
    dropped = returning(torch_pytree.tree_unflatten([None, 0, torch.zeros(2, 1)], spec))(td)
    assert tag_sets(dropped) == {frozenset()}


def test_an_input_is_looked_at_once_and_the_rule_still_decides_each_result(monkeypatch) -> None:
    """What the rule knows of an input node is worked out on the first operation and kept: later
    operations on the same node pay for their result alone, and still decide by storage."""
    made: list[object] = []
    known = _tags.Known

    def counted(node):
        made.append(node)
        return known(node)

    monkeypatch.setattr(_tags, "Known", counted)
    td = _plain().lock()
    assert td.select("a").tags == {tt.Locked}
    assert made == [td]
    assert (td + 1).tags == frozenset()  # new storage, found through the kept storages
    assert td.apply(lambda x: x[:1]).tags == {tt.Locked}  # other tensors, the input's storages
    assert td.exclude("b").tags == {tt.Locked}
    assert made == [td]
    other = td.select("a", "n")  # a result is an input of its own: looked at on its first use
    assert other.apply(lambda x: x.view_as(x)).tags == {tt.Locked}
    assert made == [td, other]


def test_what_the_rule_kept_of_a_node_follows_a_refilled_node() -> None:
    """The constructor can be called again on a node (it refills its slots): what the rule kept of
    the old leaves is not used for the new ones."""
    td = _plain().lock()
    assert td.apply(lambda x: x.view_as(x)).tags == {tt.Locked}  # the node's storages are kept
    fresh = torch.arange(4.0)
    tt.TensorDict.__init__(td, {"z": fresh}, batch_size=[4])
    out = td.apply(lambda x: x[1:])
    assert out["z"].untyped_storage().data_ptr() == fresh.untyped_storage().data_ptr()
    assert out.tags == {tt.Locked}  # a view of the new leaf: a storage the node now uses
    assert td.apply(lambda x: x + 1).tags == frozenset()


def _wide(nested: bool) -> tt.TensorDict:
    """Twelve leaves (a flat node past the rule's count in C), or six of them and a sub-node of six."""
    leaves: dict = {f"k{i:02d}": torch.full((2,), float(i)) for i in range(12)}
    if nested:
        names = sorted(leaves)
        leaves = {**{k: leaves[k] for k in names[:6]}, "sub": {k: leaves[k] for k in names[6:]}}
    return tt.TensorDict(leaves, batch_size=[2])


def _data_ptrs(td: tt.TensorDict) -> set[int]:
    """The storages of ``td``'s leaves that hold data, by address (what the rule decides by)."""
    leaves = td.values(include_nested=True, leaves_only=True)
    return {t.untyped_storage().data_ptr() for t in leaves if t.untyped_storage().nbytes()}


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize(
    ("kind", "keeps"),
    [("new", False), ("view", True), ("zero_byte", True)],
)
def test_one_leaf_among_the_input_s_leaves_and_views_decides(nested: bool, where: str, kind: str, keeps: bool) -> None:
    """A result of the input's own leaves, views of them and one other leaf, wherever it sits: a new
    storage holding data drops the tags, a view of an input leaf or a zero-byte tensor keeps them."""
    td = _wide(nested).share_memory()
    data = td.to_dict()
    level = data["sub"] if nested else data
    names = sorted(level)
    for name in names[1::2]:
        level[name] = level[name][:]  # views of the input's leaves, other tensors on its storages
    other = {"new": torch.ones(2), "view": td["k00"][1:].expand(2), "zero_byte": torch.zeros(2, 0)}[kind]
    level[names[{"first": 0, "middle": len(names) // 2, "last": -1}[where]]] = other
    built = tt.TensorDict(data, batch_size=[2])
    out = tag_rule(lambda x: built)(td)
    assert (_data_ptrs(out) <= _data_ptrs(td)) is keeps  # the storage rule, told by addresses
    assert tag_sets(out) == {td.tags if keeps else frozenset()}
    assert all(a is b for a, b in zip(out.values(True, True), built.values(True, True)))


def test_a_result_holding_the_input_s_sub_nodes_carries_the_input_s_tags_everywhere() -> None:
    """A result holding an input's sub-node as it is holds its leaves: it keeps the tags common to the
    inputs, on every sub-node, also when the input's sub-nodes carried others."""
    td = _shared()
    out = td.exclude("a")
    assert out["n"] is td["n"] and tag_sets(out) == {SL}
    root = tt.TensorDict[tt.Locked]
    shared_sub = td["n"]
    mixed = make_tagged(root, {"b": td["b"], "n": shared_sub}, (("b", "n"), torch.Size([2]), None, root._tags))
    assert tag_sets(mixed) == {frozenset({tt.Locked}), SL}
    out = mixed.exclude("b")
    assert tag_sets(out) == {frozenset({tt.Locked})}
    assert out["n", "c"] is td["n", "c"]
    untagged_sub = make_tagged(root, {"b": td["b"], "n": _plain()["n"]}, mixed._meta)
    assert tag_sets(untagged_sub.exclude("b")) == {frozenset({tt.Locked})}  # the input's leaves, retagged


@pytest.mark.parametrize(
    ("last", "keeps"),
    [
        (lambda x: torch.ones(2), False),
        (lambda x: torch.zeros(2, 0), True),
        (lambda x: x["n", "c"][:, 0], True),
    ],
    ids=["new", "zero_byte", "view"],
)
def test_two_inputs_a_view_of_the_second_first_then_what_decides(last, keeps: bool) -> None:
    """With two inputs, a first other leaf on the second input's storage does not end the search: the
    leaves after it still decide."""
    a, b = _shared(), _shared()

    @tag_rule
    def build(x: tt.TensorDict, y: tt.TensorDict) -> tt.TensorDict:
        return tt.TensorDict({"a": y["a"][:, :2], "b": x["b"], "z": last(x)}, batch_size=[2])

    out = build(a, b)
    assert (_data_ptrs(out) <= _data_ptrs(a) | _data_ptrs(b)) is keeps
    assert tag_sets(out) == {SL if keeps else frozenset()}


def test_a_node_given_twice_is_one_input() -> None:
    td = _shared()
    assert type(_first(td, td)) is type(td)
    assert tag_sets(td.apply(lambda x, y: y[:1], td, batch_size=[1])) == {SL}
    assert tag_sets(td + td) == {frozenset()}
    assert tag_sets(td.apply(lambda x, y: x.view_as(y), td.clone())) == {frozenset()}  # another node


class _Sub(tt.TensorDict):
    pass


class _SubSub(_Sub):
    pass


@pytest.mark.parametrize("cls", [_Sub, _SubSub])
def test_a_subclass_tagged_type_is_its_parents_tagged_type(cls: type[tt.TensorDict]) -> None:
    node = cls({"a": torch.zeros(2)}, batch_size=[2])
    locked, shared = node.lock(), node.share_memory()
    assert type(locked) is cls[tt.Locked] and type(shared) is cls[tt.Locked, tt.Shared]
    for parent in cls.__mro__:
        if parent.__dict__.get("_root") is parent:  # every node root type above cls, cls itself too
            assert isinstance(locked, parent[tt.Locked]) and isinstance(locked, parent)
            assert isinstance(shared, parent[tt.Shared]) and isinstance(shared, parent[tt.Locked, tt.Shared])
            assert not isinstance(locked, parent[tt.Shared])
    assert isinstance(locked, tt.TensorDict[tt.Locked])
    assert not isinstance(tt.TensorDict({}).lock(), cls)
    assert type(locked.select("a")) is cls[tt.Locked]  # the rule keeps the subclass
    assert type(locked.unlock()) is cls


_RESULTS: dict[str, Callable[[tt.TensorDict], tt.TensorDict]] = {
    "own": lambda node: node.select("a", "n"),
    "view": lambda node: node[:1],
    "new": lambda node: node.clone(),
    "flat_view": lambda node: node.exclude("n")[:1],
}


@pytest.mark.parametrize("result", sorted(_RESULTS))
@pytest.mark.parametrize(
    "other",
    [1.0, "b", ("n", "c"), None, torch.ones(2), {"b": torch.ones(2)}, "plain", "locked", "same", "in_a_list"],
)
@pytest.mark.parametrize("where", ["positional", "starred", "keyword", "double_starred"])
def test_every_route_of_the_gate_decides_by_the_rule(result: str, other, where: str) -> None:
    """The wrapper's routes (every argument by type, a tagged node first and the others holding no
    node, the walk of every argument) decide as the rule does: the tags common to the node inputs,
    wherever they are passed, kept when the result's storages are theirs."""
    td = _shared()
    nodes = {"plain": _plain(), "locked": _plain().lock(), "same": td, "in_a_list": _plain().lock()}
    node = nodes.get(other) if isinstance(other, str) else None
    arg = [node] if other == "in_a_list" else other if node is None else node
    inputs = [td] if node is None else [td, node]

    @tag_rule
    def positional(x: tt.TensorDict, y: object) -> tt.TensorDict:
        return _RESULTS[result](x)

    @tag_rule
    def starred(x: tt.TensorDict, *ys: object) -> tt.TensorDict:
        return _RESULTS[result](x)

    @tag_rule
    def keyword(x: tt.TensorDict, *, y: object = None) -> tt.TensorDict:
        return _RESULTS[result](x)

    @tag_rule
    def double_starred(x: tt.TensorDict, **ys: object) -> tt.TensorDict:
        return _RESULTS[result](x)

    call = {
        "positional": lambda: positional(td, arg),
        "starred": lambda: starred(td, 1, arg),
        "keyword": lambda: keyword(td, y=arg),
        "double_starred": lambda: double_starred(td, z=arg),
    }[where]
    out = call()
    owned = set().union(*(_data_ptrs(n) for n in inputs))
    common = frozenset.intersection(*(n.tags for n in inputs))
    assert tag_sets(out) == {common if _data_ptrs(out) <= owned else frozenset()}


def _returning(out: tt.TensorDict) -> Callable[[tt.TensorDict], tt.TensorDict]:
    """An operation of one node input that returns ``out``, whatever it is given."""
    return tag_rule(lambda x: out)


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_a_wide_result_of_the_input_s_entries_keeps_the_tags_at_any_key(nested: bool) -> None:
    """A result of the input's own leaves and sub-nodes keeps the tags whether they sit at their own
    keys (select, exclude), at other keys, or one stands in for another; one copy among them drops."""
    td = _wide(nested).share_memory()
    entries = dict(td.items())
    names = sorted(entries)
    same = tt.TensorDict({k: entries[k] for k in names[1:]}, batch_size=[2])
    elsewhere = tt.TensorDict({f"m{i}": entries[k] for i, k in enumerate(reversed(names))}, batch_size=[2])
    swapped = tt.TensorDict({**entries, names[0]: entries[names[1]]}, batch_size=[2])
    copied = tt.TensorDict({**entries, names[-1]: entries[names[-1]].clone()}, batch_size=[2])
    for built, keeps in [(same, True), (elsewhere, True), (swapped, True), (copied, False)]:
        out = _returning(built)(td)
        assert tag_sets(out) == {SL if keeps else frozenset()}
        assert all(a is b for a, b in zip(out.values(True, True), built.values(True, True)))
    assert tag_sets(td.exclude(names[0])) == {SL}


def test_a_new_tensor_among_sub_nodes_drops_the_tags_at_every_level() -> None:
    """A new tensor holding data after sub-nodes (a new one of views, or the input's own, tagged)
    drops the tags from the result and from every sub-node in it; the leaves stay the ones given."""
    td = _shared()
    views = {"c": td["n", "c"][:1].expand(2, 1)}
    for built in (
        tt.TensorDict({"m": views, "z": torch.ones(2)}, batch_size=[2]),
        tt.TensorDict({"m": {"m": views}, "z": torch.ones(2)}, batch_size=[2]),
    ):
        out = _returning(built)(td)
        assert tag_sets(out) == {frozenset()}
        assert all(a is b for a, b in zip(out.values(True, True), built.values(True, True)))
    shared = td.unlock()  # Shared alone: set is allowed, and the result holds the input's sub-node
    out = shared.set("z", torch.ones(2))
    assert tag_sets(shared) == {frozenset({tt.Shared})} and tag_sets(out) == {frozenset()}
    assert out["n", "c"] is td["n", "c"]


def _chain(depth: int) -> dict:
    """A nested dict ``depth`` levels deep, two leaves at each level and the next level under "n"."""
    top: dict = {}
    level = top
    for i in range(depth):
        level["a"], level["b"] = torch.full((2,), float(i)), torch.full((2, 3), float(i))
        if i < depth - 1:
            level = level.setdefault("n", {})
    return top


@pytest.mark.parametrize("depth", [1, 3, 70], ids=["flat", "nested", "past_the_recursion"])
@pytest.mark.parametrize("at", ["root", "middle", "deepest"])
@pytest.mark.parametrize(("kind", "keeps"), [("new", False), ("view", True), ("zero_byte", True)])
def test_a_result_of_views_is_decided_by_a_leaf_at_any_level(depth: int, at: str, kind: str, keeps: bool) -> None:
    """A result whose first leaves are views of the input's (an index, a reshape: the one walk that
    tests every level's storages as it builds the tagged tree) is decided by one other leaf wherever it
    sits, also below the levels retagged by recursion: a new storage holding data drops the tags at
    every level, a view or a zero-byte tensor keeps them."""
    td = tt.TensorDict(_chain(depth), batch_size=[2]).share_memory()
    data = td.to_dict()
    levels = [data]
    while "n" in levels[-1]:
        levels.append(levels[-1]["n"])
    for level in levels:
        level["a"], level["b"] = level["a"][:], level["b"][:]
    level = levels[{"root": 0, "middle": depth // 2, "deepest": depth - 1}[at]]
    level["b"] = {"new": torch.ones(2, 3), "view": level["b"][:, :1].expand(2, 3), "zero_byte": torch.zeros(2, 0)}[kind]
    built = tt.TensorDict(data, batch_size=[2])
    out = _returning(built)(td)
    assert (_data_ptrs(out) <= _data_ptrs(td)) is keeps  # the storage rule, told by addresses
    assert tag_sets(out) == {td.tags if keeps else frozenset()}
    assert all(a is b for a, b in zip(out.values(True, True), built.values(True, True)))


class _Abstract(tt.TensorDict, metaclass=abc.ABCMeta):
    """A root type with a metaclass of its own: its variants' metaclass is one of the two."""


_TAG_SETS = [tags for n in (1, 2, 3) for tags in itertools.combinations([tt.Locked, tt.Shared, tt.Memmap], n)]


# torch warns on unpickling any of its tree specs (a plain dict's too)
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
@pytest.mark.parametrize("root", [tt.TensorDict, _Sub, _Abstract])
@pytest.mark.parametrize("tags", _TAG_SETS, ids=lambda tags: "+".join(t.name for t in tags))
def test_a_tagged_type_pickles_as_itself_and_so_do_the_tree_specs_holding_it(root: type, tags: tuple) -> None:
    """A tagged type pickles by its root and tags at every protocol, so a tree spec of a tagged node
    (optree's, torch's) pickles too; unpickled, it is the same type, and the spec the same spec."""
    cls = root[tags]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(cls, protocol)) is cls
    node = make_tagged(cls, {"a": torch.zeros(2)}, (("a",), torch.Size([2]), None, frozenset(tags)))
    assert type(node) is cls
    for spec in (optree.tree_structure(node, namespace="tdtree"), torch_pytree.tree_structure(node)):
        again = pickle.loads(pickle.dumps(spec))
        assert again == spec
        assert again.unflatten([torch.ones(2)])["a"].tolist() == [1.0, 1.0]


def test_a_tagged_type_unpickles_in_a_process_that_never_made_it() -> None:
    """The variant is made again on unpickling, in a process where no node carried those tags."""
    data = pickle.dumps(tt.TensorDict[tt.Locked, tt.Memmap])
    code = f"import pickle; cls = pickle.loads({data!r}); print(cls.__name__, cls._root.__name__)"
    run = fresh_python(code, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["TensorDict[Locked,", "Memmap]", "TensorDict"]
