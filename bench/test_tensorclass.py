"""Tensorclasses, after tensordict's benchmarks/tensorclass/test_tensorclass_speed.py (``test_tc_*``)
and the tensorclass cases of its benchmarks/compile/compile_td_test.py, eager and compiled as the
cases of ``test_compile.py`` are (``bench.modes.run_mode`` and the ``compiler`` fixture: inductor
when timing, dynamo with the eager backend under ``--benchmark-disable``).

The record is tensordict's ``MyData``: tensors ``a``, ``b``, a string ``c`` and an optional nested
``MyData`` ``d``; ``ManyFields`` has ten tensor fields. The tdtree row uses ``tdtree.TensorClass``,
the tensordict row ``tensordict.tensorclass``. tensordict's suite passes ints for tensor fields
(it converts them); both rows here get 0-dim tensors, as in its ``test_tc_init`` case.

The field reads and the compiled cases have a pytree row: the same function over a plain dict of
the same values (``s.x`` is ``d["x"]``, ``s.replace(x=v)`` is ``{**d, "x": v}``, ``s + 1`` is
``optree.tree_map``). Construction has none: a dict literal checks no field and no batch size.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

import tdtree

from .impls import Impl, tensordict
from .modes import MODES, run_mode
from .test_compile import add_one, add_one_pytree, add_self, add_self_pytree


class MyData(tdtree.TensorClass):
    a: torch.Tensor
    b: torch.Tensor
    c: str
    d: Optional[MyData] = None


class ManyFields(tdtree.TensorClass):
    f0: torch.Tensor
    f1: torch.Tensor
    f2: torch.Tensor
    f3: torch.Tensor
    f4: torch.Tensor
    f5: torch.Tensor
    f6: torch.Tensor
    f7: torch.Tensor
    f8: torch.Tensor
    f9: torch.Tensor


class Flat(tdtree.TensorClass):
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    e: torch.Tensor
    f: torch.Tensor


class ReplaceState(tdtree.TensorClass):
    x: torch.Tensor
    y: torch.Tensor
    z: torch.Tensor
    w: torch.Tensor
    v: torch.Tensor


if tensordict is not None:

    @tensordict.tensorclass
    class TDMyData:
        a: torch.Tensor
        b: torch.Tensor
        c: str
        d: Optional[TDMyData] = None

    @tensordict.tensorclass
    class TDFlat:
        a: torch.Tensor
        b: torch.Tensor
        c: torch.Tensor
        d: torch.Tensor
        e: torch.Tensor
        f: torch.Tensor

    @tensordict.tensorclass
    class TDReplaceState:
        x: torch.Tensor
        y: torch.Tensor
        z: torch.Tensor
        w: torch.Tensor
        v: torch.Tensor

    @tensordict.tensorclass
    class TDManyFields:
        f0: torch.Tensor
        f1: torch.Tensor
        f2: torch.Tensor
        f3: torch.Tensor
        f4: torch.Tensor
        f5: torch.Tensor
        f6: torch.Tensor
        f7: torch.Tensor
        f8: torch.Tensor
        f9: torch.Tensor


def _my_data(impl: Impl) -> Any:
    return MyData if impl.name == "tdtree" else TDMyData


def _record(impl: Impl) -> Any:
    cls: Any = dict if impl.name == "pytree" else _my_data(impl)
    inner = cls(a=torch.zeros(()), b=torch.ones(()), c="a string", d=None)
    return cls(a=torch.zeros(()), b=torch.ones(()), c="a string", d=inner)


def _field(record: Any, name: str) -> Any:
    """``record.<name>``; a dict's entry for the pytree row (for checking results, not timed)."""
    return record[name] if type(record) is dict else getattr(record, name)


@pytest.mark.quick
def test_tc_init(benchmark, impl: Impl) -> None:
    cls, z, o = _my_data(impl), torch.zeros(()), torch.ones(())
    out = benchmark(lambda: cls(a=z, b=o, c="a string", d=None))
    assert out.a is z and out.c == "a string" and out.d is None


def test_tc_init_nested(benchmark, impl: Impl) -> None:
    cls, z, o = _my_data(impl), torch.zeros(()), torch.ones(())
    out = benchmark(lambda: cls(a=z, b=o, c="a string", d=cls(a=z, b=o, c="a string", d=None)))
    assert out.d.a is z and out.d.c == "a string"


def test_tc_init_many_fields(benchmark, impl: Impl) -> None:
    cls: Any = ManyFields if impl.name == "tdtree" else TDManyFields
    z = torch.zeros(())
    kwargs = {f"f{i}": z for i in range(10)}
    out = benchmark(lambda: cls(**kwargs))
    assert out.f9 is z


@pytest.mark.pytree
@pytest.mark.quick
def test_tc_first_layer_tensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    out = benchmark((lambda: d["a"]) if impl.name == "pytree" else (lambda: d.a))
    assert out.shape == ()


@pytest.mark.pytree
def test_tc_first_layer_nontensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    assert benchmark((lambda: d["c"]) if impl.name == "pytree" else (lambda: d.c)) == "a string"


@pytest.mark.pytree
def test_tc_second_layer_tensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    out = benchmark((lambda: d["d"]["a"]) if impl.name == "pytree" else (lambda: d.d.a))
    assert out.shape == ()


@pytest.mark.pytree
def test_tc_second_layer_nontensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    assert benchmark((lambda: d["d"]["c"]) if impl.name == "pytree" else (lambda: d.d.c)) == "a string"


# -- compile_td_test.py's tensorclass cases, eager and compiled ---------------------------------


def _flat(impl: Impl) -> Any:
    fields = {k: torch.ones(15) for k in "abcdef"}
    if impl.name == "pytree":
        return fields
    return (Flat if impl.name == "tdtree" else TDFlat)(**fields)


def _replace_state(impl: Impl) -> Any:
    fields = {k: torch.randn(4) for k in "xyzwv"}
    if impl.name == "pytree":
        return fields
    return (ReplaceState if impl.name == "tdtree" else TDReplaceState)(**fields, batch_size=[4])


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_add_one_flat_tensorclass(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    tc = _flat(impl)
    out = run_mode(benchmark, impl, mode, compiler, add_one_pytree if impl.name == "pytree" else add_one, tc)
    assert type(out) is type(tc) and _field(out, "f")[0] == 2


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_add_self_flat_tensorclass(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    tc = _flat(impl)
    out = run_mode(benchmark, impl, mode, compiler, add_self_pytree if impl.name == "pytree" else add_self, tc)
    assert type(out) is type(tc) and _field(out, "a")[0] == 2


def _replace_single(s: Any) -> Any:
    return s.replace(x=s.x + 1)


def _replace_multi(s: Any) -> Any:
    s = s.replace(x=s.x + 1)
    s = s.replace(y=s.y + 2)
    s = s.replace(z=s.z + 3)
    s = s.replace(x=s.x * 0.9, y=s.y * 0.9)
    s = s.replace(w=s.w + s.x)
    s = s.replace(v=s.v - 1, w=s.w + 1)
    s = s.replace(x=s.x + s.v, y=s.y + s.w, z=s.z + 0.1)
    s = s.replace(v=torch.zeros_like(s.v))
    s = s.replace(w=torch.ones_like(s.w))
    return s.replace(x=s.x + s.y + s.z)


def _replace_single_dict(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**s, "x": s["x"] + 1}


def _replace_multi_dict(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    s = {**s, "x": s["x"] + 1}
    s = {**s, "y": s["y"] + 2}
    s = {**s, "z": s["z"] + 3}
    s = {**s, "x": s["x"] * 0.9, "y": s["y"] * 0.9}
    s = {**s, "w": s["w"] + s["x"]}
    s = {**s, "v": s["v"] - 1, "w": s["w"] + 1}
    s = {**s, "x": s["x"] + s["v"], "y": s["y"] + s["w"], "z": s["z"] + 0.1}
    s = {**s, "v": torch.zeros_like(s["v"])}
    s = {**s, "w": torch.ones_like(s["w"])}
    return {**s, "x": s["x"] + s["y"] + s["z"]}


_REPLACE = {"single": _replace_single, "multi": _replace_multi}
_REPLACE_DICT = {"single": _replace_single_dict, "multi": _replace_multi_dict}


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", ["single", "multi"])
def test_compile_replace(benchmark, impl: Impl, mode: str, variant: str, compiler: Any) -> None:
    s = _replace_state(impl)
    fn = (_REPLACE_DICT if impl.name == "pytree" else _REPLACE)[variant]
    out = run_mode(benchmark, impl, mode, compiler, fn, s)
    assert type(out) is type(s)
    if variant == "single":
        assert torch.equal(_field(out, "x"), _field(s, "x") + 1)
    else:
        assert torch.equal(_field(out, "v"), torch.zeros(4)) and torch.equal(_field(out, "w"), torch.ones(4))


def _big20(impl: Any) -> Any:
    """A tensor-only class of 20 fields f0..f19 for the implementation, as compile_td_test's BigTC20."""
    body = {"__annotations__": {f"f{i}": torch.Tensor for i in range(20)}, "__module__": __name__}
    decorate = tdtree.tensorclass if impl.name == "tdtree" else tensordict.tensorclass
    return decorate(type("BigTC20", (), body))


_BIG20: dict[str, Any] = {}


def _getattr_sum(tc: Any) -> torch.Tensor:
    total = tc.f0
    for i in range(1, 20):
        total = total + getattr(tc, f"f{i}")
    return total


def _getitem_sum(d: dict[str, torch.Tensor]) -> torch.Tensor:
    total = d["f0"]
    for i in range(1, 20):
        total = total + d[f"f{i}"]
    return total


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_tc_getattr_20(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    fields = {f"f{i}": torch.randn(4) for i in range(20)}
    if impl.name == "pytree":
        tc, fn = fields, _getitem_sum
    else:
        cls = _BIG20.get(impl.name) or _BIG20.setdefault(impl.name, _big20(impl))
        tc, fn = cls(**fields, batch_size=[4]), _getattr_sum
    out = run_mode(benchmark, impl, mode, compiler, fn, tc)
    assert torch.allclose(out, sum(fields.values()))
