"""Key operations: lookup, editors, select/exclude, flatten/unflatten, dict conversion."""

from __future__ import annotations

import re

import pytest
import torch

import tdtree as tt
from tdtree.errors import BatchSizeError, KeyCollisionError, KeyNotFoundError, LockedError, NotANodeKeyError
from tdtree.testing import assert_equal


@pytest.fixture
def td() -> tt.TensorDict:
    return tt.TensorDict(
        {"obs": torch.randn(4, 3), "next": {"reward": torch.randn(4, 1), "done": torch.zeros(4, 1, dtype=torch.bool)}},
        batch_size=[4],
    )


def test_get_forms(td: tt.TensorDict) -> None:
    assert td.get("obs") is td["obs"] is td[("obs",)]
    assert td.get(("next", "reward")) is td["next", "reward"] is td["next"]["reward"]
    assert td.get("missing", None) is None
    assert td.get(("next", "missing"), 3) == 3


def test_missing_key_error_names_key_keys_and_matches(td: tt.TensorDict) -> None:
    with pytest.raises(
        KeyNotFoundError, match=r"key 'ob' not found; the keys here are: 'next', 'obs'\. Did you mean 'obs'"
    ) as err:
        td["ob"]
    assert isinstance(err.value, KeyError) and err.value.key == "ob"
    with pytest.raises(KeyNotFoundError, match=r"\('next', 'rewad'\) not found.*Did you mean \('next', 'reward'\)"):
        td.get(("next", "rewad"))


def test_key_through_a_tensor(td: tt.TensorDict) -> None:
    with pytest.raises(NotANodeKeyError, match="'obs' is a tensor, not a node"):
        td["obs", "x"]


def test_key_through_a_tensor_whatever_its_attributes(td: tt.TensorDict) -> None:
    # a leaf is never walked into, even one carrying a mapping under a node's slot name
    leaf = torch.zeros(4, 3)
    leaf._data = {"x": torch.ones(4)}
    node = td.set("obs", leaf)
    with pytest.raises(NotANodeKeyError, match="'obs' is a tensor, not a node"):
        node["obs", "x"]
    assert node.get(("obs", "x"), None) is None
    assert ("obs", "x") not in node and ("obs", "x") not in node.keys(True)


class Name(str):
    """A str subclass: equal to the key it spells, yet not a key."""


@pytest.mark.parametrize(
    "key, message",
    [
        (("next", Name("reward")), "every part of a nested key must be a str, got Name 'reward'"),
        ((Name("obs"),), "every part of a nested key must be a str, got Name 'obs'"),
        (("next", 1), "every part of a nested key must be a str, got int 1"),
        (("nope", 1), "every part of a nested key must be a str, got int 1"),
        (("next", ["reward"]), "every part of a nested key must be a str, got list"),
        ((), "the empty tuple is not a key"),
        (["next", "reward"], "keys are str or tuples of str, got list"),
        (3, "keys are str or tuples of str, got int 3"),
    ],
)
def test_get_refuses_what_is_not_a_key_even_with_a_default(td: tt.TensorDict, key: object, message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        td.get(key)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape(message)):
        td.get(key, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key, message",
    [
        (("next", Name("reward")), "got Name 'reward'"),
        ((Name("obs"),), "got Name 'obs'"),
        (("next", 1), "got int 1"),
        ((), "the empty tuple is not a key"),
        (3, "got int 3"),
    ],
)
@pytest.mark.parametrize("op", ["select", "exclude"])
def test_select_and_exclude_of_one_key_refuse_what_is_not_a_key(
    td: tt.TensorDict, op: str, key: object, message: str
) -> None:
    for strict in (True, False):
        with pytest.raises(TypeError, match=re.escape(message)):
            getattr(td, op)(key, strict=strict)


@pytest.mark.parametrize("op", ["select", "exclude"])
def test_select_and_exclude_of_one_deep_key_name_where_it_stops(op: str) -> None:
    td = tt.TensorDict({"a": {"b": {"c": torch.zeros(2), "x": torch.ones(2)}}}, [2])
    with pytest.raises(KeyNotFoundError, match=re.escape("('a', 'b', 'nope')")):
        getattr(td, op)(("a", "b", "nope"))
    with pytest.raises(NotANodeKeyError, match=re.escape("('a', 'b', 'c')")):
        getattr(td, op)(("a", "b", "c", "d"))
    assert list(td.exclude(("a", "b", "nope"), strict=False).keys(True, True)) == [("a", "b", "c"), ("a", "b", "x")]
    assert list(td.select(("a", "b", "c", "d"), strict=False).keys(True, True)) == []


def test_keys_values_items_flags(td: tt.TensorDict) -> None:
    assert list(td.keys()) == ["next", "obs"]
    assert list(td.keys(include_nested=True)) == ["next", ("next", "done"), ("next", "reward"), "obs"]
    assert list(td.keys(include_nested=True, leaves_only=True)) == [("next", "done"), ("next", "reward"), "obs"]
    assert list(td.keys(leaves_only=True)) == ["obs"]
    assert td.keys(True) == {"next", ("next", "done"), ("next", "reward"), "obs"}
    vals = list(td.values(include_nested=True, leaves_only=True))
    assert vals[0] is td["next", "done"] and vals[2] is td["obs"]
    items = dict(td.items(include_nested=True))
    assert items["next"] is td["next"] and items[("next", "reward")] is td["next", "reward"]
    assert list(td.values()) == [td["next"], td["obs"]]


def test_set_returns_new_node_and_shares_structure(td: tt.TensorDict) -> None:
    x = torch.ones(4, 2)
    out = td.set(("next", "extra"), x)
    assert out["next", "extra"] is x
    assert "extra" not in td["next"]
    assert out["obs"] is td["obs"]
    assert out["next", "reward"] is td["next", "reward"]
    deep = td.set(("a", "b", "c"), torch.zeros(4))
    assert deep["a"].batch_size == torch.Size([4]) and deep["a", "b"].batch_size == torch.Size([4])
    assert list(deep.keys()) == ["a", "next", "obs"]


def test_set_keeps_keys_sorted_wherever_a_new_key_falls() -> None:
    base = tt.TensorDict({k: torch.zeros(()) for k in "bdf"}, ())
    for key, want in [("a", "abdf"), ("c", "bcdf"), ("e", "bdef"), ("g", "bdfg"), ("d", "bdf")]:
        out = base.set(key, torch.ones(()))
        assert list(out.keys()) == list(want) and out._meta[0] == tuple(want)
        assert list(base.keys()) == list("bdf")


def test_set_replaces_and_validates(td: tt.TensorDict) -> None:
    out = td.set("obs", torch.zeros(4, 7))
    assert out["obs"].shape == (4, 7)
    with pytest.raises(BatchSizeError, match=r"'obs' has shape \(3,\)"):
        td.set("obs", torch.zeros(3))
    with pytest.raises(KeyCollisionError, match=r"'obs' is a tensor, not a node"):
        td.set(("obs", "x"), torch.zeros(4))
    with pytest.raises(TypeError, match="keys are str or tuples of str"):
        td.set(1, torch.zeros(4))  # type: ignore[arg-type]


def test_set_dict_and_node_values(td: tt.TensorDict) -> None:
    out = td.set("d", {"x": torch.zeros(4, 2)})
    assert isinstance(out["d"], tt.TensorDict) and out["d"].batch_size == torch.Size([4])
    sub = td["next"].lock()
    again = td.set("copy", sub)
    assert type(again["copy"]) is tt.TensorDict


def test_setdefault(td: tt.TensorDict) -> None:
    assert td.setdefault("obs", torch.zeros(4)) is td
    out = td.setdefault("new", torch.zeros(4))
    assert "new" in out and "new" not in td


def test_update_merges_nested(td: tt.TensorDict) -> None:
    x = torch.ones(4, 5)
    out = td.update({"next": {"extra": x}, ("next", "reward"): torch.zeros(4, 1), "z": torch.zeros(4)})
    assert out["next", "extra"] is x
    assert out["next", "done"] is td["next", "done"]
    assert torch.equal(out["next", "reward"], torch.zeros(4, 1))
    assert list(out.keys()) == ["next", "obs", "z"]
    other = tt.TensorDict({"obs": torch.zeros(4, 3)}, [4])
    assert out.update(other)["obs"] is other["obs"]
    with pytest.raises(BatchSizeError, match="'z'"):
        td.update({"z": torch.zeros(5)})
    # a node's entries are taken unchecked only when its batch size and device are the node's own
    with pytest.raises(BatchSizeError, match="'z'"):
        td.update(tt.TensorDict({"z": torch.zeros(5)}))
    longer = tt.TensorDict({"obs": torch.zeros(4, 2)}, [4, 2])
    assert td.update(longer)["obs"] is longer["obs"]


def test_select_and_exclude(td: tt.TensorDict) -> None:
    s = td.select("obs", ("next", "reward"))
    assert list(s.keys(True)) == ["next", ("next", "reward"), "obs"]
    assert s["obs"] is td["obs"]
    assert list(td.select("next", ("next", "done")).keys(True)) == list(td.select("next").keys(True))
    assert list(td.select(("next", "done"), "next").keys(True)) == list(td.select("next").keys(True))
    e = td.exclude(("next", "reward"), ("next", "done"))
    assert list(e.keys(True)) == ["next", "obs"] and len(e["next"]) == 0
    assert list(td.exclude("next").keys()) == ["obs"]
    with pytest.raises(KeyNotFoundError, match="'nope'"):
        td.select("nope")
    with pytest.raises(KeyNotFoundError, match=r"\('next', 'nope'\)"):
        td.exclude(("next", "nope"))
    assert list(td.select("nope", "obs", strict=False).keys()) == ["obs"]
    assert list(td.exclude("nope", strict=False).keys()) == ["next", "obs"]
    with pytest.raises(NotANodeKeyError):
        td.select(("obs", "x"))


def test_rename(td: tt.TensorDict) -> None:
    out = td.rename({"obs": ("next", "obs"), ("next", "reward"): "reward"})
    assert out["next", "obs"] is td["obs"]
    assert out["reward"] is td["next", "reward"]
    assert "obs" not in out
    with pytest.raises(KeyCollisionError, match="'next' already exists"):
        td.rename({"obs": "next"})
    with pytest.raises(KeyNotFoundError, match="'zz'"):
        td.rename({"zz": "y"})
    with pytest.raises(KeyCollisionError, match="same key"):
        td.rename({"obs": "y", "next": "y"})
    swapped = td.rename({"obs": "next", "next": "obs"})
    assert swapped["next"] is td["obs"] and swapped["obs"]["reward"] is td["next", "reward"]


def test_flatten_and_unflatten_keys(td: tt.TensorDict) -> None:
    flat = td.flatten_keys()
    assert list(flat.keys()) == ["next.done", "next.reward", "obs"]
    assert flat["next.reward"] is td["next", "reward"]
    assert list(td.flatten_keys("/").keys()) == ["next/done", "next/reward", "obs"]
    back = flat.unflatten_keys()
    assert_equal(back, td)


def test_flatten_clash_and_empty_subnode() -> None:
    clash = tt.TensorDict({"a.b": torch.zeros(1), "a": {"b": torch.ones(1)}}, [1])
    with pytest.raises(KeyCollisionError, match=r"\('a', 'b'\) and 'a.b' both become 'a.b'|'a.b' and \('a', 'b'\)"):
        clash.flatten_keys()
    with_empty = tt.TensorDict({"a": {}, "b": torch.zeros(1)}, [1])
    assert list(with_empty.flatten_keys().keys()) == ["a", "b"]
    assert_equal(with_empty.flatten_keys().unflatten_keys(), with_empty)


def test_unflatten_clash_names_both() -> None:
    td = tt.TensorDict({"a": torch.zeros(1), "a.b": torch.zeros(1)}, [1])
    with pytest.raises(KeyCollisionError, match=r"'a' is a leaf and 'a.b' needs it to be a node"):
        td.unflatten_keys()


def test_unflatten_merges_into_existing_subnode() -> None:
    td = tt.TensorDict({"a": {"x": torch.zeros(2)}, "a.y": torch.ones(2)}, [2])
    out = td.unflatten_keys()
    assert list(out.keys(True)) == ["a", ("a", "x"), ("a", "y")]
    deeper = tt.TensorDict({"a": tt.TensorDict({"x": torch.zeros(2, 3)}, [2, 3]), "a.y": torch.ones(2)}, [2])
    with pytest.raises(BatchSizeError, match=r"'a.y' has shape \(2,\).*\(2, 3\)"):
        deeper.unflatten_keys()


def test_unflatten_splits_on_every_sep_so_empty_parts_round_trip() -> None:
    td = tt.TensorDict({"": {"a": torch.zeros(2), "": torch.ones(2)}, "b": {"": {"": torch.ones(2)}}}, [2])
    flat = td.flatten_keys()
    assert list(flat.keys()) == [".", ".a", "b.."]
    assert_equal(flat.unflatten_keys(), td)
    assert flat.unflatten_keys()["", "a"] is td["", "a"]


def test_unflatten_level_made_below_a_subnode_takes_its_batch_size() -> None:
    sub = tt.TensorDict({"x": torch.zeros(2, 3)}, [2, 3], device="cpu")
    out = tt.TensorDict({"a": sub, "a.n.y": torch.ones(2, 3, 4), "b.c": torch.ones(2)}, [2]).unflatten_keys()
    assert out["a"].batch_size == out["a", "n"].batch_size == (2, 3)
    assert out["b"].batch_size == (2,) and out["a", "n", "y"].shape == (2, 3, 4)
    with pytest.raises(BatchSizeError, match=r"'a.n.y' has shape \(2, 4\).*\(2, 3\) of 'a.n'"):
        tt.TensorDict({"a": sub, "a.n.y": torch.ones(2, 4)}, [2]).unflatten_keys()


@pytest.mark.parametrize("batch", [(), (3,), (3, 4), (3, 4, 2)])
def test_set_checks_every_batch_dim_of_the_value(batch: tuple[int, ...]) -> None:
    # up to two batch dims are compared one by one, more as a slice: both must refuse each wrong dim
    td = tt.TensorDict({"n": {}}, batch)
    fits = torch.zeros(*batch, 5)
    assert td.set("v", fits)["v"] is fits and td.set(("n", "v"), fits)["n", "v"] is fits
    for dim in range(len(batch)):
        wrong = list(batch)
        wrong[dim] += 1
        with pytest.raises(BatchSizeError, match=re.escape(f"which does not start with the batch_size {batch}")):
            td.set(("n", "v"), torch.zeros(*wrong, 5))
    if batch:
        with pytest.raises(BatchSizeError, match=re.escape(f"has shape {batch[:-1]}")):
            td.set("v", torch.zeros(batch[:-1]))


def test_update_of_existing_keys_keeps_the_order_and_new_keys_are_sorted(td: tt.TensorDict) -> None:
    out = td.update({"obs": torch.ones(4, 3), "next": {"done": torch.ones(4, 1)}})
    assert list(out.keys(True)) == list(td.keys(True))
    assert out["next", "reward"] is td["next", "reward"]
    grown = td.update({"nz": torch.ones(4), "next": {"aa": torch.ones(4)}})
    assert list(grown.keys(True)) == ["next", ("next", "aa"), ("next", "done"), ("next", "reward"), "nz", "obs"]


def test_rename_refuses_an_entry_that_does_not_fit_where_it_moves() -> None:
    td = tt.TensorDict({"a": torch.zeros(2), "n": tt.TensorDict({"x": torch.zeros(2, 3)}, [2, 3])}, [2])
    with pytest.raises(BatchSizeError, match=re.escape("('n', 'a')")):
        td.rename({"a": ("n", "a")})
    assert td.rename({("n", "x"): ("n", "y")})["n", "y"] is td["n", "x"]


def test_to_dict_and_from_dict(td: tt.TensorDict) -> None:
    d = td.to_dict()
    assert type(d) is dict and type(d["next"]) is dict and d["obs"] is td["obs"]
    assert_equal(tt.TensorDict.from_dict(d, batch_size=[4]), td)
    auto = tt.TensorDict.from_dict({"a": torch.zeros(4, 3, 2), "n": {"b": torch.zeros(4, 3)}})
    assert auto.batch_size == torch.Size([4, 3])
    assert auto["n"].batch_size == torch.Size([4, 3])
    single = tt.TensorDict.from_dict({"a": torch.zeros(4, 3)})
    assert single.batch_size == torch.Size([4, 3])
    deeper = tt.TensorDict.from_dict({"a": torch.zeros(4), "n": {"b": torch.zeros(4, 3), "c": torch.zeros(4, 3, 1)}})
    assert deeper.batch_size == torch.Size([4]) and deeper["n"].batch_size == torch.Size([4, 3])
    assert tt.TensorDict.from_dict({}).batch_size == torch.Size([])


def test_clone(td: tt.TensorDict) -> None:
    deep = td.clone()
    assert_equal(deep, td)
    assert deep["obs"] is not td["obs"]
    assert deep["obs"].untyped_storage().data_ptr() != td["obs"].untyped_storage().data_ptr()
    shallow = td.clone(recurse=False)
    # immutable sub-nodes are shared, as the leaves are: only the root is a new object
    assert shallow is not td and shallow["next"] is td["next"] and shallow["obs"] is td["obs"]
    assert shallow.batch_size == td.batch_size and shallow.device == td.device and type(shallow) is type(td)


def test_locked_editors_refuse_and_name_the_in_place_writers(td: tt.TensorDict) -> None:
    locked = td.lock()
    for call in (
        lambda: locked.set("a", torch.zeros(4)),
        lambda: locked.update({"a": torch.zeros(4)}),
        lambda: locked.rename({"obs": "o"}),
        lambda: locked.setdefault("a", torch.zeros(4)),
    ):
        with pytest.raises(LockedError, match=r"update_\(\), copy_\(\) or at\[idx\]\.set_\(\).*unlock\(\)"):
            call()
    assert isinstance(LockedError("set"), RuntimeError)
    assert type(locked.select("obs")) is tt.TensorDict[tt.Locked]
    assert type(locked.exclude("obs")) is tt.TensorDict[tt.Locked]
    assert type(locked.unlock().set("a", torch.zeros(4))) is tt.TensorDict


# -- many keys: the paths select / exclude / update / lock take for many top-level keys ---------------


def _many(n: int = 6) -> dict[str, torch.Tensor]:
    return {f"k{i}": torch.full((3, 2), float(i)) for i in range(n)}


class _Name(str):
    pass


@pytest.mark.parametrize("op", ["select", "exclude"])
def test_many_str_keys_match_the_dict_in_any_order(op: str) -> None:
    data = _many()
    td = tt.TensorDict(data, [3])
    keys = ("k4", "k0", "k2")  # not in sorted order
    out = getattr(td, op)(*keys)
    expected = {k: v for k, v in data.items() if (k in keys) == (op == "select")}
    assert list(out.keys()) == sorted(expected)
    assert all(out[k] is v for k, v in expected.items())
    assert out.batch_size == td.batch_size and out.device == td.device


@pytest.mark.parametrize("op", ["select", "exclude"])
def test_many_keys_name_a_missing_one_and_pass_it_over_when_not_strict(op: str) -> None:
    td = tt.TensorDict(_many(), [3])
    with pytest.raises(KeyNotFoundError, match="'nope'"):
        getattr(td, op)("k1", "nope", "k3")
    out = getattr(td, op)("k1", "nope", "k3", strict=False)
    assert sorted(out.keys()) == (["k1", "k3"] if op == "select" else ["k0", "k2", "k4", "k5"])


@pytest.mark.parametrize("op", ["select", "exclude"])
def test_many_keys_refuse_a_str_subclass_and_a_non_key(op: str) -> None:
    td = tt.TensorDict(_many(), [3])
    with pytest.raises(TypeError, match="keys are str"):
        getattr(td, op)("k1", _Name("k2"))
    with pytest.raises(TypeError, match="keys are str"):
        getattr(td, op)("k1", 3)


def test_many_keys_repeated_or_mixed_with_nested_ones() -> None:
    td = tt.TensorDict({**_many(3), "n": {"a": torch.zeros(3), "b": torch.ones(3)}}, [3])
    assert list(td.exclude("k1", "k1").keys()) == ["k0", "k2", "n"]
    assert list(td.select("k2", "k2", "k0").keys()) == ["k0", "k2"]
    mixed = td.select("k1", ("n", "b"))
    assert list(mixed.keys(include_nested=True)) == ["k1", "n", ("n", "b")]
    assert mixed["n", "b"] is td["n", "b"]
    assert list(td.exclude("k1", ("n", "a")).keys(include_nested=True)) == ["k0", "k2", "n", ("n", "b")]


def test_select_of_many_nested_keys_names_a_missing_or_leaf_path() -> None:
    td = tt.TensorDict({"g": {"a": torch.zeros(3), "b": torch.ones(3)}, "h": {"c": torch.zeros(3)}}, [3])
    out = td.select(("h", "c"), ("g", "b"), ("g", "a"))
    assert list(out.keys(include_nested=True)) == ["g", ("g", "a"), ("g", "b"), "h", ("h", "c")]
    with pytest.raises(KeyNotFoundError, match=re.escape("('g', 'z')")):
        td.select(("g", "a"), ("g", "z"))
    assert list(td.select(("g", "a"), ("g", "z"), strict=False).keys(include_nested=True)) == ["g", ("g", "a")]
    with pytest.raises(NotANodeKeyError):
        td.select(("g", "b"), ("g", "a", "x"))
    with pytest.raises(TypeError, match="every part"):
        td.select(("g", "a"), ("g", 1))


def test_update_from_a_dict_checks_and_moves_each_value_and_writes_nothing_on_refusal() -> None:
    data = _many(4)
    td = tt.TensorDict(data, [3], device="cpu")
    param = torch.nn.Parameter(torch.ones(3, 2))
    new = {"k1": torch.ones(3, 2), "k9": torch.ones(3), "k2": param}
    out = td.update(new)
    expected = {**data, **new}
    assert list(out.keys()) == sorted(expected)
    assert all(out[k] is v for k, v in expected.items())
    with pytest.raises(BatchSizeError, match="'k3'"):
        td.update({"k0": torch.ones(3), "k3": torch.ones(2, 2)})
    assert all(td[k] is v for k, v in data.items())
    with pytest.raises(TypeError, match="'k3'"):
        td.update({"k3": 1.0})


def test_update_from_a_dict_puts_dicts_and_nodes_in_and_merges_into_sub_nodes() -> None:
    td = tt.TensorDict({"a": torch.zeros(3), "n": {"x": torch.zeros(3)}}, [3])
    sub = tt.TensorDict({"y": torch.ones(3)}, [3]).lock()
    out = td.update({"a": torch.ones(3), "n": {"y": torch.ones(3)}, "m": sub, "d": {"z": torch.ones(3, 1)}})
    assert list(out.keys(include_nested=True)) == ["a", "d", ("d", "z"), "m", ("m", "y"), "n", ("n", "x"), ("n", "y")]
    assert out["m"].tags == frozenset() and out["m", "y"] is sub["y"]
    assert out["n", "x"] is td["n", "x"]


def test_lock_of_a_flat_node_with_a_tensor_subclass_and_of_each_level() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    flat = tt.TensorDict({"p": param, "t": torch.zeros(3)}, [3]).lock()
    assert flat.is_locked and flat["p"] is param
    nested = tt.TensorDict({"a": torch.zeros(3), "n": {"m": {"b": torch.zeros(3)}}}, [3]).lock()
    assert nested["n"].is_locked and nested["n", "m"].is_locked
