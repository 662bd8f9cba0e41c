"""Every row of the README's migration table: the tensordict spelling and the tdtree one, on the same data.

Each test runs both sides and compares what they give; the differences the
README lists as deliberate are asserted as differences.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
import torch

import tdtree as tt
import tdtree.nn
from tdtree.testing import assert_equal

tensordict = pytest.importorskip("tensordict", reason="tensordict is not installed: pip install tensordict")
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule, TensorDictSequential  # noqa: E402


def _data() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"obs": torch.randn(4, 3, generator=g), "next": {"reward": torch.randn(4, 1, generator=g)}}


def _pair() -> tuple[Any, tt.TensorDict]:
    """A tensordict and a tdtree node holding the same (separate) tensors."""
    d = _data()
    td = TensorDict({"obs": d["obs"].clone(), "next": {"reward": d["next"]["reward"].clone()}}, batch_size=[4])
    return td, tt.TensorDict(d, batch_size=[4])


def same(td: Any, node: tt.TensorDict) -> None:
    """``td`` (a tensordict) holds what ``node`` holds: keys, nesting, batch sizes, values."""
    assert_equal(tt.from_tensordict(td), node, check_tags=False)


def test_constructor() -> None:
    d = _data()
    same(TensorDict(d, batch_size=[4]), tt.TensorDict(d, batch_size=[4]))


def test_from_dict_infers_the_batch_size() -> None:
    d = _data()
    same(TensorDict.from_dict(d, auto_batch_size=True), tt.TensorDict.from_dict(d))
    assert TensorDict.from_dict(d, auto_batch_size=False).batch_size == ()  # the default differs on purpose


Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Step:
    obs: torch.Tensor
    pos: Point


def test_from_dataclass() -> None:
    step = Step(obs=torch.randn(4, 3), pos=Point(x=torch.zeros(4, 2), y=torch.ones(4)))
    same(TensorDict.from_dataclass(step, auto_batch_size=True), tt.TensorDict.from_dataclass(step))


def test_from_namedtuple_and_to_namedtuple() -> None:
    nt = Point(x=torch.zeros(3, 2), y=Point(x=torch.ones(3), y=torch.arange(3)))
    td, node = TensorDict.from_namedtuple(nt, auto_batch_size=True), tt.TensorDict.from_namedtuple(nt)
    same(td, node)
    theirs, ours = td.to_namedtuple(), node.to_namedtuple()
    assert ours._fields == theirs._fields == ("x", "y")
    assert ours.x is theirs.x and ours.y.x is theirs.y.x and ours.y.y is theirs.y.y


def test_setitem_is_set() -> None:
    td, node = _pair()
    x = torch.full((4, 2), 7.0)
    td["act"] = x
    td["next", "done"] = torch.zeros(4, 1, dtype=torch.bool)
    new = node.set("act", x).set(("next", "done"), torch.zeros(4, 1, dtype=torch.bool))
    same(td, new)
    assert "act" not in node


def test_update_returns_the_updated_node() -> None:
    td, node = _pair()
    d = {"act": torch.ones(4, 2), "next": {"done": torch.ones(4, 1)}}
    td.update(d)
    same(td, node.update(d))


def test_set_inplace_is_update_inplace() -> None:
    td, node = _pair()
    x = torch.full((4, 3), 2.0)
    obs = node["obs"]
    td.set_("obs", x)
    assert node.update_({"obs": x}) is node and node["obs"] is obs
    same(td, node)


@pytest.mark.parametrize("idx", [0, slice(1, 3), torch.tensor([True, False, True, False])])
def test_setitem_at_index_is_at_set(idx: Any) -> None:
    td, node = _pair()
    other_td, other = _pair()
    other_td, other = other_td[idx] * 0 - 1, other[idx] * 0 - 1
    td[idx] = other_td
    same(td, node.at[idx].set(other))
    assert node.at[idx].set_(other) is node
    same(td, node)


def test_del_and_pop_are_exclude() -> None:
    td, node = _pair()
    popped = td.pop(("next", "reward"))
    x, rest = node["next", "reward"], node.exclude(("next", "reward"))
    assert torch.equal(popped, x)
    same(td, rest)
    del td["next"]
    same(td, rest.exclude("next"))


def test_rename_key() -> None:
    td, node = _pair()
    td.rename_key_("obs", "observation")
    td.rename_key_(("next", "reward"), ("next", "r"))
    same(td, node.rename({"obs": "observation", ("next", "reward"): ("next", "r")}))


def test_setdefault_returns_the_node() -> None:
    td, node = _pair()
    v = torch.zeros(4, 5)
    x = td.setdefault("act", v)
    node = node.setdefault("act", v)
    assert x is node["act"] is v
    same(td, node)


def test_lock_and_unlock() -> None:
    td, node = _pair()
    td.lock_()
    locked = node.lock()
    assert td.is_locked and locked.is_locked and not node.is_locked
    with pytest.raises(RuntimeError, match="locked"):
        td["obs"] = torch.zeros(4, 3)
    with pytest.raises(tt.LockedError):
        locked.set("obs", torch.zeros(4, 3))
    td.unlock_()
    assert not td.is_locked and not locked.unlock().is_locked


def test_locked_refuses_editors_and_takes_in_place_writes() -> None:
    td, node = _pair()
    td.lock_()
    locked = node.lock()
    for edit in (
        lambda: td.__setitem__("obs", torch.zeros(4, 3)),
        lambda: td.update({"obs": torch.zeros(4, 3)}),
        lambda: td.rename_key_("obs", "o"),
        lambda: td.setdefault("new", torch.zeros(4)),
    ):
        with pytest.raises(RuntimeError, match="locked"):
            edit()
    for edit in (
        lambda: locked.set("obs", torch.zeros(4, 3)),
        lambda: locked.update({"obs": torch.zeros(4, 3)}),
        lambda: locked.rename({"obs": "o"}),
        lambda: locked.setdefault("new", torch.zeros(4)),
        lambda: locked.at[0].set(locked[0]),
    ):
        with pytest.raises(tt.LockedError):
            edit()
    td.update_({"obs": torch.ones(4, 3)})
    td[0] = td[0] * 0
    assert locked.update_({"obs": torch.ones(4, 3)}) is locked
    assert locked.at[0].set_(locked[0] * 0) is locked
    same(td, locked)


def test_share_memory() -> None:
    td, node = _pair()
    td.share_memory_()
    shared = node.share_memory()
    assert td.is_shared() and shared.is_shared and not node.is_shared
    assert all(v.is_shared() for v in shared.values(include_nested=True, leaves_only=True))
    assert not node["obs"].is_shared()  # a copy: the input stays where it was
    assert td.is_locked and shared.is_locked
    same(td, shared)


def test_memmap_and_load_memmap(tmp_path: Any) -> None:
    td, node = _pair()
    td.memmap_(prefix=tmp_path / "td")
    mapped = node.memmap(tmp_path / "tt")
    assert td.is_memmap() and mapped.is_memmap
    same(TensorDict.load_memmap(tmp_path / "td"), tt.load_memmap(tmp_path / "tt"))
    loaded = TensorDict.load_memmap(tmp_path / "td")
    converted = tt.from_tensordict(loaded)
    assert converted.is_memmap and converted.is_locked == loaded.is_locked
    assert_equal(converted, tt.load_memmap(tmp_path / "tt"), check_tags=False)


def test_iteration_is_over_keys_unbind_walks_the_batch() -> None:
    td, node = _pair()
    rows_td, rows = list(td), list(node.unbind(0))
    assert len(rows_td) == len(rows) == 4
    for a, b in zip(rows_td, rows):
        same(a, b)
    assert list(node) == ["next", "obs"] and len(node) == 2  # a mapping, on purpose
    assert len(td) == 4


def test_len_counts_keys_and_a_dataset_is_as_dataset() -> None:
    from torch.utils.data import DataLoader, RandomSampler

    td, node = _pair()
    assert len(td) == 4 and len(node) == 2 and len(node.as_dataset()) == 4  # the difference, on purpose

    def sampler(ds: Any) -> RandomSampler:
        return RandomSampler(ds, generator=torch.Generator().manual_seed(0))

    theirs = list(DataLoader(td, batch_size=3, sampler=sampler(td), collate_fn=lambda x: x))
    ours = list(DataLoader(node.as_dataset(), batch_size=3, sampler=sampler(node.as_dataset())))
    mini = list(tt.data.minibatches(node, 3, generator=torch.Generator().manual_seed(0)))
    assert len(theirs) == len(ours) == len(mini) == 2
    for a, b, c in zip(theirs, ours, mini, strict=True):
        same(a, b)
        same(a, c)


def test_memmap_like(tmp_path: Any) -> None:
    td, node = _pair()
    theirs = td.memmap_like(tmp_path / "td")
    ours = node.memmap_like(tmp_path / "tt")
    assert theirs.is_memmap() and theirs.is_locked and ours.tags == {tt.Memmap, tt.Locked}
    same(theirs, ours)  # zeros of the same keys, shapes and dtypes
    spec = node.apply(lambda x: torch.empty_like(x, device="meta"))
    same(theirs, spec.memmap_like(tmp_path / "spec"))


def test_stack_and_cat() -> None:
    (td1, n1), (td2, n2) = _pair(), _pair()
    same(torch.stack([td1, td2], 1), torch.stack([n1, n2], 1))
    same(torch.stack([td1, td2], 1), tt.stack([n1, n2], 1))
    same(torch.cat([td1, td2]), tt.cat([n1, n2]))


def _policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


class _Step(tt.TensorClass):
    obs: torch.Tensor
    reward: torch.Tensor
    phase: str = "train"


def test_tensorclass_field_write_is_replace() -> None:
    @tensordict.tensorclass
    class Step:
        obs: torch.Tensor
        reward: torch.Tensor
        phase: str

    d = _data()
    theirs = Step(obs=d["obs"].clone(), reward=d["next"]["reward"].clone(), phase="train", batch_size=[4])
    ours = _Step(obs=d["obs"], reward=d["next"]["reward"], batch_size=[4])
    new_reward = torch.ones(4, 1)
    theirs.reward = new_reward.clone()
    edited = ours.replace(reward=new_reward)
    assert ours.reward is d["next"]["reward"]
    assert_equal(tt.from_tensordict(theirs, cls=_Step).to_node(), edited.to_node(), check_tags=False)
    assert tt.from_tensordict(theirs, cls=_Step).phase == edited.phase == "train"


def test_td_module() -> None:
    td, node = _pair()
    module = _policy()
    out_td = TensorDictModule(module, in_keys=["obs"], out_keys=[("out", "act")])(td)
    out = tdtree.nn.TDModule(module, in_keys=["obs"], out_keys=[("out", "act")])(node)
    same(out_td, out)
    assert "out" not in node  # a new node: the input is unchanged


def test_td_sequential() -> None:
    td, node = _pair()
    a, b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    out_td = TensorDictSequential(TensorDictModule(a, ["obs"], ["h"]), TensorDictModule(b, ["h"], ["act"]))(td)
    out = tdtree.nn.TDSequential(tdtree.nn.TDModule(a, ["obs"], ["h"]), tdtree.nn.TDModule(b, ["h"], ["act"]))(node)
    same(out_td, out)


def test_from_module() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    theirs, ours = TensorDict.from_module(model), tdtree.nn.from_module(model)
    same(theirs, ours)
    assert ours["0", "weight"] is model[0].weight


def test_to_module_is_functional_call() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    theirs = TensorDict.from_module(model).apply(torch.zeros_like)
    ours = tdtree.nn.from_module(model).apply(torch.zeros_like)
    with theirs.to_module(model):
        out_td = model(x)
    out = tdtree.nn.functional_call(model, ours, x)
    assert torch.equal(out_td, out) and torch.equal(out, torch.zeros(5, 2))
    assert not torch.equal(model(x), out)  # the module kept its own weights


def test_is_shared_and_is_memmap_are_properties() -> None:
    td, node = _pair()
    assert td.is_shared() is node.is_shared is False
    assert td.is_memmap() is node.is_memmap is False


# -- behaviours that differ on purpose ---------------------------------------------------------


def test_keys_are_sorted_where_tensordict_keeps_insertion_order() -> None:
    d = {"b": torch.zeros(2), "a": torch.zeros(2)}
    assert list(TensorDict(d, [2]).keys()) == ["b", "a"]
    assert list(tt.TensorDict(d, [2]).keys()) == ["a", "b"]


def test_views_of_a_locked_node_stay_locked() -> None:
    td, node = _pair()
    assert not td.lock_()[0].is_locked
    assert node.lock()[0].is_locked
    assert not node.lock().clone().tags


def test_unlock_keeps_shared() -> None:
    td, node = _pair()
    assert not td.share_memory_().unlock_().is_shared()
    assert node.share_memory().unlock().tags == {tt.Shared}


def test_device_is_inferred_where_tensordict_keeps_none() -> None:
    td, node = _pair()
    assert td.device is None
    assert node.device == torch.device("cpu")
    assert tt.from_tensordict(td).device == torch.device("cpu")


def test_only_tensors_are_leaves() -> None:
    td = TensorDict({"obs": torch.zeros(2), "name": "cartpole"}, batch_size=[2])
    assert td["name"] == "cartpole"
    with pytest.raises(TypeError, match="'name' is a str"):
        tt.TensorDict({"obs": torch.zeros(2), "name": "cartpole"}, batch_size=[2])
    with pytest.raises(TypeError, match="'name' is tensordict non-tensor data"):
        tt.from_tensordict(td)
