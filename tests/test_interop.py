"""from_tensordict / to_tensordict, records (dataclass, named tuple) and torch.export of nodes."""

from __future__ import annotations

import builtins
import collections
import dataclasses
import os
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from _tensordict_side import assert_same_tensordict, needs_tensordict, tensordict, tensordict_like
from conftest import CORPUS

import tdtree as tt
import tdtree.nn
from tdtree.testing import assert_equal


def _leaves_identical(a: Any, b: Any) -> None:
    la, lb = tt.tree.leaves(a), tt.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x is y


# -- round trips over the corpus -------------------------------------------------------------


@needs_tensordict
def test_tdtree_to_tensordict_and_back(corpus_td: tt.TensorDict) -> None:
    td = tt.to_tensordict(corpus_td)
    assert isinstance(td, tensordict.TensorDict)
    assert td.is_locked == corpus_td.is_locked
    back = tt.from_tensordict(td)
    assert_equal(back, corpus_td)
    _leaves_identical(back, corpus_td)
    for key, value in corpus_td.items(include_nested=True):
        if isinstance(value, tt.TensorDict):
            assert td.get(key).batch_size == value.batch_size
        else:
            assert td.get(key) is value


@needs_tensordict
def test_tensordict_to_tdtree_and_back(corpus_td: tt.TensorDict) -> None:
    td = tensordict_like(corpus_td)
    node = tt.from_tensordict(td)
    assert_equal(node, corpus_td)
    assert_same_tensordict(tt.to_tensordict(node), td)
    assert tt.to_tensordict(node).is_locked == td.is_locked


@needs_tensordict
def test_tensordict_key_order_and_device_none() -> None:
    # tensordict keeps insertion order and may leave device None over CPU leaves;
    # tdtree sorts keys and takes the device every leaf shares.
    b, a = torch.zeros(2), torch.ones(2, 3)
    td = tensordict.TensorDict({"b": b, "a": a}, batch_size=[2])
    assert td.device is None
    node = tt.from_tensordict(td)
    assert list(node.keys()) == ["a", "b"]
    assert node.device == torch.device("cpu")
    assert node["a"] is a and node["b"] is b
    assert list(tt.to_tensordict(node).keys()) == ["a", "b"]


# -- tags by storage ---------------------------------------------------------------------


@needs_tensordict
def test_locked_tensordict_is_locked_on_every_sub_node() -> None:
    td = tensordict_like(CORPUS["nested"]).lock_()
    node = tt.from_tensordict(td)
    assert node.tags == {tt.Locked} and node["next"].tags == {tt.Locked}
    assert not tt.from_tensordict(td.unlock_()).tags


@needs_tensordict
def test_shared_tensordict_maps_to_shared_and_locked() -> None:
    td = tensordict_like(CORPUS["nested"].clone()).share_memory_()
    assert td.is_shared() and td.is_locked
    node = tt.from_tensordict(td)
    assert node.tags == {tt.Shared, tt.Locked} and node["next"].tags == {tt.Shared, tt.Locked}
    assert_same_tensordict(tt.to_tensordict(node), td)
    assert tt.to_tensordict(node).is_shared()


@needs_tensordict
def test_stale_shared_flag_after_unlock_maps_by_storage() -> None:
    td = tensordict_like(CORPUS["flat"].clone()).share_memory_().unlock_()
    assert not td.is_shared()  # tensordict's flag went with the lock; the storages did not move
    assert all(v.is_shared() for v in td.values())
    assert tt.from_tensordict(td).tags == {tt.Shared}


@needs_tensordict
def test_shared_flag_needs_every_leaf_shared() -> None:
    shared, private = torch.zeros(3).share_memory_(), torch.zeros(3)
    assert not tt.from_tensordict(tensordict.TensorDict({"a": shared, "b": private}, [3])).tags
    assert tt.from_tensordict(tensordict.TensorDict({"a": shared}, [3])).tags == {tt.Shared}


@needs_tensordict
def test_tdtree_shared_node_round_trips_locked_or_not() -> None:
    node = CORPUS["nested"].share_memory()
    for n in (node, node.unlock()):
        td = tt.to_tensordict(n)
        assert td.is_locked == n.is_locked and td.is_shared() == n.is_locked
        back = tt.from_tensordict(td)
        assert_equal(back, n)
        _leaves_identical(back, n)


@needs_tensordict
def test_zero_byte_nodes_keep_tags_through_the_flags() -> None:
    # No storage holds data, so nothing can be checked and tensordict's flag decides.
    node = CORPUS["zero_size"].share_memory()
    back = tt.from_tensordict(tt.to_tensordict(node))
    assert back.tags == {tt.Shared, tt.Locked}
    assert not tt.from_tensordict(tt.to_tensordict(CORPUS["zero_size"])).tags


@needs_tensordict
def test_tensordict_memmap_maps_to_memmap(tmp_path: Any) -> None:
    td = tensordict_like(CORPUS["nested"]).memmap_(prefix=tmp_path / "td")
    node = tt.from_tensordict(td)
    assert node.tags == {tt.Memmap, tt.Locked} and node["next"].tags == {tt.Memmap, tt.Locked}
    assert node["obs"] is td["obs"] and type(node["obs"]) is type(td["obs"])
    assert_equal(node.unlock().clone(), CORPUS["nested"], check_tags=False)
    back = tt.to_tensordict(node)
    assert back.is_memmap() and not back.is_shared() and back.is_locked
    with pytest.raises(tt.errors.MemmapError, match="cannot pickle a Memmap node"):
        pickle.dumps(node)
    assert_equal(pickle.loads(pickle.dumps(node.unlock().clone())), CORPUS["nested"])


@needs_tensordict
def test_tensordict_memmap_without_prefix_is_not_file_backed_for_torch() -> None:
    td = tensordict_like(CORPUS["flat"]).memmap_()
    assert td.is_memmap()
    assert tt.from_tensordict(td).tags == {tt.Locked}


@needs_tensordict
@pytest.mark.parametrize("mode", ["r+", "r"])
def test_tdtree_memmap_round_trips(tmp_path: Any, mode: str) -> None:
    CORPUS["deep"].memmap(tmp_path / "m")
    node = tt.load_memmap(tmp_path / "m", mode=mode)
    td = tt.to_tensordict(node)
    assert td.is_memmap() and not td.is_shared()
    back = tt.from_tensordict(td)
    assert_equal(back, node)
    _leaves_identical(back, node)
    assert tt.from_tensordict(tt.to_tensordict(node.unlock())).tags == {tt.Memmap}


# -- tensorclass and what is refused -----------------------------------------------------------


@needs_tensordict
def test_tensordict_tensorclass_becomes_a_node() -> None:
    @tensordict.tensorclass
    class Inner:
        x: torch.Tensor

    @tensordict.tensorclass
    class Outer:
        a: torch.Tensor
        inner: Inner

    a, x = torch.randn(3, 2), torch.ones(3)
    tc = Outer(a=a, inner=Inner(x=x, batch_size=[3]), batch_size=[3])
    node = tt.from_tensordict(tc)
    assert node["a"] is a and node["inner", "x"] is x
    assert node.batch_size == (3,) and node["inner"].batch_size == (3,)
    inside = tt.from_tensordict(tensordict.TensorDict({"tc": tc}, [3]))
    assert inside["tc", "inner", "x"] is x


class _Inner(tt.TensorClass):
    y: torch.Tensor
    label: str = "inner"


class _Outer(tt.TensorClass):
    x: torch.Tensor
    inner: _Inner
    name: str = "outer"
    steps: int = 0


@needs_tensordict
@pytest.mark.parametrize("lock", [False, True])
def test_tdtree_tensorclass_to_tensordict_and_back(lock: bool) -> None:
    x, y = torch.randn(3, 2), torch.ones(3)
    tc = _Outer(x=x, inner=_Inner(y=y, label="in", batch_size=[3]), name="n", steps=7, batch_size=[3])
    tc = tc.lock() if lock else tc
    td = tt.to_tensordict(tc)
    assert td["x"] is x and td["inner", "y"] is y and td.is_locked == lock
    assert td.get_non_tensor("name") == "n" and td.get_non_tensor(("inner", "label")) == "in"
    assert td.get_non_tensor("steps") == 7
    back = tt.from_tensordict(td, cls=_Outer)
    assert type(back) is _Outer and type(back.inner) is _Inner
    assert back.x is x and back.inner.y is y
    assert (back.name, back.steps, back.inner.label) == ("n", 7, "in")
    assert back.tags == tc.tags and back.batch_size == (3,)


@needs_tensordict
def test_tensordict_tensorclass_to_a_tdtree_tensorclass() -> None:
    @tensordict.tensorclass
    class Theirs:
        y: torch.Tensor
        label: str

    y = torch.zeros(2)
    ours = tt.from_tensordict(Theirs(y=y, label="L", batch_size=[2]), cls=_Inner)
    assert type(ours) is _Inner and ours.y is y and ours.label == "L"
    defaults = tt.from_tensordict(tensordict.TensorDict({"y": y}, [2]), cls=_Inner)
    assert defaults.label == "inner"
    with pytest.raises(tt.FieldError, match="_Inner has no field 'x'"):
        tt.from_tensordict(tensordict.TensorDict({"x": y, "y": y}, [2]), cls=_Inner)
    with pytest.raises(TypeError, match="cls must be a tdtree tensorclass"):
        tt.from_tensordict(tensordict.TensorDict({"y": y}, [2]), cls=dict)


@needs_tensordict
def test_non_tensor_data_is_refused_naming_the_key() -> None:
    td = tensordict.TensorDict(
        {"a": torch.zeros(2), "s": {"name": tensordict.NonTensorData("hi", batch_size=[2])}}, [2]
    )
    with pytest.raises(TypeError, match=r"\('s', 'name'\).*tensors only"):
        tt.from_tensordict(td)


@needs_tensordict
def test_other_inputs_are_refused() -> None:
    lazy = tensordict.LazyStackedTensorDict(tensordict.TensorDict({"a": torch.zeros(2)}, [2]), stack_dim=0)
    with pytest.raises(TypeError, match="LazyStackedTensorDict.*to_tensordict"):
        tt.from_tensordict(lazy)
    with pytest.raises(TypeError, match="from_tensordict takes"):
        tt.from_tensordict({"a": torch.zeros(2)})
    with pytest.raises(TypeError, match="takes a tdtree node or tensorclass instance, got dict"):
        tt.to_tensordict({"a": torch.zeros(2)})


@pytest.mark.parametrize("fn", ["from_tensordict", "to_tensordict"])
def test_missing_tensordict_raises_import_error_with_the_fix(monkeypatch: pytest.MonkeyPatch, fn: str) -> None:
    real_import = builtins.__import__

    def no_tensordict(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tensordict" or name.startswith("tensordict."):
            raise ImportError("No module named 'tensordict'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensordict)
    with pytest.raises(ImportError, match=f"tdtree.{fn} needs .*pip install tensordict"):
        getattr(tt, fn)(CORPUS["flat"])


# -- records --------------------------------------------------------------------------------

Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Step:
    obs: torch.Tensor
    pos: Point
    extra: Any


@dataclasses.dataclass
class Info:
    reward: torch.Tensor


def test_from_dataclass_nests_records_and_infers_batch_size() -> None:
    obs, x, y, r = torch.randn(4, 3), torch.zeros(4, 2), torch.ones(4), torch.zeros(4, 1)
    node = tt.TensorDict.from_dataclass(Step(obs=obs, pos=Point(x=x, y=y), extra=Info(reward=r)))
    assert node["obs"] is obs and node["pos", "x"] is x and node["pos", "y"] is y and node["extra", "reward"] is r
    expected = tt.TensorDict.from_dict({"obs": obs, "pos": {"x": x, "y": y}, "extra": {"reward": r}})
    assert_equal(node, expected)
    assert node.batch_size == (4,) and node["extra"].batch_size == (4, 1)
    assert not node.tags


def test_from_dataclass_with_batch_size_and_device() -> None:
    node = tt.TensorDict.from_dataclass(Info(reward=torch.zeros(4, 1)), batch_size=[4], device="cpu")
    assert node.batch_size == (4,) and node.device == torch.device("cpu")


def test_from_namedtuple_and_to_namedtuple_round_trip() -> None:
    x, y = torch.zeros(3, 2), torch.ones(3)
    nt = Point(x=x, y=Point(x=y, y=torch.zeros(3, 5)))
    node = tt.TensorDict.from_namedtuple(nt, batch_size=[3])
    assert node["x"] is x and node["y", "x"] is y
    out = node.to_namedtuple()
    assert out._fields == ("x", "y") and out.y._fields == ("x", "y")
    assert out.x is x and out.y.x is y
    assert_equal(tt.TensorDict.from_namedtuple(out, batch_size=[3]), node)
    assert type(node.to_namedtuple()) is type(out)


def test_to_namedtuple_keeps_key_order_and_refuses_bad_fields() -> None:
    node = tt.TensorDict({"b": torch.zeros(2), "a": torch.ones(2)}, [2])
    assert node.to_namedtuple()._fields == ("a", "b")
    for bad in ("a.b", "class", "_private"):
        with pytest.raises(ValueError, match=rf"\('s', '{bad}'\).*rename"):
            tt.TensorDict({"s": {bad: torch.zeros(2)}}, [2]).to_namedtuple()


def test_records_refuse_the_wrong_kind_naming_it() -> None:
    with pytest.raises(TypeError, match="dataclass instance, got a dataclass type"):
        tt.TensorDict.from_dataclass(Info)
    with pytest.raises(TypeError, match="dataclass instance, got Point"):
        tt.TensorDict.from_dataclass(Point(torch.zeros(1), torch.zeros(1)))
    with pytest.raises(TypeError, match="named tuple instance, got tuple"):
        tt.TensorDict.from_namedtuple((torch.zeros(1),))
    with pytest.raises(TypeError, match=r"field \('pos', 'y'\) of Point is a NoneType"):
        tt.TensorDict.from_dataclass(Step(obs=torch.zeros(2), pos=Point(torch.zeros(2), None), extra={}))


# -- torch.export --------------------------------------------------------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return tt.nn.TDSequential(
        tt.nn.TDModule(torch.nn.Linear(3, 4), ["obs"], [("hidden", "h")]),
        tt.nn.TDModule(torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(4, 2)), [("hidden", "h")], ["action"]),
    )


def test_export_save_load_of_a_td_module_gives_identical_outputs(tmp_path: Any) -> None:
    model = _model()
    td = tt.TensorDict({"obs": torch.randn(5, 3), "next": {"reward": torch.zeros(5, 1)}}, [5])
    program = torch.export.export(model, (td,))
    eager = model(td)
    exported = program.module()(td)
    assert_equal(exported, eager)
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2").module()
    other = tt.TensorDict({"obs": torch.randn(5, 3), "next": {"reward": torch.ones(5, 1)}}, [5])
    assert_equal(loaded(td), eager)
    assert_equal(loaded(other), model(other))
    assert loaded(td)["next", "reward"] is td["next", "reward"]
    with pytest.raises(ValueError, match="tree spec"):  # batch_size is static structure
        loaded(tt.TensorDict({"obs": torch.randn(6, 3), "next": {"reward": torch.ones(6, 1)}}, [6]))


def test_exported_program_with_a_tagged_output_loads_in_a_fresh_process(tmp_path: Any) -> None:
    # A tagged type only in the output spec: loading must find it by name before any node of it exists.
    # The output is rebuilt by unflatten, so it is untagged (DESIGN 3.1; it was TensorDict[Locked] before).
    class LockOut(torch.nn.Module):
        def forward(self, td: tt.TensorDict) -> tt.TensorDict:
            return (td * 2).lock()

    td = tt.TensorDict({"obs": torch.arange(6.0).view(2, 3)}, [2])
    torch.export.save(torch.export.export(LockOut(), (td,)), tmp_path / "lock.pt2")
    script = textwrap.dedent(
        f"""
        import torch, tdtree as tt
        program = torch.export.load({str(tmp_path / "lock.pt2")!r})
        out = program.module()(tt.TensorDict({{"obs": torch.ones(2, 3)}}, [2]))
        print(type(out).__name__, out["obs"].tolist())
        """
    )
    here = os.path.dirname(os.path.dirname(tt.__file__))  # the tdtree under test, not an installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "TensorDict [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]"


@needs_tensordict
def test_a_tensorclass_from_node_takes_a_tdtree_node_and_names_the_converter() -> None:
    class Point(tt.TensorClass):
        x: torch.Tensor

    x = torch.zeros(2)
    outside = tensordict.TensorDict({"x": x}, [2])
    names_converter = r"Point\.from_node takes a tdtree TensorDict.*tdtree\.from_tensordict\(td, cls=Point\)"
    with pytest.raises(TypeError, match=names_converter):
        Point.from_node(outside)
    converted = tt.from_tensordict(outside, cls=Point)
    inside = Point.from_node(tt.TensorDict({"x": x}, [2]))
    assert type(converted) is Point and type(inside) is Point
    assert converted.x is x and inside.x is x
