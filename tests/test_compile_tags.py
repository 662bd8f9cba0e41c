"""Tags under torch.compile(fullgraph=True): lock, unlock and rebuilds of tagged nodes and tensorclasses,
the Locked refusal and the other named errors, a boolean-mask index, and the rule inside torch.func
transforms. Each compiled function has no graph break, gives eager's values and tags, and runs again
with new tensor values without compiling again."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import tdtree as tt
from tdtree import Locked, Shared, TensorDict
from tdtree.errors import BatchSizeError, KeyMismatchError, KeyNotFoundError, LockedError, NotANodeKeyError

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: a fresh dynamo cache


class Pair(tt.TensorClass):
    obs: torch.Tensor
    sub: TensorDict


def nested(seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"x": torch.randn(4, 3, generator=g), "n": {"y": torch.randn(4, 2, generator=g)}}, [4])


def unbatched(seed: int) -> TensorDict:
    """A stacked ensemble for torch.func.vmap and grad: no batch size, leaves mapped over dim 0."""
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"x": torch.randn(4, 3, generator=g), "n": {"y": torch.randn(4, 2, generator=g)}})


def pair(seed: int) -> Pair:
    td = nested(seed)
    return Pair(obs=td["x"], sub=td["n"], batch_size=[4])


def tag_tree(out: Any) -> list[Any]:
    """The tags of every node in ``out`` (nodes, tensorclasses, tuples), by path; a tensor has none."""
    if isinstance(out, tuple):
        return [tag_tree(o) for o in out]
    if isinstance(out, tt.TensorClass):
        return ["class", type(out).__name__, *tag_tree(out.to_node())]
    if isinstance(out, TensorDict):
        subs = [(k, v.tags) for k, v in out.items(include_nested=True) if isinstance(v, TensorDict)]
        return [out.tags, subs]
    return []


def leaves(out: Any) -> list[torch.Tensor]:
    """The tensors of ``out`` in order, through nodes, tensorclasses and tuples."""
    if isinstance(out, tuple):
        return [t for o in out for t in leaves(o)]
    if isinstance(out, tt.TensorClass):
        out = out.to_node()
    if isinstance(out, TensorDict):
        return [v for _, v in out.items(include_nested=True, leaves_only=True)]
    return [out]


def check(fn: Callable[..., Any], make: Callable[[int], tuple[Any, ...]], backend: str) -> None:
    """``fn`` compiled with ``fullgraph=True``: no graph break, eager's values and tags, one compile for two calls.

    fullgraph=True raises on any graph break (torch._dynamo.explain would count the masked index's
    nonzero as one, which dynamo only captures in fullgraph mode).
    """
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    for seed in (0, 1):  # new tensor values on the second call, same structure and tags
        args = make(seed)
        out, expected = compiled(*args), fn(*args)
        if seed == 0:
            converted = counters["frames"]["total"]  # dynamo sees a frame again only to compile it again
        assert tag_tree(out) == tag_tree(expected)
        assert type(out) is type(expected)
        got, want = leaves(out), leaves(expected)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert counters["frames"]["total"] == converted
    assert counter.frame_count <= 1


def locked(seed: int) -> tuple[Any, ...]:
    return (nested(seed).lock(),)


def shared(seed: int) -> tuple[Any, ...]:
    return (nested(seed).share_memory(),)


def untagged(seed: int) -> tuple[Any, ...]:
    return (nested(seed),)


# -- lock, unlock, rebuilds ------------------------------------------------------------------------

TAG_CASES: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[Any, ...]]]] = {
    "lock": (lambda td: td.lock(), untagged),
    "lock-shared": (lambda td: td.unlock().lock(), shared),
    "unlock-locked": (lambda td: td.unlock(), locked),
    "unlock-shared": (lambda td: td.unlock(), shared),
    "lock-then-view": (lambda td: td.lock()[1:3], untagged),
    "rebuild-index": (lambda td: td[0], shared),
    "rebuild-select": (lambda td: td.select("n"), shared),
    "rebuild-reshape": (lambda td: td.reshape(2, 2), locked),
    "rebuild-unbind": (lambda td: td.unbind(0), shared),
    "arith-drops": (lambda td: td * 2, shared),
    "apply-drops": (lambda td: td.apply(lambda x: x + 1), locked),
    "clone-drops": (lambda td: td.clone(), locked),
    "nested-lock": (lambda td: td.set("n", td["n"].lock()), untagged),
    "nested-unlock": (lambda td: td.unlock()["n"].unlock(), shared),
    "sub-node-of-locked": (lambda td: td["n"], locked),
    # no-op moves return the node itself, eager and compiled; real ones drop the tags
    "to-same-device": (lambda td: (td.to("cpu"), td.cpu()), shared),
    "to-same-dtype": (lambda td: td.to(torch.float32), locked),
    "to-other-dtype-drops": (lambda td: td.to(torch.float64), shared),
    "contiguous-of-contiguous": (lambda td: td.contiguous(), shared),
    "contiguous-of-strided-drops": (lambda td: (td[::2], td[::2].contiguous()), shared),
    "tagged-types": (
        lambda td: (
            td["x"] * (2 if isinstance(td, TensorDict[Shared]) else 3)
            + (1 if isinstance(td.unlock(), TensorDict[Locked, Shared]) else 0)
            + (10 if type(td.unlock()) is TensorDict[Shared] else 0)
        ),
        shared,
    ),
    "mixed-binary": (lambda a, b: (a + b, a.select("x"), b["n"]), lambda s: (nested(s).lock(), nested(s + 7))),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", TAG_CASES)
def test_tags_compile_as_in_eager(name: str, backend: str) -> None:
    fn, make = TAG_CASES[name]
    check(fn, make, backend)


@pytest.mark.parametrize("name", ["unlock-shared", "rebuild-reshape", "arith-drops"])
def test_tags_compile_with_inductor(name: str) -> None:
    fn, make = TAG_CASES[name]
    check(fn, make, "inductor")


def test_tags_stay_constants() -> None:
    # what an enum gives dynamo must not cost what the tags were before
    assert repr(Locked) == str(Locked) == "Locked"
    assert sorted([Shared, tt.Memmap, Locked]) == [Locked, tt.Memmap, Shared]
    assert pickle.loads(pickle.dumps(Shared)) is Shared
    assert TensorDict[Locked, Shared] is TensorDict[Shared, Locked]
    assert Shared.claim == "every leaf with data lives in shared memory"
    assert tt.Tag["Memmap"] is tt.Memmap
    td = pickle.loads(pickle.dumps(nested(0).lock()))
    assert type(td) is TensorDict[Locked]


def test_node_types_made_later_compile_nothing_again() -> None:
    # The tag rule's gate asks whether an argument's type is an untagged one; compiled code answers
    # once per type, so a node type made after compiling (it joins that table) changes nothing the
    # compiled code guards on. (A rule decided for a tagged input still reads torch's pytree table,
    # which a new node type grows.)
    counter = CompileCounterWithBackend("eager")

    def fn(td: TensorDict) -> Any:
        return td.set("z", td["x"] * 2), td.set(("n", "w"), td["x"]), td + 1, td.exclude("x")

    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    compiled(nested(0))

    class Later(TensorDict):
        pass

    td = nested(1)
    out, expected = compiled(td), fn(td)
    assert counter.frame_count == 1
    assert tag_tree(out) == tag_tree(expected)
    for a, b in zip(leaves(out), leaves(expected)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert type(Later({}).set("z", torch.zeros(()))) is Later  # the new type is a root type of its own


# -- tensorclasses -------------------------------------------------------------------------------

TC_CASES: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[Any, ...]]]] = {
    "lock": (lambda p: p.lock(), lambda s: (pair(s),)),
    "unlock-shared": (lambda p: p.unlock(), lambda s: (pair(s).share_memory(),)),
    "view-keeps": (lambda p: p[1:3], lambda s: (pair(s).share_memory(),)),
    "arith-drops": (lambda p: p * 2, lambda s: (pair(s).lock(),)),
    "replace-unlocked-of-shared": (lambda p: p.unlock().replace(obs=p.obs), lambda s: (pair(s).share_memory(),)),
    "replace-new-drops": (lambda p: p.unlock().replace(obs=p.obs * 2), lambda s: (pair(s).share_memory(),)),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", TC_CASES)
def test_tensorclass_tags_compile_as_in_eager(name: str, backend: str) -> None:
    fn, make = TC_CASES[name]
    pair(0).lock()  # the class resolves its annotations on first use, outside compiled code
    check(fn, make, backend)


# -- the Locked refusal and the named errors ---------------------------------------------------------

REFUSED: dict[str, tuple[Callable[..., Any], Any, type[Exception], str]] = {
    "set": (lambda td: td.set("z", td["x"] * 2), locked, LockedError, "set() on a locked node"),
    "set-nested": (lambda td: td.set(("n", "z"), td["x"]), locked, LockedError, "on a locked node"),
    "rename": (lambda td: td.rename({"x": "w"}), locked, LockedError, "rename() on a locked node"),
    "update": (lambda td: td.update({"x": td["x"] + 1}), shared, LockedError, "update() on a locked node"),
    "replace": (lambda p: p.replace(obs=p.obs + 1), lambda s: (pair(s).lock(),), LockedError, "replace()"),
    "missing-key": (lambda td: td["nope"] * 2, locked, KeyNotFoundError, "key 'nope' not found"),
    "through-a-tensor": (lambda td: td["x", "y"] * 2, untagged, NotANodeKeyError, "'x' is a tensor"),
    "key-mismatch": (lambda td: td + td.select("x"), locked, KeyMismatchError, "the nodes' keys differ"),
    "batch-size": (lambda td: td.set("z", torch.zeros(3)), untagged, BatchSizeError, "batch"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_named_errors_reach_the_user_under_compile(name: str) -> None:
    # fullgraph=False: dynamo traces to the raise, and the user gets the error itself
    fn, make, error, message = REFUSED[name]
    with pytest.raises(error, match=re.escape(message)):
        fn(*make(0))
    torch._dynamo.reset()
    with pytest.raises(error, match=re.escape(message)):
        torch.compile(fn, backend="eager")(*make(0))


@pytest.mark.parametrize("name", REFUSED)
def test_named_errors_are_named_under_fullgraph(name: str) -> None:
    # torch lets no exception leave a fullgraph frame: it reports the traced raise as Unsupported
    # ("Observed exception"), whose message names the error class and its arguments; before the
    # errors' construction was traceable it named dynamo's failure on super().__init__ instead.
    fn, make, error, _ = REFUSED[name]
    with pytest.raises(torch._dynamo.exc.Unsupported, match=f"raised exception {error.__name__}\\("):
        torch.compile(fn, fullgraph=True, backend="eager")(*make(0))


def test_named_errors_pickle_as_raised() -> None:
    for err in (
        LockedError("set"),
        KeyNotFoundError("nope", ["a", "b"]),
        NotANodeKeyError(("x", "y"), ("x",)),
        KeyMismatchError("add", ["a"], ["b"]),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.args == err.args


# -- boolean masks ---------------------------------------------------------------------------------


def masked(seed: int) -> tuple[Any, ...]:
    td = nested(seed).share_memory()
    return td, td["x"][:, 0] > 0


def test_mask_index_of_a_tagged_node_compiles() -> None:
    check(lambda td, m: td[m], masked, "aot_eager")
    td, m = masked(2)
    out = torch.compile(lambda t, i: t[i], fullgraph=True, backend="aot_eager")(td, m)
    expected = {"x": td["x"][m], ("n", "y"): td["n", "y"][m]}  # torch's own boolean index, leaf by leaf
    assert {k: v for k, v in out.items(include_nested=True, leaves_only=True)}.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(out[key], value, rtol=0, atol=0)


def test_mask_index_with_an_index_tensor_and_a_view_compile() -> None:
    check(lambda td, m: (td[m], td[1:], td[torch.tensor([0, 2])]), masked, "eager")


def test_all_false_mask_drops_tags_compiled_only() -> None:
    # The documented difference (tag_rule's docstring): eager sees a zero-byte result and keeps the
    # tags; compiled code cannot know the size while tracing and fails safe by dropping them.
    td = nested(0).lock()
    none = torch.zeros(4, dtype=torch.bool)
    assert type(td[none]) is TensorDict[Locked]
    out = torch.compile(lambda t, m: t[m], fullgraph=True, backend="eager")(td, none)
    assert type(out) is TensorDict and out.batch_size == torch.Size([0])


# -- inside torch.func transforms -----------------------------------------------------------------


def code(node: Any) -> float:
    """``node``'s tags as a number (Locked 1, Memmap 2, Shared 4), to carry them out of a transform."""
    return float(sum(2**i for i, t in enumerate(sorted(tt.Tag)) if t in node.tags))


def view_and_new(q: TensorDict) -> torch.Tensor:
    """``q``'s view and arithmetic results' tags, as values; each also locked first inside the transform."""
    ql = q.lock()
    codes = [
        code(q.select("x")),
        code(q["n"]),
        code(q.apply(lambda x: x * 2)),
        code(ql.select("x")),
        code(ql.apply(lambda x: x * 2)),
    ]
    return q["x"] * 0 + torch.tensor(codes).sum() + codes[3] * 10 + codes[4] * 100


TRANSFORMS: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[Any, ...]]]] = {
    "vmap-locked": (lambda td: torch.func.vmap(view_and_new)(td), lambda s: (unbatched(s).lock(),)),
    "vmap-shared": (lambda td: torch.func.vmap(view_and_new)(td), lambda s: (unbatched(s).share_memory(),)),
    "grad-locked": (
        lambda td: torch.func.grad(lambda q: (view_and_new(q) * q["x"]).sum())(td),
        lambda s: (unbatched(s).lock(),),
    ),
    "vmap-grad": (
        lambda td: torch.func.vmap(torch.func.grad(lambda q: (view_and_new(q) * q["x"]).sum()))(td),
        lambda s: (unbatched(s).share_memory(),),
    ),
    "tdtree-vmap": (
        lambda td: tt.vmap(lambda q: (q.select("x"), q["n"], q.apply(lambda x: x * 2), view_and_new(q)))(td),
        lambda s: (nested(s).share_memory(),),
    ),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", TRANSFORMS)
def test_rule_inside_transforms_compiles_as_in_eager(name: str, backend: str) -> None:
    fn, make = TRANSFORMS[name]
    check(fn, make, backend)


def test_rule_inside_a_transform_sees_the_wrapped_storage() -> None:
    # the eager baseline the compiled cases match: inside vmap and grad, a view of a Locked node keeps
    # Locked and a new tensor drops it, as outside any transform
    seen = []

    def f(q: TensorDict) -> torch.Tensor:
        ql = q.lock()
        seen.append((ql.select("x").tags, ql["n"].tags, ql.apply(lambda x: x * 2).tags))
        return (q["x"] * 2).sum()

    torch.func.vmap(f)(unbatched(0))
    torch.func.grad(f)(unbatched(0))
    torch.func.vmap(torch.func.grad(f))(unbatched(0))
    assert seen == [({Locked}, {Locked}, frozenset())] * 3
