"""torch's own region entry points on functions of nodes (issue 26, item 2): ``nested_compile_region``
and non-reentrant ``checkpoint``, eager and compiled (fullgraph), against the same function over a
dict of tensors in the same run, gradients included; and each higher-order operator dynamo routes
through ``__torch_function__``, run with a node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.hints_wrap import hints_wrapper
from torch._higher_order_ops.map import map as map_op
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch._higher_order_ops.wrap import dynamo_bypassing_wrapper, wrap
from torch.utils.checkpoint import checkpoint

import tdtree as tt
from tdtree import TensorDict
from tdtree import _torch_private as P

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: a fresh dynamo cache


def _leaves() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(4, 3, generator=g), "sub": {"c": torch.randn(4, generator=g)}}


def _inputs(kind: str) -> tuple[Any, torch.Tensor]:
    """The same leaves as a node or as a dict of tensors, each requiring grad, and a weight."""
    data = optree.tree_map(lambda x: x.clone().requires_grad_(), _leaves())
    w = torch.tensor(0.7, requires_grad=True)
    return (TensorDict(data, [4]) if kind == "node" else data), w


def _leaf(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * w) + x.sin()


def block(x: Any, w: torch.Tensor) -> Any:
    """One function for both kinds: node operations on a node, the same per leaf on a dict."""
    if isinstance(x, TensorDict):
        y = x.apply(lambda t: _leaf(t, w))
        return y.set("s", y["a"].sum(-1) * y["sub", "c"])
    y = optree.tree_map(lambda t: _leaf(t, w), x)
    return {**y, "s": y["a"].sum(-1) * y["sub"]["c"]}


region = torch.compiler.nested_compile_region(block)


def _add(a: Any, b: Any) -> Any:
    return a + b if isinstance(a, TensorDict) else optree.tree_map(torch.add, a, b)


def _keys(x: TensorDict) -> list[tuple[str, ...]]:
    return sorted((k,) if isinstance(k, str) else k for k in x.keys(include_nested=True, leaves_only=True))


def _flat(x: Any) -> list[torch.Tensor]:
    """The leaves in key order: a node's by its sorted nested keys, a dict's as optree sorts them."""
    if isinstance(x, TensorDict):
        return [x[k] for k in _keys(x)]
    return optree.tree_leaves(x)


def _loss(out: Any) -> torch.Tensor:
    return torch.stack([(v**2).sum() for v in _flat(out)]).sum()


def _run(fn: Callable[..., Any], kind: str, compiled: str | None, grads: bool) -> tuple[Any, list[torch.Tensor]]:
    """``fn``'s output over ``kind`` and the gradients of a loss of it w.r.t. every input leaf and w."""
    x, w = _inputs(kind)
    call = fn if compiled is None else torch.compile(fn, fullgraph=True, backend=compiled)
    out = call(x, w)
    return out, list(torch.autograd.grad(_loss(out), [*_flat(x), w])) if grads else []


def _assert_as_dict(fn: Callable[..., Any], compiled: str | None, grads: bool = True) -> None:
    out, grads_got = _run(fn, "node", compiled, grads)
    want, want_grads = _run(fn, "dict", compiled, grads)
    assert isinstance(out, TensorDict) and out.batch_size == torch.Size([4])
    assert _keys(out) == [("a",), ("s",), ("sub", "c")]
    torch.testing.assert_close(out["a"], want["a"])
    torch.testing.assert_close(out["sub", "c"], want["sub"]["c"])
    torch.testing.assert_close(out["s"], want["s"])
    for got, expected in zip(grads_got, want_grads, strict=True):
        torch.testing.assert_close(got, expected)


ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "nested_compile_region": lambda x, w: region(x, w),
    "checkpoint": lambda x, w: checkpoint(block, x, w, use_reentrant=False),
}


@pytest.mark.parametrize("compiled", [None, "eager", "aot_eager"])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_entry_point_on_nodes_gives_the_dict_values_and_gradients(entry, compiled):
    _assert_as_dict(ENTRY_POINTS[entry], compiled)


def test_entry_points_on_nodes_compile_with_inductor():
    _assert_as_dict(lambda x, w: checkpoint(region, x, w, use_reentrant=False), "inductor")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_region_called_twice_is_one_subgraph_called_twice(backend):
    # dynamo inlines a region it calls once per input structure: two calls on one structure
    def twice(x, w):
        return _add(region(x, w), region(x, w * 2))

    # torch differentiates a reused region only through AOTAutograd: backward of the "eager" backend's
    # invoke_subgraph asserts "fake_mode should be enabled for HOPs", over dicts as well
    _assert_as_dict(twice, backend, grads=backend == "aot_eager")
    counter = P.compile_counter(backend)
    x, w = _inputs("node")
    torch.compile(twice, fullgraph=True, backend=counter)(x, w)
    (graph,) = counter.graphs
    calls = [n for n in graph.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 2
    assert len({c.args[0].target for c in calls}) == 1  # both call the one subgraph module


def test_checkpoint_is_captured_as_torchs_operator():
    counter = P.compile_counter("eager")
    x, w = _inputs("node")
    torch.compile(ENTRY_POINTS["checkpoint"], fullgraph=True, backend=counter)(x, w)
    (graph,) = counter.graphs
    assert any(n.target is torch.ops.higher_order.tag_activation_checkpoint for n in graph.graph.nodes)


@tt.tensorclass
class Pair:
    a: torch.Tensor
    sub: TensorDict


def on_pair(p: Pair, w: torch.Tensor) -> Any:
    if not isinstance(p, Pair):  # the operator hands the function the instance it was given
        raise TypeError(type(p).__name__)
    return block(TensorDict({"a": p.a, "sub": p.sub}, [4]), w)


PAIR_ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "nested_compile_region": torch.compiler.nested_compile_region(on_pair),
    "checkpoint": lambda p, w: checkpoint(on_pair, p, w, use_reentrant=False),
}


@pytest.mark.parametrize("compiled", [None, "eager"])
@pytest.mark.parametrize("entry", PAIR_ENTRY_POINTS)
def test_entry_points_hand_a_tensorclass_to_the_function(entry, compiled):
    data, w = _leaves(), torch.tensor(0.7)
    pair = Pair(a=data["a"], sub=TensorDict(data["sub"], [4]), batch_size=[4])
    fn = PAIR_ENTRY_POINTS[entry]
    out = (fn if compiled is None else torch.compile(fn, fullgraph=True, backend=compiled))(pair, w)
    want = block(data, w)
    torch.testing.assert_close(out["a"], want["a"])
    torch.testing.assert_close(out["sub", "c"], want["sub"]["c"])
    torch.testing.assert_close(out["s"], want["s"])


@pytest.mark.parametrize("compiled", [None, "eager"])
def test_torch_functions_a_node_answers_still_answer(compiled):
    def fn(x):
        if isinstance(x, TensorDict):
            return torch.stack([x, x * 2], 1), torch.cat([x, x], 0), torch.zeros_like(x)
        return tuple(
            optree.tree_map(f, x)
            for f in (lambda t: torch.stack([t, t * 2], 1), lambda t: torch.cat([t, t], 0), torch.zeros_like)
        )

    call = fn if compiled is None else torch.compile(fn, fullgraph=True, backend=compiled)
    got, want = call(TensorDict(_leaves(), [4])), fn(_leaves())
    for node, d, batch in zip(got, want, ([4, 2], [8], [4]), strict=True):
        assert node.batch_size == torch.Size(batch)
        torch.testing.assert_close(node["a"], d["a"])
        torch.testing.assert_close(node["sub", "c"], d["sub"]["c"])


# -- every higher-order operator dynamo routes through __torch_function__ -------------------------


def _sin(x: Any) -> Any:
    return x.apply(torch.sin) if isinstance(x, TensorDict) else optree.tree_map(torch.sin, x)


def _first(x: Any) -> Any:
    return x[0] if isinstance(x, TensorDict) else optree.tree_map(lambda t: t[0], x)


def _unchanged(fn: Any) -> Any:
    return fn


class _Sin(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return _sin(x)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad


_sin_region = torch.compiler.nested_compile_region(_sin)

# Operators a user calls with a pytree of tensors, each with a node: the call (its output is the
# function's output on the operand).
WORKS: dict[str, Callable[[Any], Any]] = {
    "invoke_subgraph": lambda x: _sin_region(x),
    "tag_activation_checkpoint": lambda x: checkpoint(_sin, x, use_reentrant=False),
    "wrap": lambda x: wrap(_sin, x),
    "dynamo_bypassing_wrapper": lambda x: dynamo_bypassing_wrapper(_unchanged, _sin, x),
    "hints_wrapper": lambda x: hints_wrapper(_sin, (x,), {}, hints={"block": 1}),
    "custom_function_call": lambda x: _Sin.apply(x),
}
# Operators that check their operands or slice their leaves: torch takes the node to them now (no
# __torch_function__ in the way), and then refuses it (cond: builtin containers only; while_loop:
# dynamo fails flattening the carry node it rebuilt, "no attribute '_data'") or hands the body slices
# a node's batch size cannot hold (scan, associative_scan, map): tdtree.control offers each under
# the same name, on nodes.
NEEDS_CONTROL: dict[str, Callable[[Any], Any]] = {
    "cond": lambda x: torch.cond(torch.tensor(True), _sin, _sin, (x,)),
    "while_loop": lambda x: while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, _sin(y)), (torch.tensor(0), x))[1],
    "scan": lambda x: scan(lambda c, y: (_add(c, y), _sin(y)), _first(x), x)[1],
    "associative_scan": lambda x: associative_scan(_add, x, 0, combine_mode="generic"),
    "map_impl": lambda x: map_op(_sin, x),
}
# The rest take tensors, aten operators or graphs that torch itself builds (the autograd and export
# variants of the ones above, attention kernels, quantization, effect tokens), or refuse a dict too:
# no user hands them a pytree of tensors, so a node has nothing to do there.
#   print: dynamo proxies its keyword arguments as they are (a dict, not a node); strict_mode: flat
#   operands only. wrap_activation_checkpoint: checkpoint's handler under functorch's
#   functionalize_rng_ops, the same handler as tag_activation_checkpoint.
NOT_GIVEN_PYTREES = {
    "auto_functionalized",
    "auto_functionalized_v2",
    "call_torchbind",
    "executorch_call_delegate",
    "flex_attention",
    "flex_attention_backward",
    "foreach_map",
    "inline_asm_elementwise",
    "invoke_quant",
    "invoke_quant_packed",
    "local_map_hop",
    "out_dtype",
    "print",
    "run_with_rng_state",
    "strict_mode",
    "trace_wrapped",
    "while_loop_stack_output",
    "wrap_activation_checkpoint",
}


def test_the_list_is_every_operator_dynamo_routes_through_torch_function():
    # derived from dynamo's own handler registry at test time: a torch release that adds one fails here
    listed = [*WORKS, *NEEDS_CONTROL, *NOT_GIVEN_PYTREES]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == P.dynamo_higher_order_operators()


def _node_and_dict() -> tuple[TensorDict, dict[str, Any]]:
    return TensorDict(_leaves(), [4]), _leaves()


@pytest.mark.parametrize("name", WORKS)
def test_operator_takes_a_node_as_it_takes_a_dict(name):
    node, d = _node_and_dict()
    call = torch.compile(WORKS[name], fullgraph=True, backend="eager")
    got, want = call(node), call(d)
    assert isinstance(got, TensorDict) and got.batch_size == node.batch_size
    torch.testing.assert_close(got["a"], want["a"])
    torch.testing.assert_close(got["sub", "c"], want["sub"]["c"])


@pytest.mark.parametrize("name", NEEDS_CONTROL)
def test_operator_reaches_torch_with_a_node_and_torch_refuses(name):
    node, d = _node_and_dict()
    call = torch.compile(NEEDS_CONTROL[name], fullgraph=True, backend="eager")
    torch.testing.assert_close(optree.tree_leaves(call(d)), optree.tree_leaves(NEEDS_CONTROL[name](d)))  # a dict goes
    with pytest.raises(Exception) as refused:
        call(node)
    assert "__torch_function__" not in str(refused.value)


@pytest.mark.parametrize("compiled", [None, "eager", "aot_eager"])
def test_tags_follow_the_storage_rule_through_the_entry_points(compiled):
    locked = TensorDict(_leaves(), [4]).lock()
    cases = {
        "checkpoint returns its input": lambda t: checkpoint(lambda u: u, t, use_reentrant=False),
        "checkpoint computes": lambda t: checkpoint(_sin, t, use_reentrant=False),
        "region computes": lambda t: _sin_region(t),
    }
    for name, fn in cases.items():
        torch._dynamo.reset()
        out = (fn if compiled is None else torch.compile(fn, fullgraph=True, backend=compiled))(locked)
        same = out["a"].untyped_storage().data_ptr() == locked["a"].untyped_storage().data_ptr()
        # a node holding the locked node's own storages may say Locked; one holding new tensors says nothing
        assert out.tags == (locked.tags if same else frozenset()), name
        assert same == (name == "checkpoint returns its input"), name
