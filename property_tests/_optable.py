"""The table of operations the matrix test (``test_matrix.py``) runs in every context on every input.

A row names an operation and says how to call it on a node (``node``) and on the
equivalent plain dict of tensors (``plain(d, bs)``, computed with ``optree.tree_map``
and torch only; ``bs`` is the batch size the node has at that point). Adding an
operation is one line here. The inputs have the keys ``a``, ``b`` and ``n`` (a nested
node with ``x`` and ``z``, a zero-size leaf); the tensorclass input has the same
fields, so most rows serve both.

Row fields beyond the two callables:

* ``tc``: the call on a tensorclass instance when it differs (a callable), or the
  reason the row does not apply to one (a str: a tensorclass's fields are fixed).
* ``min_batch``: batch dims the operation acts on (contexts with fewer do not run it).
* ``diff``: False when the result has no float leaf to differentiate (grad, jvp skip it).
* ``editor``: a functional editor; on a Locked node it must raise LockedError, and the
  cell checks it on ``node.unlock()`` as well.
* ``tags``: the tags of the result from the input's tags, for the operations that make
  tags (``lock``, in-place writers on a locked clone); None: the storage rule decides.
* ``cannot``: context -> the reason the cell cannot work (a torch limitation), printed
  in the test summary; ``NEW_BATCH`` for the rows whose result has batch dims its input lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optree
import torch

import tdtree as tt
import tdtree.optim as optim

Plain = Callable[[Any, torch.Size], Any]

LOCKED = frozenset({tt.Locked})
MASKED = "a boolean mask gives a data-dependent shape, which {} cannot trace"
# The error a user gets, for the summary: torch.func.vmap refuses .item()-like data-dependent ops.
NO_MASK = {
    "vmap": MASKED.format("torch.func.vmap") + " (RuntimeError: vmap: It looks like you're calling .item())",
    "tt_vmap": MASKED.format("tdtree.vmap, through torch.func.vmap,"),
    "vmap_grad": MASKED.format("torch.func.vmap"),
    "compile_eager": MASKED.format("torch.compile(fullgraph=True) without capture_dynamic_output_shape_ops"),
    "compile_aot_eager": MASKED.format("torch.compile(fullgraph=True) without capture_dynamic_output_shape_ops"),
}


NEW_BATCH = {
    "vmap": "torch.func.vmap puts the mapped dim before the result's new batch dims, so the node it rebuilds "
    "cannot match its leaves (BatchSizeError: cannot rebuild a node with batch_size (1,) ...; use tdtree.vmap)",
}


@dataclass(frozen=True)
class Row:
    name: str
    node: Callable[[Any], Any]
    plain: Plain
    tc: Callable[[Any], Any] | str | None = None
    min_batch: int = 0
    diff: bool = True
    editor: bool = False
    tags: Callable[[frozenset], frozenset] | None = None
    cannot: dict[str, str] = field(default_factory=dict)


def tmap(fn: Callable[..., torch.Tensor]) -> Plain:
    """The dict side of a leaf-wise operation."""
    return lambda d, bs: optree.tree_map(fn, d)


def bmap(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> Plain:
    """The dict side of a batch-dim operation: ``fn(leaf, number of batch dims)``."""
    return lambda d, bs: optree.tree_map(lambda t: fn(t, len(bs)), d)


def weight(bs: torch.Size) -> torch.Tensor:
    """A tensor of shape ``bs`` (batch-aligned operand), the same inside and outside transforms."""
    return torch.linspace(0.5, 1.5, math.prod(bs)).reshape(bs)


def aligned(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w.reshape(*w.shape, *[1] * (t.ndim - w.ndim))


def wmap(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Plain:
    """The dict side of ``node OP weight(bs)``: the weight broadcast over each leaf's feature dims."""
    return lambda d, bs: optree.tree_map(lambda t: fn(t, aligned(t, weight(bs))), d)


def pair(fn: Callable[..., torch.Tensor], other: Plain) -> Plain:
    return lambda d, bs: optree.tree_map(fn, d, other(d, bs))


def parts(fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]) -> Plain:
    """The dict side of an operation returning several nodes (unbind, split): a tuple of dicts."""

    def plain(d: Any, bs: torch.Size) -> tuple[Any, ...]:
        leaves, spec = optree.tree_flatten(d)
        return tuple(optree.tree_unflatten(spec, list(column)) for column in zip(*map(fn, leaves)))

    return plain


def merge(d: dict, **entries: Any) -> dict:
    return {**d, **entries}


def mask(n: int) -> torch.Tensor:
    return torch.arange(n) % 2 == 0


def _rev(n: int) -> list[int]:
    return list(range(n))[::-1]


def _named(d: dict, bs: torch.Size) -> dict:
    # named_apply spells a top-level key as a str and a nested one as a tuple
    return optree.tree_map_with_path(lambda p, t: t * (2.0 if len(p) > 1 else 3.0), d)


def _sgd_plain(d: dict, bs: torch.Size) -> tuple[dict, dict]:
    with torch.no_grad():
        buf = optree.tree_map(lambda t: t * 0.5, d)
        return optree.tree_map(lambda p, b: p - 0.1 * b, d, buf), buf


def _adam_plain(d: dict, bs: torch.Size) -> tuple[dict, tuple]:
    # torch.optim.Adam's first step, lr 0.1, default betas and eps, gradients = params
    with torch.no_grad():
        m = optree.tree_map(lambda g: 0.1 * g, d)
        v = optree.tree_map(lambda g: 0.001 * g * g, d)
        new = optree.tree_map(lambda p, m, v: p - (0.1 / 0.1) * m / (v.sqrt() / math.sqrt(0.001) + 1e-8), d, m, v)
        return new, (torch.ones(()), m, v)


def _adam(x: Any) -> Any:
    return optim.adam(x, x, optim.adam_init(x), lr=0.1)


KEYS = "a tensorclass's fields are fixed by its class: it has no key editors (replace is its editor)"
ROWS: list[Row] = [
    # arithmetic with scalars, batch-aligned tensors and another node
    Row("add_scalar", lambda x: x + 1.5, tmap(lambda t: t + 1.5)),
    Row("radd_scalar", lambda x: 1.5 + x, tmap(lambda t: 1.5 + t)),
    Row("sub_scalar", lambda x: x - 0.5, tmap(lambda t: t - 0.5)),
    Row("rsub_scalar", lambda x: 1.0 - x, tmap(lambda t: 1.0 - t)),
    Row("mul_scalar", lambda x: x * 2.5, tmap(lambda t: t * 2.5)),
    Row("div_scalar", lambda x: x / 4.0, tmap(lambda t: t / 4.0)),
    Row("rdiv_scalar", lambda x: 2.0 / (x.abs() + 1), tmap(lambda t: 2.0 / (t.abs() + 1))),
    Row("pow_scalar", lambda x: x**2, tmap(lambda t: t**2)),
    Row("mul_tensor", lambda x: x * weight(x.shape), wmap(torch.mul)),
    Row("add_tensor", lambda x: x + weight(x.shape), wmap(torch.add)),
    Row("add_node", lambda x: x + x, pair(torch.add, lambda d, bs: d)),
    Row("mul_node", lambda x: x * x.exp(), pair(torch.mul, tmap(torch.exp))),
    Row("div_node", lambda x: x / (x.abs() + 1), pair(torch.div, tmap(lambda t: t.abs() + 1))),
    # comparisons
    Row("gt_scalar", lambda x: x > 0, tmap(lambda t: t > 0), diff=False),
    Row("eq_node", lambda x: x == x, tmap(lambda t: t == t), diff=False),
    Row("le_tensor", lambda x: x <= weight(x.shape), wmap(torch.le), diff=False),
    # unary math
    Row("neg", lambda x: -x, tmap(torch.neg)),
    Row("abs", lambda x: abs(x), tmap(torch.abs)),
    Row("exp", lambda x: x.exp(), tmap(torch.exp)),
    Row("sqrt_abs", lambda x: abs(x).sqrt(), tmap(lambda t: t.abs().sqrt())),
    Row("sigmoid", lambda x: x.sigmoid(), tmap(torch.sigmoid)),
    Row("tanh", lambda x: x.tanh(), tmap(torch.tanh)),
    Row("sign", lambda x: x.sign(), tmap(torch.sign)),
    Row("clamp", lambda x: x.clamp(-0.5, 0.5), tmap(lambda t: t.clamp(-0.5, 0.5))),
    Row("detach", lambda x: x.detach(), tmap(torch.Tensor.detach), diff=False),
    Row("where", lambda x: x.where(x > 0, 0.0), tmap(lambda t: torch.where(t > 0, t, 0.0))),
    Row("tt_where", lambda x: tt.where(x > 0, x, -x), tmap(lambda t: torch.where(t > 0, t, -t))),
    # reductions over batch dims
    Row("sum_dim0", lambda x: x.sum(0), bmap(lambda t, n: t.sum(0)), min_batch=1),
    Row("sum_keepdim", lambda x: x.sum(0, keepdim=True), bmap(lambda t, n: t.sum(0, keepdim=True)), min_batch=1),
    Row("mean_all", lambda x: x.mean(), bmap(lambda t, n: t.mean(tuple(range(n))) if n else t.clone())),
    Row("amax_last", lambda x: x.amax(-1), bmap(lambda t, n: t.amax(n - 1)), min_batch=1),
    Row("max_last", lambda x: x.max(-1), lambda d, bs: parts(lambda t: tuple(t.max(len(bs) - 1)))(d, bs), min_batch=1),
    Row("min_all", lambda x: x.min(), bmap(lambda t, n: t.amin(tuple(range(n))) if n else t.clone())),
    Row("norm", lambda x: x.norm(), tmap(torch.linalg.vector_norm)),
    Row("any_dim0", lambda x: (x > 0).any(0), bmap(lambda t, n: (t > 0).any(0)), min_batch=1, diff=False),
    Row("all_scalar", lambda x: (x > -9).all(), lambda d, bs: torch.tensor(True), diff=False),
    # apply
    Row("apply", lambda x: x.apply(lambda t: t * 2 + 1), tmap(lambda t: t * 2 + 1)),
    Row("apply_view", lambda x: x.apply(lambda t: t.view(t.shape)), tmap(lambda t: t.view(t.shape))),
    Row("apply_others", lambda x: x.apply(torch.add, x), pair(torch.add, lambda d, bs: d)),
    Row("named_apply", lambda x: x.named_apply(lambda k, t: t * (2.0 if type(k) is tuple else 3.0)), _named),
    # keys
    Row("select", lambda x: x.select("a", ("n", "x")), lambda d, bs: {"a": d["a"], "n": {"x": d["n"]["x"]}}, tc=KEYS),
    Row("exclude", lambda x: x.exclude("b"), lambda d, bs: {"a": d["a"], "n": d["n"]}, tc=KEYS),
    Row("set_new", lambda x: x.set("c", x["a"] * 2), lambda d, bs: merge(d, c=d["a"] * 2), tc=KEYS, editor=True),
    Row("set_view", lambda x: x.set("c", x["a"]), lambda d, bs: merge(d, c=d["a"]), tc=KEYS, editor=True),
    Row(
        "set_leaf",
        lambda x: x.set("a", x["a"] + 1),
        lambda d, bs: merge(d, a=d["a"] + 1),
        tc=lambda x: x.replace(a=x.a + 1),
        editor=True,
    ),
    Row("update", lambda x: x.update({"b": -x["b"]}), lambda d, bs: merge(d, b=-d["b"]), tc=KEYS, editor=True),
    Row(
        "rename",
        lambda x: x.rename({"a": "c"}),
        lambda d, bs: {"b": d["b"], "c": d["a"], "n": d["n"]},
        tc=KEYS,
        editor=True,
    ),
    Row(
        "flatten_keys",
        lambda x: x.flatten_keys(),
        lambda d, bs: {"a": d["a"], "b": d["b"], "n.x": d["n"]["x"], "n.z": d["n"]["z"]},
        tc=KEYS,
    ),
    Row("unflatten_keys", lambda x: x.flatten_keys().unflatten_keys(), lambda d, bs: d, tc=KEYS),
    Row("get", lambda x: x.get(("n", "x")), lambda d, bs: d["n"]["x"], tc=lambda x: x.n["x"]),
    Row("get_node", lambda x: x["n"], lambda d, bs: d["n"], tc=lambda x: x.n),
    # indexing (batch dims)
    Row("index_int", lambda x: x[0], bmap(lambda t, n: t[0]), min_batch=1),
    Row("index_slice", lambda x: x[1:], bmap(lambda t, n: t[1:]), min_batch=1),
    Row("index_tuple", lambda x: x[:, -1], bmap(lambda t, n: t[:, -1]), min_batch=2),
    Row("index_tensor", lambda x: x[torch.tensor([0, 0])], bmap(lambda t, n: t[torch.tensor([0, 0])]), min_batch=1),
    Row(
        "index_mask", lambda x: x[mask(x.shape[0])], bmap(lambda t, n: t[mask(t.shape[0])]), min_batch=1, cannot=NO_MASK
    ),
    # shape (batch dims)
    Row(
        "view_flat", lambda x: x.view(-1), bmap(lambda t, n: t.view(math.prod(t.shape[:n]), *t.shape[n:])), min_batch=1
    ),
    Row(
        "reshape",
        lambda x: x.transpose(0, 1).reshape(-1),
        bmap(lambda t, n: t.transpose(0, 1).reshape(math.prod(t.shape[:n]), *t.shape[n:])),
        min_batch=2,
    ),
    Row(
        "permute",
        lambda x: x.permute(*_rev(x.ndim)),
        bmap(lambda t, n: t.permute(*_rev(n), *range(n, t.ndim))),
        min_batch=1,
    ),
    Row("transpose", lambda x: x.transpose(0, 1), bmap(lambda t, n: t.transpose(0, 1)), min_batch=2),
    Row("squeeze", lambda x: x.squeeze(1), bmap(lambda t, n: t.squeeze(1)), min_batch=2),
    Row("unsqueeze", lambda x: x.unsqueeze(0), tmap(lambda t: t.unsqueeze(0)), cannot=NEW_BATCH),
    Row("flatten", lambda x: x.flatten(0, 1), bmap(lambda t, n: t.flatten(0, 1)), min_batch=2),
    Row(
        "unflatten",
        lambda x: x.unflatten(0, (1, x.shape[0])),
        bmap(lambda t, n: t.unflatten(0, (1, t.shape[0]))),
        min_batch=1,
    ),
    Row("expand", lambda x: x.expand(2, *x.shape), tmap(lambda t: t.expand(2, *t.shape)), cannot=NEW_BATCH),
    Row("unbind", lambda x: x.unbind(0), parts(lambda t: t.unbind(0)), min_batch=1),
    Row("split", lambda x: x.split(1, 0), parts(lambda t: t.split(1, 0)), min_batch=1),
    Row("chunk", lambda x: x.chunk(2, 0), parts(lambda t: t.chunk(2, 0)), min_batch=1),
    Row(
        "stack",
        lambda x: tt.stack([x, x * 2]),
        pair(lambda a, b: torch.stack([a, b]), tmap(lambda t: t * 2)),
        cannot=NEW_BATCH,
    ),
    Row("torch_stack", lambda x: torch.stack([x, x]), tmap(lambda t: torch.stack([t, t])), cannot=NEW_BATCH),
    Row("cat", lambda x: tt.cat([x, x], 0), tmap(lambda t: torch.cat([t, t])), min_batch=1),
    # copies, dtypes, factories
    Row("clone", lambda x: x.clone(), tmap(torch.clone)),
    Row("clone_shallow", lambda x: x.clone(recurse=False), tmap(lambda t: t)),
    Row("contiguous", lambda x: x.contiguous(), tmap(lambda t: t.contiguous())),
    Row("to_float64", lambda x: x.to(torch.float64), tmap(lambda t: t.to(torch.float64))),
    Row("to_same", lambda x: x.to(torch.float32), tmap(lambda t: t)),
    Row("zeros_like", lambda x: torch.zeros_like(x), tmap(torch.zeros_like)),
    Row("ones_like", lambda x: torch.ones_like(x), tmap(torch.ones_like)),
    Row("full_like", lambda x: torch.full_like(x, 3.0), tmap(lambda t: torch.full_like(t, 3.0))),
    # tags
    Row("lock", lambda x: x.lock(), tmap(lambda t: t), tags=lambda t: t | LOCKED),
    Row("unlock", lambda x: x.unlock(), tmap(lambda t: t), tags=lambda t: t - LOCKED),
    # the rule after a lock, inside transforms too (through functorch wrappers): a view keeps, a copy drops
    Row("lock_view", lambda x: x.lock().apply(lambda t: t.view(t.shape)), tmap(lambda t: t), tags=lambda t: t | LOCKED),
    Row("lock_clone", lambda x: x.lock().clone(), tmap(torch.clone), tags=lambda t: frozenset()),
    # in-place writers, on a locked clone
    Row(
        "update_",
        lambda x: x.clone().lock().update_({"b": -x["b"]}),
        lambda d, bs: merge(tmap(torch.clone)(d, bs), b=-d["b"]),
        tc=lambda x: x.clone().lock().update_({"b": -x.b}),
        tags=lambda t: LOCKED,
    ),
    Row("copy_", lambda x: x.clone().lock().copy_(x * 2), tmap(lambda t: t * 2), tags=lambda t: LOCKED),
    Row("zero_", lambda x: x.clone().lock().zero_(), tmap(torch.zeros_like), tags=lambda t: LOCKED),
    # optimiser steps
    Row("sgd", lambda x: optim.sgd(x, x * 0.5, lr=0.1, momentum=0.9), _sgd_plain),
    Row("adam", _adam, _adam_plain),
]

BY_NAME = {row.name: row for row in ROWS}
assert len(BY_NAME) == len(ROWS), "row names must be unique"
