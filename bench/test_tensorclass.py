"""Tensorclasses, after tensordict's benchmarks/tensorclass/test_tensorclass_speed.py (``test_tc_*``).

The record is tensordict's ``MyData``: tensors ``a``, ``b``, a string ``c`` and an optional nested
``MyData`` ``d``; ``ManyFields`` has ten tensor fields. The tdtree row uses ``tdtree.TensorClass``,
the tensordict row ``tensordict.tensorclass``. tensordict's suite passes ints for tensor fields
(it converts them); both rows here get 0-dim tensors, as in its ``test_tc_init`` case.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

import tdtree

from .impls import Impl, tensordict


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


if tensordict is not None:

    @tensordict.tensorclass
    class TDMyData:
        a: torch.Tensor
        b: torch.Tensor
        c: str
        d: Optional[TDMyData] = None

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
    cls = _my_data(impl)
    inner = cls(a=torch.zeros(()), b=torch.ones(()), c="a string", d=None)
    return cls(a=torch.zeros(()), b=torch.ones(()), c="a string", d=inner)


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


@pytest.mark.quick
def test_tc_first_layer_tensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    assert benchmark(lambda: d.a).shape == ()


def test_tc_first_layer_nontensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    assert benchmark(lambda: d.c) == "a string"


def test_tc_second_layer_tensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    assert benchmark(lambda: d.d.a).shape == ()


def test_tc_second_layer_nontensor(benchmark, impl: Impl) -> None:
    d = _record(impl)
    assert benchmark(lambda: d.d.c) == "a string"
