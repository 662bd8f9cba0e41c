"""Tensorclasses: construction and its errors, every operation returning the class, nesting,
static fields through operations and pytrees, memmap, pickle and torch.compile."""

from __future__ import annotations

import enum
import json
import os
import pickle
import runpy
from collections.abc import Callable
from typing import Any, Optional

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree
from _tcstatics import statics

import tdtree as tt
from tdtree import Locked, Memmap, Shared, TensorDict
from tdtree.errors import BatchSizeError, FieldError, LockedError, MemmapError
from tdtree.testing import assert_equal


class Phase(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Inner(tt.TensorClass):
    y: torch.Tensor
    label: str = "inner"


class Obs(tt.TensorClass):
    x: torch.Tensor
    inner: Inner
    extras: TensorDict
    phase: Phase = Phase.TRAIN
    count: int = 3
    scale: float = 0.5
    note: Optional[str] = None


@tt.tensorclass
class Plain:
    a: torch.Tensor
    flag: bool = True


class Maybe(tt.TensorClass):
    a: torch.Tensor
    b: Optional[torch.Tensor] = None


def make_obs(n: int = 4) -> Obs:
    g = torch.Generator().manual_seed(n)
    inner = Inner(y=torch.randn(n, 2, generator=g), label="deep", batch_size=[n])
    extras = TensorDict({"r": torch.randn(n, generator=g), "sub": {"d": torch.arange(n)}}, [n])
    return Obs(torch.randn(n, 3, generator=g), inner, extras, Phase.EVAL, 7, 2.5, "hi", batch_size=[n])


def assert_same_record(out: Any, template: Any, expected_td: TensorDict) -> None:
    """``out`` is ``template``'s class with its static fields and nested classes, holding ``expected_td``."""
    assert type(out) is type(template)
    assert statics(out) == statics(template)
    for name in type(template)._fields:
        if isinstance(getattr(template, name), tt.TensorClass):
            assert type(getattr(out, name)) is type(getattr(template, name))
    assert_equal(out.to_node(), expected_td)
    for name in out.to_node().keys():
        value = getattr(out, name)
        entry = out.to_node()[name]
        assert (value._td if isinstance(value, tt.TensorClass) else value) is entry


# -- construction ----------------------------------------------------------------------------


def test_fields_by_position_name_and_default():
    y = torch.ones(4, 2)
    inner = Inner(y, batch_size=[4])
    assert inner.y is y and inner.label == "inner"
    x = torch.zeros(4, 3)
    extras = TensorDict({"r": torch.zeros(4)}, [4])
    obs = Obs(x, inner=inner, extras=extras, batch_size=4)
    assert obs.x is x and obs.inner.y is y and obs.extras is extras
    assert (obs.phase, obs.count, obs.scale, obs.note) == (Phase.TRAIN, 3, 0.5, None)
    assert obs.batch_size == torch.Size([4]) and obs.shape == torch.Size([4]) and obs.ndim == 1
    assert obs.device == torch.device("cpu") and obs.tags == frozenset()
    assert obs.numel() == 4 and obs.dim() == 1


def test_static_fields_are_metadata_not_leaves():
    obs = make_obs()
    leaves = tt.tree.leaves(obs)
    assert all(isinstance(x, torch.Tensor) for x in leaves)
    assert len(leaves) == 4  # x, inner.y, extras.r, extras.sub.d: nothing static
    assert sorted(obs.to_node().keys()) == ["extras", "inner", "x"]


def test_optional_tensor_field_is_static_while_none():
    m = Maybe(torch.zeros(2), batch_size=[2])
    assert m.b is None and len(tt.tree.leaves(m)) == 1
    full = m.replace(b=torch.ones(2))
    assert_equal(full.b, torch.ones(2))
    assert len(tt.tree.leaves(full)) == 2 and m.b is None


def test_device_moves_every_field():
    obs = make_obs()
    moved = Obs(obs.x, obs.inner, obs.extras, batch_size=[4], device="cpu")
    assert moved.device == torch.device("cpu") and moved.inner.device == torch.device("cpu")


def test_decorator_and_base_class_spellings():
    p = Plain(torch.zeros(3), batch_size=[3])
    assert isinstance(p, tt.TensorClass) and type(p).__name__ == "Plain"
    assert p.flag is True and type(p[0]) is Plain
    assert tt.tensorclass(Plain) is Plain


def test_subclass_extends_fields():
    class Base(tt.TensorClass):
        a: torch.Tensor

    class Child(Base):
        b: torch.Tensor
        name: str = "c"

    assert Child._fields == ("a", "b", "name")
    c = Child(torch.zeros(2), torch.ones(2), batch_size=[2])
    assert c.a.sum() == 0 and c.b.sum() == 2 and type(c.reshape(1, 2)) is Child


def test_frozen():
    obs = make_obs()
    with pytest.raises(TypeError, match=r"Obs is frozen: obj = obj.replace\(x=...\)"):
        obs.x = torch.zeros(4, 3)
    with pytest.raises(TypeError, match="Obs is frozen"):
        del obs.count


def test_repr_names_class_and_every_field():
    text = repr(make_obs())
    assert text.startswith("Obs(")
    for part in (
        "x=Tensor(shape=(4, 3)",
        "inner=Inner(",
        "y=Tensor(shape=(4, 2)",
        "label='deep'",
        "extras=TensorDict(",
        "phase=<Phase.EVAL: 'eval'>",
        "count=7",
        "scale=2.5",
        "note='hi'",
        "batch_size=(4,)",
    ):
        assert part in text
    assert "tags={Locked}" in repr(make_obs().lock())


# -- construction errors -------------------------------------------------------------------------


class Unsorted(tt.TensorClass):
    b: torch.Tensor
    a: torch.Tensor


class UnsortedMixed(tt.TensorClass):
    z: torch.Tensor
    tag: str
    a: torch.Tensor
    n: int = 1


def _obs_fields(**changes):
    obs = make_obs()
    return {**{f: getattr(obs, f) for f in Obs._fields}, **changes}


def _by_position(cls, kwargs, **options):
    return cls(*(kwargs[f] for f in cls._fields), **options)


@pytest.mark.parametrize(
    "cls, kwargs, options",
    [
        (Unsorted, {"a": torch.zeros(2), "b": torch.ones(2, 3)}, {"batch_size": [2]}),
        (Unsorted, {"b": torch.ones(2, 3), "a": torch.zeros(2)}, {}),
        (UnsortedMixed, {"n": 4, "a": torch.zeros(2), "tag": "t", "z": torch.ones(2, 1)}, {"batch_size": 2}),
        (Plain, {"a": torch.zeros(3), "flag": False}, {"device": torch.device("cpu")}),
        (Plain, {"a": torch.nn.Parameter(torch.zeros(3)), "flag": True}, {}),
        (Maybe, {"a": torch.zeros(3), "b": None}, {}),
        (Obs, _obs_fields(), {"batch_size": [4]}),
        (Obs, _obs_fields(extras=TensorDict({"r": torch.ones(4)}, [4]).lock()), {"batch_size": [4]}),
        (Obs, _obs_fields(inner=make_obs().inner.lock()), {"batch_size": [4]}),
        (Obs, _obs_fields(extras=TensorDict({}, [4])), {"batch_size": [4]}),
        (Obs, _obs_fields(extras=TensorDict({"r": torch.ones(4, device="meta")}, [4])), {}),
    ],
)
def test_construction_by_name_matches_by_position(cls, kwargs, options):
    by_name, by_position = cls(**kwargs, **options), _by_position(cls, kwargs, **options)
    assert by_name._td._meta == by_position._td._meta
    assert by_name._static == by_position._static
    assert list(by_name._td.keys()) == sorted(by_name._td.keys())
    leaves, spec = torch_pytree.tree_flatten(by_name)
    expected, expected_spec = torch_pytree.tree_flatten(by_position)
    assert spec == expected_spec and len(leaves) == len(expected)
    assert all(a is b for a, b in zip(leaves, expected))
    for f in cls._fields:
        assert type(getattr(by_name, f)) is type(getattr(by_position, f))
        if isinstance(kwargs[f], torch.Tensor):
            assert getattr(by_name, f) is by_name._td[f]


def test_construction_by_name_on_mixed_devices_has_no_device():
    out = Unsorted(a=torch.zeros(2), b=torch.zeros(2, device="meta"))
    assert out.device is None and out.b.device == torch.device("meta")


def test_construction_by_name_reports_the_first_field_error():
    with pytest.raises(FieldError, match=r"UnsortedMixed.tag expects str, got int"):
        UnsortedMixed(z=torch.zeros(2), tag=1, a=torch.zeros(3), batch_size=[-1])
    with pytest.raises(BatchSizeError, match="'a'"):
        UnsortedMixed(z=torch.zeros(2), tag="t", a=torch.zeros(3), batch_size=[2])


def test_unknown_field():
    with pytest.raises(FieldError, match=r"Inner has no field 'z'; its fields are \['y', 'label'\]"):
        Inner(y=torch.zeros(2), z=1)


def test_missing_fields():
    with pytest.raises(FieldError, match=r"Obs: missing fields \['inner', 'extras'\]"):
        Obs(x=torch.zeros(2))


def test_field_given_twice_and_too_many_positional():
    with pytest.raises(FieldError, match="field 'y' given twice"):
        Inner(torch.zeros(2), y=torch.zeros(2))
    with pytest.raises(FieldError, match=r"Inner takes 2 fields \['y', 'label'\], got 3 positional"):
        Inner(torch.zeros(2), "a", "b")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"label": 3}, r"Inner.label expects str, got int"),
        ({"y": "text"}, r"Inner.y expects Tensor, got str"),
    ],
    ids=["static", "tensor"],
)
def test_field_type_checked_against_annotation(kwargs, message):
    with pytest.raises(FieldError, match=message):
        Inner(**{"y": torch.zeros(2), **kwargs})


def test_optional_annotation_checked():
    with pytest.raises(FieldError, match=r"Obs.note expects Optional\[str\], got int"):
        make_obs().replace(note=5)


def test_field_value_kind_checked():
    class Loose(tt.TensorClass):
        a: Any

    with pytest.raises(FieldError, match=r"Loose.a is a list: a field holds a tensor, a TensorDict"):
        Loose([1, 2])


def test_batch_prefix_names_the_field():
    with pytest.raises(BatchSizeError, match=r"Inner: .*'y'.*\(3,\).*\(4,\)"):
        Inner(torch.zeros(3), batch_size=[4])
    inner = Inner(torch.zeros(3), batch_size=[3])
    with pytest.raises(BatchSizeError, match=r"Obs: .*'inner'"):
        Obs(torch.zeros(4), inner, TensorDict({}, [4]), batch_size=[4])


class Pair(tt.TensorClass):
    b: torch.Tensor
    a: torch.Tensor
    tag: str = "t"


def _outcome(build: Callable[[], Any]) -> Any:
    """The node's (keys, batch_size, device) and leaves, or the error's type and message."""
    try:
        out = build()
    except Exception as err:  # noqa: BLE001 - every error is compared
        return type(err), str(err)
    node = out if isinstance(out, TensorDict) else out.to_node()
    return node._meta[:3], list(node.values())


_z4 = torch.zeros(4)


@pytest.mark.parametrize(
    ("a", "b", "batch_size", "device"),
    [
        (torch.zeros(4, 3), _z4, [4], None),
        (torch.zeros(2, 3, 4), torch.zeros(2, 3), (2, 3), None),
        (torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4), torch.Size([2, 3, 4]), None),
        (_z4, _z4, 4, None),
        (_z4, _z4, None, torch.device("cpu")),
        (_z4, _z4, [4], "cpu"),
        (_z4, torch.zeros(4, device="meta"), [4], None),
        (_z4, _z4, [4], "meta"),
        (torch.zeros(3), _z4, [4], None),
        (torch.zeros(4, 2), torch.zeros(4, 3), [4, 2], None),
        (torch.zeros(()), _z4, [4], None),
        (_z4, _z4, [-1], None),
        (_z4, _z4, "x", None),
        (_z4, _z4, [4], "nope"),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_constructor_checks_are_the_tensordict_constructors(a, b, batch_size, device):
    # One validator: the node a tensorclass builds, or its error, is the TensorDict constructor's, by
    # name (the fast path) and by position alike; a BatchSizeError adds the class's name.
    expected = _outcome(lambda: TensorDict({"a": a, "b": b}, batch_size, device))
    for build in (
        lambda: Pair(b=b, a=a, batch_size=batch_size, device=device),
        lambda: Pair(b, a, batch_size=batch_size, device=device),
    ):
        got = _outcome(build)
        if expected[0] is BatchSizeError:
            assert got == (BatchSizeError, f"Pair: {expected[1]}")
        elif isinstance(expected[0], type):
            assert got == expected
        else:
            assert got[0] == expected[0]
            for x, y, given in zip(got[1], expected[1], (a, b), strict=True):
                assert (x.shape, x.device) == (y.shape, y.device) and (x is given) == (y is given)


def test_class_body_errors():
    with pytest.raises(FieldError, match="field 'shape' is the name of a tensorclass attribute"):

        class Bad(tt.TensorClass):
            shape: torch.Tensor

    with pytest.raises(FieldError, match="field '_x' starts with an underscore"):

        class Bad2(tt.TensorClass):
            _x: torch.Tensor

    with pytest.raises(FieldError, match="field 'b' without a default follows field 'a' with one"):

        class Bad3(tt.TensorClass):
            a: int = 1
            b: torch.Tensor


# -- operations return the class --------------------------------------------------------------------

OPS: dict[str, Callable[[Any], Any]] = {
    "index-int": lambda x: x[1],
    "index-slice": lambda x: x[1:3],
    "index-mask": lambda x: x[torch.tensor([True, False, True, True])],
    "index-tensor": lambda x: x[torch.tensor([3, 0])],
    "view": lambda x: x.view(2, 2),
    "reshape": lambda x: x.reshape(2, 2),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "squeeze": lambda x: x.unsqueeze(1).squeeze(1),
    "transpose": lambda x: x.view(2, 2).transpose(0, 1),
    "permute": lambda x: x.view(2, 2).permute(1, 0),
    "flatten": lambda x: x.view(2, 2).flatten(),
    "unflatten": lambda x: x.unflatten(0, (2, 2)),
    "expand": lambda x: x.unsqueeze(0).expand(3, 4),
    "apply": lambda x: x.apply(lambda t: t * 2),
    "add": lambda x: x + 1,
    "radd": lambda x: 1 + x,
    "sub-self": lambda x: x - x,
    "mul-tensor": lambda x: x * torch.arange(4),
    "tensor-mul": lambda x: torch.arange(4) * x,
    "neg": lambda x: -x,
    "abs": lambda x: abs(x),
    "pow": lambda x: x**2,
    "gt": lambda x: x > 0,
    "eq": lambda x: x == x,
    "clamp": lambda x: x.clamp(0, 1),
    "where": lambda x: x.where(x > 0, x * 0),
    "sum": lambda x: x.sum(0),
    "to-dtype": lambda x: x.to(torch.float64),
    "double": lambda x: x.double(),
    "cpu": lambda x: x.cpu(),
    "clone": lambda x: x.clone(),
    "clone-shallow": lambda x: x.clone(recurse=False),
    "contiguous": lambda x: x.contiguous(),
    "lock": lambda x: x.lock(),
    "unlock": lambda x: x.lock().unlock(),
    "zeros_like": lambda x: torch.zeros_like(x),
}


@pytest.mark.parametrize("name", OPS)
def test_operation_returns_the_class(name):
    obs = make_obs()
    op = OPS[name]
    out = op(obs)
    assert_same_record(out, obs, op(obs.to_node()))


@pytest.mark.parametrize(
    "name",
    ["unbind", "split", "chunk"],
)
def test_tuple_results_are_each_the_class(name):
    obs = make_obs()
    op = {"unbind": lambda x: x.unbind(0), "split": lambda x: x.split([1, 3]), "chunk": lambda x: x.chunk(2)}[name]
    outs, expected = op(obs), op(obs.to_node())
    assert type(outs) is tuple and len(outs) == len(expected)
    for out, td in zip(outs, expected):
        assert_same_record(out, obs, td)


def test_binary_ops_between_instances_pair_fields():
    a, b = make_obs(), make_obs(4).apply(lambda t: t + 1)
    assert_same_record(a + b, a, a.to_node() + b.to_node())
    assert_same_record(a * b.to_node(), a, a.to_node() * b.to_node())


@pytest.mark.parametrize("combine", ["tt.stack", "torch.stack", "tt.cat", "torch.cat"])
def test_stack_and_cat(combine):
    a, b = make_obs(), make_obs().apply(lambda t: t * 3)
    fn = {"tt.stack": tt.stack, "torch.stack": torch.stack, "tt.cat": tt.cat, "torch.cat": torch.cat}[combine]
    td_fn = tt.stack if "stack" in combine else tt.cat
    out = fn([a, b], 0)
    assert_same_record(out, a, td_fn([a.to_node(), b.to_node()], 0))


def test_stack_refuses_mixed_classes_and_statics():
    a = make_obs()
    with pytest.raises(ValueError, match=r"stack: item 1's static fields .*'count', 8.* differ from item 0's"):
        tt.stack([a, a.replace(count=8)])
    with pytest.raises(ValueError, match="cat: item 1's static fields"):
        tt.cat([a, a.replace(inner=a.inner.replace(label="other"))])
    with pytest.raises(TypeError, match="stack: item 1 is a Inner, not a Obs"):
        tt.stack([a, a.inner])


def test_stack_of_nodes_unchanged():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    assert_equal(tt.stack([td, td]), TensorDict({"a": torch.zeros(2, 2)}, [2, 2]))


def test_indexing_by_key_is_refused():
    with pytest.raises(TypeError, match=r"Obs is indexed over its batch dims; read a field as obj.x"):
        make_obs()["x"]


def test_all_and_any_without_dim_give_tensors():
    obs = make_obs()
    assert (obs == obs).all().item() is True
    with pytest.raises(RuntimeError, match="truth value of a Obs is ambiguous"):
        bool(obs == obs)


def test_inplace_writers_return_the_instance():
    obs = make_obs().clone()
    src = make_obs(4).apply(lambda t: t + 5)
    assert obs.copy_(src) is obs
    assert_equal(obs.to_node(), src.to_node())
    assert obs.zero_() is obs and obs.x.abs().sum() == 0


# -- tags, replace, conversion -----------------------------------------------------------------------


def test_tags_follow_the_node_rule():
    obs = make_obs().lock()
    assert obs.tags == {Locked} and obs.inner.tags == {Locked} and obs.extras.tags == {Locked}
    assert obs[1:3].tags == {Locked} and obs.view(2, 2).is_locked
    assert (obs + 1).tags == frozenset() and obs.clone().tags == frozenset()
    assert obs.unlock().tags == frozenset() and obs.unlock().inner.tags == frozenset()


def test_share_memory():
    obs = make_obs()
    shared = obs.share_memory()
    assert type(shared) is Obs and shared.tags == {Shared, Locked} and shared.inner.is_shared
    assert shared.x.is_shared() and not obs.x.is_shared()
    assert statics(shared) == statics(obs)
    assert_equal(shared.to_node(), obs.to_node(), check_tags=False)


def test_replace():
    obs = make_obs()
    x = torch.ones(4, 3)
    new = obs.replace(x=x, count=9)
    assert new.x is x and new.count == 9 and new.inner is obs.inner or new.inner.y is obs.inner.y
    assert obs.count == 7 and obs.x is not x
    assert statics(new) == [(k, 9 if k == "count" else v) for k, v in statics(obs)]


def test_replace_of_tensors_shares_the_rest():
    obs = make_obs()
    x, y = torch.ones(4, 3), torch.ones(4, 2)
    new = obs.replace(x=x)
    assert_same_record(new, obs, obs.to_node().set("x", x))
    assert new.x is x and new.inner is obs.inner and new.extras is obs.extras and new.tags == frozenset()
    assert obs.x is not x and obs.to_node()["x"] is obs.x
    # the dims past the batch may change
    wider = Plain(a=torch.zeros(2, 3), batch_size=[2]).replace(a=torch.ones(2, 5))
    assert wider.a.shape == (2, 5) and wider.flag is True and wider.to_node()["a"] is wider.a
    assert new.replace(inner=Inner(y=y, batch_size=[4])).inner.y is y
    # a field static while None becomes data: the node's keys and the static fields change
    a, b = torch.zeros(2), torch.ones(2)
    full = Maybe(a, batch_size=[2]).replace(b=b)
    assert tt.tree.structure(full) == tt.tree.structure(Maybe(a, b, batch_size=[2])) and full.b is b


def test_replace_of_tensors_checks_each_value():
    obs = make_obs()
    with pytest.raises(FieldError, match="Obs has no field 'nope'"):
        obs.replace(x=torch.ones(4, 3), nope=torch.zeros(4))
    with pytest.raises(FieldError, match=r"Obs.x expects Tensor, got str"):
        obs.replace(x="no")
    with pytest.raises(FieldError, match=r"Obs.count expects int, got Tensor"):
        obs.replace(count=torch.zeros(4))
    with pytest.raises(BatchSizeError, match=r"Maybe.replace: .*'b'"):
        Maybe(torch.zeros(2), torch.zeros(2), batch_size=[2]).replace(a=torch.ones(2), b=torch.ones(3))
    with pytest.raises(FieldError, match=r"Obs.inner expects Inner, got Tensor"):
        obs.replace(inner=torch.zeros(4, 2))
    # a tensor subclass and a tensor on another device take the general path: kept, and moved
    param = torch.nn.Parameter(torch.zeros(4, 3))
    assert obs.replace(x=param).x is param
    on_meta = obs.to("meta").replace(x=torch.ones(4, 3))
    assert on_meta.x.device.type == "meta" and on_meta.to_node()["x"] is on_meta.x


def test_replace_on_locked_is_refused():
    with pytest.raises(LockedError, match=r"replace\(\) on a locked node.*unlock\(\)"):
        make_obs().lock().replace(count=1)


def test_replace_keeps_tags_when_leaves_are_reused():
    shared = make_obs().share_memory().unlock()
    assert shared.replace(count=1).tags == {Shared}
    assert shared.replace(x=torch.zeros(4, 3)).tags == frozenset()


def test_replace_errors():
    obs = make_obs()
    with pytest.raises(FieldError, match="Obs has no field 'nope'"):
        obs.replace(nope=1)
    with pytest.raises(BatchSizeError, match=r"Obs.replace: .*'x'"):
        obs.replace(x=torch.zeros(3))


def test_to_node_and_from_node():
    obs = make_obs().lock()
    # the names of the tensordict package's conversions belong to tt.from_tensordict / tt.to_tensordict only
    assert not hasattr(Obs, "from_tensordict") and not hasattr(obs, "to_tensordict")
    td = obs.to_node()
    assert type(td) is TensorDict[Locked] and td["x"] is obs.x
    back = Obs.from_node(td, phase=Phase.EVAL, count=7, scale=2.5, note="hi")
    assert type(back.inner) is Inner and back.inner.label == "inner"  # a static nested field takes its default
    assert back.tags == {Locked} and back.x is obs.x
    with pytest.raises(FieldError, match=r"Inner has no field 'q' \(a key of the TensorDict\)"):
        Inner.from_node(TensorDict({"y": torch.zeros(1), "q": torch.zeros(1)}, [1]))


# -- pytrees, pickle, memmap -------------------------------------------------------------------------


def test_optree_round_trip_keeps_statics_and_classes():
    """Unflatten rebuilds the class and statics untagged; tree.map's new leaves drop the tags
    (both kept Locked before DESIGN 3.1), a map reusing the leaves keeps them by the rule."""
    obs = make_obs().lock()
    leaves, spec = optree.tree_flatten(obs, namespace="tdtree")
    back = optree.tree_unflatten(spec, leaves)
    assert_same_record(back, obs, obs.to_node().unlock())
    assert back.tags == frozenset()
    doubled = tt.tree.map(lambda t: t * 2, obs)
    assert_same_record(doubled, obs, obs.to_node().unlock().apply(lambda t: t * 2))
    same = tt.tree.map(lambda t: t, obs)
    assert_same_record(same, obs, obs.to_node())


def test_torch_pytree_round_trip_keeps_statics_and_classes():
    obs = make_obs()
    leaves, spec = torch_pytree.tree_flatten(obs)
    back = torch_pytree.tree_unflatten(leaves, spec)
    assert_same_record(back, obs, obs.to_node())
    paths = [torch_pytree.keystr(p) for p, _ in torch_pytree.tree_flatten_with_path(obs)[0]]
    assert ".x" in paths and ".inner.y" in paths


def test_structure_holds_statics_and_tags():
    obs = make_obs()
    spec = tt.tree.structure(obs)
    assert spec != tt.tree.structure(obs.replace(count=1))
    assert spec != tt.tree.structure(obs.lock())
    assert spec == tt.tree.structure(obs + 1)


def test_pickle_round_trip():
    obs = make_obs()
    back = pickle.loads(pickle.dumps(obs))
    assert_same_record(back, obs, obs.to_node())
    shared = pickle.loads(pickle.dumps(obs.share_memory()))
    assert type(shared) is Obs and shared.tags == {Shared, Locked} and shared.x.is_shared()


def test_memmap_and_load_memmap(tmp_path):
    obs = make_obs()
    mm = obs.memmap(tmp_path / "obs")
    assert type(mm) is Obs and mm.tags == {Memmap, Locked} and statics(mm) == statics(obs)
    loaded = tt.load_memmap(tmp_path / "obs")
    assert type(loaded) is Obs and type(loaded.inner) is Inner
    assert statics(loaded) == statics(obs) and loaded.phase is Phase.EVAL
    assert_equal(loaded.to_node(), mm.to_node())
    loaded.x.fill_(1.0)  # shared mapping: seen through the first mapping too
    assert mm.x.sum() == 12
    back = pickle.loads(pickle.dumps(loaded))
    assert type(back) is Obs and back.is_memmap


def _edit_record(prefix: str, edit: Callable[[dict], None]) -> None:
    path = os.path.join(prefix, "meta.json")
    with open(path) as f:
        doc = json.load(f)
    edit(doc["record"])
    with open(path, "w") as f:
        json.dump(doc, f)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update({"class": "os.system"}), r"unknown tensorclass 'os.system': import the module"),
        (lambda r: r["static"].append(["nope", 1]), r"malformed field entry \['nope', 1\] for Obs"),
        (
            lambda r: r["static"].__setitem__(0, ["phase", {"enum": "os.Evil", "name": "X"}]),
            r"Obs.phase holds os.Evil.X, which is not a member of an enum its annotation names",
        ),
        (lambda r: r["static"].__setitem__(1, ["count", [1, 2]]), r"Obs.count holds \[1, 2\], not a static value"),
        (lambda r: r.update({"nested": []}), r"Obs.inner expects Inner, got TensorDict"),
    ],
    ids=["class", "field", "enum", "value", "nested"],
)
def test_load_memmap_refuses_a_bad_record(tmp_path, edit, message):
    prefix = str(tmp_path / "obs")
    make_obs().memmap(prefix)
    _edit_record(prefix, edit)
    with pytest.raises(MemmapError, match="corrupt metadata file .*meta.json: " + message):
        tt.load_memmap(prefix)


# -- torch.compile --------------------------------------------------------------------------------


def step(obs: Obs) -> Obs:
    moved = obs.replace(x=obs.x * obs.scale + obs.inner.y.sum(-1, keepdim=True))
    return (moved[1:] + 1).reshape(3, 1)


def build(obs: Obs) -> Plain:
    return Plain(obs.x[:, 0] * 2, flag=False, batch_size=obs.batch_size)


def stack_unbind(obs: Obs) -> tuple[Obs, ...]:
    return tt.stack([obs, obs * 2], 0).unbind(1)


COMPILED: dict[str, tuple[Callable[[Obs], Any], Callable[[], Obs]]] = {
    "replace-index-add": (step, make_obs),
    "construct": (build, make_obs),
    "construct-by-name": (lambda o: Plain(a=o.x[:, 0] * 2, flag=False, batch_size=o.batch_size), make_obs),
    "stack-unbind": (stack_unbind, make_obs),
    "locked-views": (lambda o: o[1:3].reshape(2, 1), lambda: make_obs().lock()),
}


@pytest.mark.parametrize("name", COMPILED)
def test_compile_takes_and_returns_a_tensorclass(fresh_dynamo, name):
    fn, make = COMPILED[name]
    obs = make()
    fn(obs)  # the class resolves its annotations on first use, outside the compiled code
    explained = torch._dynamo.explain(fn)(obs)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(obs)
    expected = fn(obs)
    for got, want in zip(out, expected) if type(out) is tuple else [(out, expected)]:
        assert_same_record(got, want, want.to_node())


def test_typed_example_runs(capsys):
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "typed_tensorclass.py")
    runpy.run_path(path, run_name="__main__")
    assert "Phase.EVAL" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "on_instance", "on_node"),
    [
        ("floordiv", lambda o: o // 0.3, lambda td: td // 0.3),
        ("rfloordiv", lambda o: 2.0 // (o.abs() + 1), lambda td: 2.0 // (td.abs() + 1)),
        ("mod", lambda o: o % 0.3, lambda td: td % 0.3),
        ("rmod", lambda o: 2.0 % (o.abs() + 1), lambda td: 2.0 % (td.abs() + 1)),
        ("rpow", lambda o: 2.0**o, lambda td: 2.0**td),
        ("neg", lambda o: o.neg(), lambda td: td.neg()),
        ("abs", lambda o: o.abs(), lambda td: td.abs()),
        ("sigmoid", lambda o: o.sigmoid(), lambda td: td.sigmoid()),
        ("tanh", lambda o: o.tanh(), lambda td: td.tanh()),
        ("sign", lambda o: o.sign(), lambda td: td.sign()),
        ("amax", lambda o: o.amax(0), lambda td: td.amax(0)),
        ("amin", lambda o: o.amin(), lambda td: td.amin()),
        ("bfloat16", lambda o: o.bfloat16(), lambda td: td.bfloat16()),
        (
            "named_apply",
            lambda o: o.named_apply(lambda k, x: x * len(k)),
            lambda td: td.named_apply(lambda k, x: x * len(k)),
        ),
        ("where", lambda o: tt.where(o > 0, o, -o), lambda td: tt.where(td > 0, td, -td)),
    ],
)
def test_tensorclass_operations_match_the_inner_node(name: str, on_instance: Any, on_node: Any) -> None:
    obs = make_obs()
    out = on_instance(obs)
    assert type(out) is Obs and statics(out) == statics(obs)
    assert_equal(out.to_node(), on_node(obs.to_node()))


def test_tensorclass_update_and_fill_write_in_place() -> None:
    obs = make_obs().clone().lock()
    same = obs.update_({"x": torch.ones(4, 3)}).fill_(("inner", "y"), 2.0)
    assert same is obs and obs.is_locked
    torch.testing.assert_close(obs.x, torch.ones(4, 3))
    torch.testing.assert_close(obs.inner.y, torch.full((4, 2), 2.0))
    before = obs.x.clone()
    with pytest.raises(tt.errors.WriteError):
        obs.update_({"x": torch.ones(4, 3), "inner": {"y": torch.ones(4, 2, dtype=torch.complex64)}})
    torch.testing.assert_close(obs.x, before)  # refused as a whole
