"""Small functions of nodes, eager and compiled, after tensordict's benchmarks/compile/compile_td_test.py.

Each case runs one function of the node in ``mode="eager"`` or compiled with
``torch.compile(fullgraph=True, dynamic=False)`` (the ``compiler`` fixture in
``conftest.py``: inductor when timing, dynamo alone with the eager backend
under ``make test``, where inductor's code generation would cost minutes).
The compiled function is called twice, then timed; the tdtree and pytree rows
assert that nothing recompiles while timed. tensordict's suite compiles with
``mode="reduce-overhead"`` (CUDA graphs); on the CPU that is the default mode.

Rows: tdtree, tensordict, and pytree (plain dicts with ``optree.tree_map``,
which dynamo traces as it does torch's own pytrees). The tensorclass rows
(``tensorclass``, ``replace``, ``getattr``) are in ``test_tensorclass.py``,
which runs them through ``run_mode`` too. Left out: the lazy stack, which tdtree
does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch

from .impls import Impl
from .modes import MODES, run_mode


def nested_td(impl: Impl) -> Any:
    """tensordict's compile-suite nested node: a scalar "a" and a sub-node "i" at each of 10 levels."""
    source: dict[str, Any] = {}
    level = source
    for i in range(10):
        level["a"] = torch.ones(())
        level[str(i)] = {}
        level = level[str(i)]
    level["a"] = torch.ones(())
    return impl.node(source, ())


def flat_td(impl: Impl, n: int = 50) -> Any:
    """50 scalar keys "0".."49", each equal to its index."""
    return impl.node({str(i): torch.full((), float(i)) for i in range(n)}, ())


def add_one(td: Any) -> Any:
    return td + 1


def add_one_pytree(td: Any) -> Any:
    return optree.tree_map(lambda x: x + 1, td)


def add_self(td: Any) -> Any:
    return td + td


def add_self_pytree(td: Any) -> Any:
    return optree.tree_map(lambda x: x + x, td)


def copy(td: Any) -> Any:
    """A shallow copy; tdtree: ``clone(recurse=False)`` (its nodes cannot change, so that is a copy)."""
    return td.copy()


def clone_shallow(td: Any) -> Any:
    return td.clone(recurse=False)


def copy_pytree(td: Any) -> Any:
    return optree.tree_map(lambda x: x, td)


def _fn(impl: Impl, name: str) -> Callable[..., Any]:
    """The case's function for ``impl``: the pytree variant, or the node one (tdtree's copy is clone(False))."""
    if impl.name == "pytree":
        return {"add_one": add_one_pytree, "add_self": add_self_pytree, "copy": copy_pytree}[name]
    if impl.name == "tdtree" and name == "copy":
        return clone_shallow
    return {"add_one": add_one, "add_self": add_self, "copy": copy}[name]


def _leaf(out: Any, *path: str) -> torch.Tensor:
    for part in path:
        out = out[part]
    return out


# -- maps over a nested and a flat node -------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_add_one_nested(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    out = run_mode(benchmark, impl, mode, compiler, _fn(impl, "add_one"), nested_td(impl))
    assert _leaf(out, *map(str, range(10)), "a") == 2


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_copy_nested(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    td = nested_td(impl)
    out = run_mode(benchmark, impl, mode, compiler, _fn(impl, "copy"), td)
    assert out is not td and _leaf(out, *map(str, range(10)), "a") == 1


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_add_one_flat(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    out = run_mode(benchmark, impl, mode, compiler, _fn(impl, "add_one"), flat_td(impl))
    assert out["49"] == 50


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_add_self_flat(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    out = run_mode(benchmark, impl, mode, compiler, _fn(impl, "add_self"), flat_td(impl))
    assert out["49"] == 98


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_copy_flat(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    td = flat_td(impl)
    out = run_mode(benchmark, impl, mode, compiler, _fn(impl, "copy"), td)
    assert out is not td and out["49"] is td["49"]


# -- building a node key by key ----------------------------------------------------------------


def assign_and_add(td: Any, k: int) -> Any:
    for i in range(k, k + 100):
        td[str(i)] = i
    return td + 1


def set_and_add(td: Any, k: int) -> Any:
    for i in range(k, k + 100):
        td = td.set(str(i), torch.tensor(i))
    return td + 1


def assign_and_add_pytree(td: Any, k: int) -> Any:
    for i in range(k, k + 100):
        td[str(i)] = torch.tensor(i)
    return optree.tree_map(lambda x: x + 1, td)


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_assign_and_add(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """Write 100 scalar keys into an empty node, then add 1. tensordict and the dict
    assign in place (``td[key] = i``); tdtree sets them one by one, each ``set`` a new node."""
    fn = {"tdtree": set_and_add, "tensordict": assign_and_add, "pytree": assign_and_add_pytree}[impl.name]
    out = run_mode(benchmark, impl, mode, compiler, fn, impl.node({}, ()), 5)
    assert out["104"] == 105


# -- indexing --------------------------------------------------------------------------------

INDICES = {"tensor": torch.arange(0, 10, 2), "slice": slice(None, None, 2), "int": 5}


def index(td: Any, idx: Any) -> Any:
    return td[idx]


def index_pytree(td: Any, idx: Any) -> Any:
    return optree.tree_map(lambda x: x[idx], td)


@pytest.mark.pytree
@pytest.mark.parametrize("index_type", list(INDICES))
@pytest.mark.parametrize("mode", MODES)
def test_compile_indexing(benchmark, impl: Impl, mode: str, index_type: str, compiler: Any) -> None:
    """``td[idx]`` on {"a": arange(100), "b": {"c": arange(100)}}, batch (100,). tensordict's
    suite compares ``index_type == int`` with a string and so times its slice for "int"; here
    "int" is 5."""
    td = impl.node({"a": torch.arange(100), "b": {"c": torch.arange(100)}}, (100,))
    fn = index_pytree if impl.name == "pytree" else index
    out = run_mode(benchmark, impl, mode, compiler, fn, td, INDICES[index_type])
    assert torch.equal(out["b"]["c"], torch.arange(100)[INDICES[index_type]])


# -- shallow clone and in-place update ---------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.parametrize("n_fields", [20, 40, 80])
@pytest.mark.parametrize("mode", MODES)
def test_compile_clone_shallow(benchmark, impl: Impl, mode: str, n_fields: int, compiler: Any) -> None:
    """``clone(recurse=False)`` of ``n_fields`` keys of shape (4,) (pytree: a shallow dict copy)."""
    td = impl.node({f"k{i}": torch.randn(4) for i in range(n_fields)}, (4,))
    fn = (lambda d: dict(d)) if impl.name == "pytree" else clone_shallow
    out = run_mode(benchmark, impl, mode, compiler, fn, td)
    assert out is not td and out["k0"] is td["k0"]


def update_inplace(td: Any, src: Any) -> Any:
    td.update_(src)
    return td


def update_inplace_pytree(td: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> Any:
    torch._foreach_copy_(list(td.values()), [src[k] for k in td])
    return td


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_compile_update_inplace(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """Copy 20 leaves of shape (4,) into a node's own in place: ``td.update_(src)``
    (pytree: ``torch._foreach_copy_`` over the values)."""
    td = impl.node({f"k{i}": torch.randn(4) for i in range(20)}, (4,))
    src = impl.node({f"k{i}": torch.ones(4) for i in range(20)}, (4,))
    fn = update_inplace_pytree if impl.name == "pytree" else update_inplace
    out = run_mode(benchmark, impl, mode, compiler, fn, td, src)
    assert out is td and torch.equal(td["k19"], torch.ones(4))
