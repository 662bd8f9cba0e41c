"""Operations under torch.compile(fullgraph=True): no graph break, and the same result as eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree import TensorDict
from tdtree.nn import TDModule, TDSequential
from tdtree.testing import assert_equal

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: a fresh dynamo cache


def flat() -> TensorDict:
    return TensorDict({"a": torch.randn(4, 3), "b": torch.randn(4)}, [4])


def nested() -> TensorDict:
    return TensorDict({"a": torch.randn(4, 3), "sub": {"c": torch.randn(4, 2, 2), "d": torch.arange(4)}}, [4])


def check_compiled(fn: Callable[[TensorDict], Any], td: TensorDict, backend: str) -> None:
    explained = torch._dynamo.explain(fn)(td)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    assert_equal(compiled(td), fn(td))


CASES: dict[str, tuple[Callable[[TensorDict], Any], Callable[[], TensorDict]]] = {
    "add-flat": (lambda td: td + 1, flat),
    "add-nested": (lambda td: td + 1, nested),
    "apply": (lambda td: td.apply(lambda x: x * 2 - 1), nested),
    "stack": (lambda td: tt.stack([td, td + 1], 1), nested),
    # one case per node factory of tdtree._base (their eager bodies are not traceable; their twins are)
    "construct": (lambda td: TensorDict({"x": td["a"] * 2, ("y", "z"): td["b"]}, [4]), flat),
    # nested plain dicts: the constructor's one walk of them (and the factory building their levels)
    "construct-dicts": (lambda td: TensorDict({"x": td["a"] * 2, "y": {"z": td["b"], "w": {"q": td["a"]}}}, [4]), flat),
    "make": (lambda td: td.select("a") + 1, nested),
    "from_meta": (lambda td: tt.tree.map(lambda x: x * 2, {"n": td})["n"], nested),
    "with_meta-replace": (lambda td: td.set(("sub", "c"), td["sub", "c"] * 2), nested),
    "chain": (lambda td: td.set(("p", "q", "r"), td["a"] * 2), nested),
    "along": (lambda td: td.select(("sub", "c")) * 2, nested),
    "rebuilt": (lambda td: td.exclude(("sub", "c")).set("e", td["a"] * 2), nested),
    "with_meta-clone": (lambda td: td.clone(recurse=False).set("e", td["a"] * 2), nested),
    "alike": (lambda td: td.unbind(0)[2] * 2, nested),
    "with_meta-split": (lambda td: td.split([1, 3], 0)[1] * 2, nested),
    "from_levels": (lambda td: td.flatten_keys().unflatten_keys() * 2, nested),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", CASES)
def test_compiled_equals_eager(name, backend):
    fn, make = CASES[name]
    check_compiled(fn, make(), backend)


def test_tensor_on_the_left_and_reduction_compile():
    check_compiled(lambda td: (torch.arange(4.0) * td).sum(0), nested(), "eager")


def test_torch_stack_of_nodes_compiles():
    check_compiled(lambda td: torch.stack([td, td], 0), flat(), "eager")


@pytest.mark.parametrize("nested", [False, True])
def test_constructor_guards_batch_dims_only(nested):
    # With dynamic shapes, comparing two leaves' whole shapes would guard on their other dims, and a
    # call where those dims relate differently (here: equal after unequal) would compile again. The
    # leaves of nested dicts are checked by another loop (the walk of plain dicts): it compares so too.
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    fn = torch.compile(
        lambda x, y: (
            TensorDict({"a": x, "n": {"b": y}} if nested else {"a": x, "b": y}, [x.shape[0]])[
                ("n", "b") if nested else "b"
            ]
            * 2
        ),
        fullgraph=True,
        backend=counter,
        dynamic=True,
    )
    for x, y in [(torch.ones(4, 3), torch.ones(4, 5)), (torch.ones(5, 6), torch.ones(5, 6))]:
        assert_equal(fn(x, y), y * 2)
    assert counter.frame_count == 1


def _seq() -> TDSequential:
    ident = torch.nn.Identity()
    return TDSequential(TDModule(ident, "a", "h"), TDModule(ident, "h", ("c", "d")), selected_out_keys=[("c", "d")])


# Each editor with a tensor op beside it (dynamo keeps no guards for a frame without a graph).
EDITORS: dict[str, Callable[[TensorDict], Any]] = {
    "set-new-nested-key": lambda td: td.set(("c", "d"), td["a"] * 2),
    "setdefault": lambda td: td.setdefault(("c", "d"), td["a"] * 2),
    "update-dict": lambda td: td.update({"e": td["a"] * 2, ("sub", "f"): td["a"]}),
    "rename": lambda td: (td.rename({"a": ("z", "q")}), td["a"] * 2),
    "exclude": lambda td: (td.exclude("a", ("sub", "c")), td["a"] * 2),
    "exclude-str-keys": lambda td: (td.exclude("a", "sub"), td["a"] * 2),
    "select-str-keys": lambda td: (td.select("sub", "a"), td["a"] * 2),
    "select-nested-keys": lambda td: (td.select(("sub", "d"), ("sub", "c")), td["a"] * 2),
    "update-str-keys": lambda td: td.update({"a": td["a"] * 2, "e": td["a"]}),
    "lock": lambda td: (td.lock(), td["a"] * 2),
    "tdsequential": lambda td, seq=_seq(): seq(td).set("e", td["a"] * 2),  # noqa: B008 - one module for the table
}


@pytest.mark.parametrize("name", EDITORS)
def test_compiled_editors_guard_nothing_of_dynamo_polyfills(name):
    # dict(x), reversed(...) and typing.cast in traced code make dynamo trace its polyfills and
    # guard on them (and on the builtins), which every call of the compiled function then pays.
    guards = {g.name for g in torch._dynamo.explain(EDITORS[name])(nested()).out_guards}
    assert guards, "no graph: nothing was checked"
    assert not [g for g in guards if "polyfills" in g or g.endswith((".cast", "['reversed']"))]


def _same_node(a: Any, b: Any) -> bool:
    """The same type, metadata and entries (sub-nodes compared so, leaves by identity)."""
    if not isinstance(a, TensorDict):
        return a is b
    return (
        type(a) is type(b)
        and a._meta == b._meta
        and list(a._data) == list(b._data)
        and all(_same_node(v, b._data[k]) for k, v in a._data.items())
    )


def test_traced_node_factories_build_what_the_eager_ones_build():
    # compiled code runs the twins in place of the factories: a drift between the two would make
    # compiled results differ from eager ones
    from tdtree import _base
    from tdtree._pytree import variant

    td = nested()
    data, meta = td._data, td._meta
    levels, path = [td, td["sub"]], ("sub", "c")
    leaf, doubled = td["sub", "c"], td["sub", "c"] * 2
    pairs = [
        (_base.make(TensorDict, data, meta[1], meta[2]), _base._make_traced(TensorDict, data, meta[1], meta[2])),
        (_base.from_meta(TensorDict, meta, data.values()), _base._from_meta_traced(TensorDict, meta, data.values())),
        (_base.with_meta(TensorDict, data, meta), _base._with_meta_traced(TensorDict, data, meta)),
        (
            _base.chain(TensorDict, ("p", "q"), leaf, meta[1], meta[2]),
            _base._chain_traced(TensorDict, ("p", "q"), leaf, meta[1], meta[2]),
        ),
        (_base.along(levels, path, leaf), _base._along_traced(levels, path, leaf)),
        (_base.rebuilt(levels, path, doubled), _base._rebuilt_traced(levels, path, doubled)),
    ]
    filled, filled_traced = object.__new__(TensorDict), object.__new__(TensorDict)
    _base.fill(filled, data, meta)
    _base._fill_traced(filled_traced, data, meta)
    for eager, traced in [*pairs[:3], (filled, filled_traced)]:
        assert type(eager) is type(traced) is TensorDict
        assert eager._data == traced._data == data and eager._meta == traced._meta == meta
    for eager, traced in pairs[3:]:
        assert _same_node(eager, traced)
    datas = [data, {**data, "a": doubled}]
    many, many_traced = _base.alike(TensorDict, datas, meta), _base._alike_traced(TensorDict, datas, meta)
    assert len(many) == len(many_traced) == 2
    for eager, traced, entries in zip(many, many_traced, datas):
        assert type(eager) is type(traced) is TensorDict
        assert eager._data is traced._data is entries and eager._meta == traced._meta == meta

    def levels() -> list[tuple[Any, ...]]:
        # as unflatten_keys hands them over: dicts of its own, which the factory fills with the nodes;
        # here a level of two keys and a wider one, both out of order
        top: dict[str, Any] = {}
        two = top["y"] = {"x": None, "b": td["a"]}
        wide = two["x"] = {"q": leaf, "c": doubled, "p": leaf}
        return [
            (top, None, "", meta[1], meta[2]),
            (two, top, "y", meta[1], meta[2]),
            (wide, two, "x", torch.Size([4, 2]), None),
        ]

    grown, grown_traced = _base.from_levels(TensorDict, levels()), _base._from_levels_traced(TensorDict, levels())
    assert _same_node(grown, grown_traced)
    assert list(grown.keys(True)) == ["y", ("y", "b"), ("y", "x"), ("y", "x", "c"), ("y", "x", "p"), ("y", "x", "q")]
    assert grown["y"]._meta[0] == ("b", "x") and grown["y", "x"].batch_size == (4, 2)
    # a tree whose sub-node already carries the tags asked for (kept as it is) under one that does not
    sub = td.lock()
    locked = _base.with_meta(TensorDict, {"n": sub, "x": leaf}, (("n", "x"), meta[1], meta[2], frozenset()))
    cls, tags = type(sub), sub.tags
    for tree, want in [(locked, tags), (locked.lock(), frozenset())]:
        to = cls if want else TensorDict
        eager, traced = _base.retagged(tree, to, want, variant), _base._retagged_traced(tree, to, want, variant)
        assert _same_node(eager, traced) and eager.tags == want and eager["n"].tags == want
        assert eager["x"] is leaf and eager["n", "sub", "c"] is td["sub", "c"]
    assert _base.retagged(locked.lock(), cls, tags, variant) is None
    assert _base._retagged_traced(locked.lock(), cls, tags, variant) is None
    assert _base.retagged(locked, cls, tags, variant)["n"] is sub
    chained, along, replaced = (eager for eager, _ in pairs[3:])
    assert list(chained._data) == ["p"] and chained["p", "q"] is leaf and chained["p"].batch_size == meta[1]
    assert list(along.keys(True)) == ["sub", ("sub", "c")] and along["sub", "c"] is leaf
    assert along["sub"].batch_size == td["sub"].batch_size
    assert replaced["a"] is td["a"] and replaced["sub", "c"] is doubled and replaced["sub", "d"] is td["sub", "d"]


@pytest.mark.parametrize("writer", ["update_", "copy_"])
def test_compiled_writers_guard_nothing_of_torch_pytree(writer):
    # The eager writers find values that alias a written leaf with a function that compiled code
    # would have to run through nonstrict_trace, whose argument flattening guards torch's pytree
    # registry (~1 us on every call of a compiled update_ of 20 leaves); compiled code copies every
    # value instead. The counter pins one compilation for repeated calls.
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()

    def write(td: TensorDict, src: TensorDict) -> TensorDict:
        getattr(td, writer)(src)
        return td

    td, src = flat(), flat()
    guards = {g.name for g in torch._dynamo.explain(write)(td, src).out_guards}
    assert guards, "no graph: nothing was checked"
    assert not [g for g in guards if "_pytree" in g]
    torch._dynamo.reset()
    compiled = torch.compile(write, fullgraph=True, backend=counter)
    for _ in range(3):
        src = flat()
        assert_equal(compiled(td, src), src)
    assert counter.frame_count == 1


@given(st.lists(st.text(max_size=3), unique=True).map(lambda keys: tuple(sorted(keys))), st.text(max_size=3))
def test_traced_insertion_point_finds_what_bisect_finds(order, key):
    from tdtree import _base

    at = _base.insertion_point(order, key)
    assert _base._insertion_point_traced(order, key) == at
    assert all(k <= key for k in order[:at]) and all(k > key for k in order[at:])
