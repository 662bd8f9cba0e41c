"""``tdtree.control``: each operator over a node, a tagged node and a tensorclass gives what torch's own
operator gives over a dict of tensors in the same run, eager and compiled with ``fullgraph=True``;
inputs are left unchanged, results are untagged, a carry of another structure gets a named error."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import hypothesis
import hypothesis.strategies as st
import optree
import pytest
import torch

import tdtree as tt
from tdtree import _torch_private as P
from tdtree.errors import ControlFlowError
from tdtree.testing import check_compiles

T, B = 5, 3

# torch's own operators, run over dicts of tensors: the reference
TORCH = SimpleNamespace(
    cond=torch.cond, while_loop=torch.while_loop, scan=P.scan, associative_scan=P.associative_scan, map=P.hop_map
)


class State(tt.TensorClass):
    a: torch.Tensor
    b: torch.Tensor


def get(s: Any, k: str) -> torch.Tensor:
    return getattr(s, k) if isinstance(s, State) else s[k]


def put(s: Any, **kv: torch.Tensor) -> Any:
    if isinstance(s, dict):  # torch refuses an entry returned unchanged (an alias): the dict program copies it
        return {k: kv[k] if k in kv else v.clone() for k, v in s.items()}
    if isinstance(s, State):
        return s.replace(**kv)
    for k, v in kv.items():
        s = s.set(k, v)
    return s


def data(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(T, B, generator=g), "b": torch.randn(T, B, generator=g)}


def make(kind: str, d: dict[str, torch.Tensor]) -> Any:
    if kind == "dict":
        return d
    if kind == "tc":
        return State(d["a"], d["b"], batch_size=[T, B])
    td = tt.TensorDict(d, batch_size=[T, B])
    return td.lock() if kind == "tagged" else td


def prog_cond(c: Any, s: Any) -> Any:
    return c.cond(get(s, "a").sum() > 0, lambda s: put(s, a=get(s, "a") * 2), lambda s: put(s, b=get(s, "b") + 1), (s,))


def prog_cond_false(c: Any, s: Any) -> Any:
    return c.cond(
        get(s, "a").sum() > 1e9, lambda s: put(s, a=get(s, "a") * 2), lambda s: put(s, b=get(s, "b") + 1), (s,)
    )


def prog_while(c: Any, s: Any) -> Any:
    return c.while_loop(
        lambda i, s: i < 3, lambda i, s: (i + 1, put(s, a=get(s, "a") * 2 + get(s, "b"))), (torch.tensor(0), s)
    )


def _step(carry: torch.Tensor, x: Any) -> tuple[torch.Tensor, Any]:
    carry = carry * 0.5 + get(x, "a")
    return carry, put(x, b=get(x, "b") * carry)


def prog_scan(c: Any, s: Any) -> Any:
    return c.scan(_step, torch.zeros(B), s)


def prog_scan_reverse(c: Any, s: Any) -> Any:
    return c.scan(_step, torch.zeros(B), s, reverse=True)


def prog_associative_scan(c: Any, s: Any) -> Any:
    return c.associative_scan(
        lambda x, y: put(x, a=get(x, "a") + get(y, "a"), b=get(x, "b") * get(y, "b")), s, 0, combine_mode="generic"
    )


def prog_map(c: Any, s: Any) -> Any:
    return c.map(lambda x, w: put(x, a=get(x, "a") * get(x, "b") + w), s, torch.tensor(1.5))


PROGRAMS: dict[str, Callable[[Any, Any], Any]] = {
    "cond": prog_cond,
    "cond_false": prog_cond_false,
    "while_loop": prog_while,
    "scan": prog_scan,
    "scan_reverse": prog_scan_reverse,
    "associative_scan": prog_associative_scan,
    "map": prog_map,
}


def plain(x: Any) -> list[torch.Tensor]:
    """The tensors of ``x`` in canonical order (node, tensorclass and dict keys sorted)."""
    return tt.tree.leaves(x)


def nodes_in(x: Any) -> list[Any]:
    return [
        u
        for u in optree.tree_leaves(x, is_leaf=lambda u: isinstance(u, (tt.TensorDict, State)), namespace="tdtree")
        if isinstance(u, (tt.TensorDict, State))
    ]


def run(prog: Callable[[Any, Any], Any], control: Any, mode: str) -> Callable[[Any], Any]:
    fn = lambda s: prog(control, s)  # noqa: E731
    return fn if mode == "eager" else torch.compile(fn, backend=mode, fullgraph=True)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: a fresh dynamo cache


def check_program(name: str, kind: str, mode: str) -> None:
    prog = PROGRAMS[name]
    expected = run(prog, TORCH, mode)(make("dict", data()))
    d = data()
    s = make(kind, d)
    versions = [t._version for t in d.values()]
    got = run(prog, tt.control, mode)(s)
    want, have = plain(expected), plain(got)
    assert len(want) == len(have)
    for w, h in zip(want, have):
        torch.testing.assert_close(h, w)
    # the input is unchanged, in values and in versions
    for k, v in data().items():
        assert torch.equal(get(s, k), v)
    assert [t._version for t in d.values()] == versions
    # results are new tensors: no tag survives
    out_nodes = nodes_in(got)
    assert out_nodes
    for n in out_nodes:
        assert (n._td if isinstance(n, State) else n).tags == frozenset()
        if kind == "tc":
            assert isinstance(n, State)


@pytest.mark.parametrize("kind", ["node", "tagged", "tc"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_eager_matches_torch_over_dicts(name: str, kind: str) -> None:
    check_program(name, kind, "eager")


# compiled with the eager and aot_eager backends, on every kind of input: property_tests/test_control_matrix.py
@pytest.mark.parametrize("name", ["cond", "scan"])
def test_compiled_inductor_matches(name: str) -> None:
    check_program(name, "node", "inductor")


def test_scan_shapes_batch_sizes() -> None:
    s = make("node", data())
    carry, ys = tt.control.scan(
        lambda c, x: (c.set("s", c["s"] + x["a"]), x), tt.TensorDict({"s": torch.zeros(B)}, [B]), s
    )
    assert carry.batch_size == (B,)
    assert ys.batch_size == (T, B)
    torch.testing.assert_close(carry["s"], s["a"].sum(0))


def _grad_step(carry: torch.Tensor, x: Any) -> tuple[torch.Tensor, Any]:
    """A body torch's compiled scan takes gradients through over dicts: it refuses (over dicts too) one that
    returns a copy of an input, or outputs computed from the new carry."""
    y = {"y": get(x, "b") * carry}
    carry = carry * 0.5 + get(x, "a")
    return carry, y if isinstance(x, dict) else tt.TensorDict(y, batch_size=x.batch_size)


# dynamo, tracing torch's eager scan over the node's leaves, warns that it reads .grad of a non-leaf
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("mode", ["eager", "aot_eager"])
def test_scan_gradients_match_dicts(mode: str) -> None:
    def loss(c: Any, s: Any) -> torch.Tensor:
        carry, ys = c.scan(_grad_step, torch.zeros(B), s, reverse=True)
        return carry.sum() + sum(t.sum() for t in plain(ys))

    d1 = {k: v.requires_grad_() for k, v in data().items()}
    (torch.compile(loss, backend=mode, fullgraph=True) if mode != "eager" else loss)(TORCH, d1).backward()
    d2 = {k: v.requires_grad_() for k, v in data().items()}
    (torch.compile(loss, backend=mode, fullgraph=True) if mode != "eager" else loss)(
        tt.control, make("node", d2)
    ).backward()
    for k in d1:
        torch.testing.assert_close(d2[k].grad, d1[k].grad)


def test_associative_scan_under_func_grad_matches_dicts() -> None:
    def loss(c: Any, s: Any) -> torch.Tensor:
        return sum(t.sum() for t in plain(prog_associative_scan(c, s)))

    want = torch.func.grad(lambda d: loss(TORCH, d))(data())
    got = torch.func.grad(lambda d: loss(tt.control, make("node", d)))(data())
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_jax_style_aliased_outputs_are_copied() -> None:
    """``return carry.set("adv", adv), adv`` and a body returning its input unchanged run as over dicts."""
    s = make("node", data())
    init = tt.TensorDict({"adv": torch.zeros(B)}, [B])
    carry, ys = tt.control.scan(lambda c, x: (c.set("adv", c["adv"] + x["a"]), c["adv"] + x["a"]), init, s)
    torch.testing.assert_close(ys, s["a"].cumsum(0))
    torch.testing.assert_close(carry["adv"], s["a"].sum(0))
    carry, ys = tt.control.scan(lambda c, x: (c, x), init, s)
    torch.testing.assert_close(ys["b"], s["b"])
    assert ys["b"].untyped_storage().data_ptr() != s["b"].untyped_storage().data_ptr()
    (out,) = tt.control.while_loop(
        lambda n: n["i"] < 2,
        lambda n: (n.set("i", n["i"] + 1),),
        (tt.TensorDict({"i": torch.tensor(0), "x": torch.ones(2)}),),
    )
    assert int(out["i"]) == 2


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (lambda c, x: (c.exclude("b"), x["a"]), ["['b']", "missing"]),
        (lambda c, x: (c.set("a", c["a"].double()), x["a"]), ["['a']", "float64"]),
        (lambda c, x: (tt.TensorDict({"a": c["a"][None], "b": c["b"][None]}, [1, B]), x["a"]), ["batch_size (1, 3)"]),
    ],
)
def test_carry_of_another_structure_is_named(body: Callable[..., Any], words: list[str]) -> None:
    init = tt.TensorDict({"a": torch.zeros(B), "b": torch.zeros(B)}, [B])
    with pytest.raises(ControlFlowError) as err:
        tt.control.scan(body, init, make("node", data()))
    for w in words:
        assert w in str(err.value)


def test_cond_branches_of_other_structures_are_named() -> None:
    s = make("node", data())
    with pytest.raises(ControlFlowError, match="'b'"):
        tt.control.cond(torch.tensor(True), lambda s: s, lambda s: s.exclude("b"), (s,))


def test_check_compiles_accepts_control_flow() -> None:
    check_compiles(
        lambda s: prog_scan(tt.control, s),
        st.integers(0, 3).map(lambda seed: make("node", data(seed))),
        backend="eager",
        settings=hypothesis.settings(max_examples=2, deadline=None),
    )


def test_while_loop_carry_of_another_structure_is_named() -> None:
    s = tt.TensorDict({"x": torch.ones(B), "n": torch.tensor(0)})
    with pytest.raises(ControlFlowError, match=r"\['n'\].*missing"):
        tt.control.while_loop(lambda s: s["n"] < 3, lambda s: (s.exclude("n"),), (s,))


def test_compiled_carry_error_names_the_error_and_key() -> None:
    """torch lets no exception leave a fullgraph frame: under torch.compile the user gets dynamo's
    Unsupported, whose message names ControlFlowError and the key."""
    init = tt.TensorDict({"a": torch.zeros(B), "b": torch.zeros(B)}, [B])
    f = torch.compile(
        lambda s: tt.control.scan(lambda c, x: (c.exclude("b"), x["a"]), init, s), backend="eager", fullgraph=True
    )
    with pytest.raises(Exception) as err:
        f(make("node", data()))
    assert "ControlFlowError" in str(err.value) and "['b']" in str(err.value)


def test_scan_and_associative_scan_inside_vmap_match_dicts() -> None:
    """tt.vmap over nodes runs them as torch.func.vmap runs torch's operators over dicts."""
    batched = {k: torch.stack([v, v * 2]) for k, v in data().items()}
    node = tt.TensorDict(batched, [2, T, B])
    got = tt.vmap(lambda s: prog_associative_scan(tt.control, s))(node)
    want = torch.func.vmap(lambda d: prog_associative_scan(TORCH, d))(batched)
    assert got.batch_size == (2, T, B)
    carry, ys = tt.vmap(lambda s: tt.control.scan(_grad_step, get(s, "a")[0] * 0, s))(node)
    carry_d, ys_d = torch.func.vmap(lambda d: TORCH.scan(_grad_step, d["a"][0] * 0, d))(batched)
    assert ys.batch_size == (2, T, B)
    for w, h in zip(plain((want, carry_d, ys_d)), plain((got, carry, ys))):
        torch.testing.assert_close(h, w)


def test_cond_inside_vmap_matches_dicts() -> None:
    """Under vmap with a batched predicate torch's cond runs both branches and keeps one output tensor
    (its batching rule takes the first), for dicts too: a one-entry output."""

    want = torch.func.vmap(
        lambda d: TORCH.cond(d["a"].sum() > 0, lambda d: {"a": d["a"] * 2}, lambda d: {"a": d["a"] + 1}, (d,))
    )(data())
    got = tt.vmap(
        lambda s: tt.control.cond(s["a"].sum() > 0, lambda s: s.select("a") * 2, lambda s: s.select("a") + 1, (s,))
    )(make("node", data()))
    assert got.batch_size == (T, B)
    torch.testing.assert_close(got["a"], want["a"])
