"""``tdtree.control``: torch's structured control flow over nodes, tensorclasses and any pytree of them.

``cond``, ``while_loop``, ``scan``, ``associative_scan`` and ``map`` take torch's own arguments
(``torch.cond``, ``torch.while_loop`` and ``torch._higher_order_ops.scan`` / ``associative_scan`` /
``map``) and accept, wherever torch takes a pytree of tensors, nodes, tensorclasses (tagged or
not) and any pytree mixing them with tensors, dicts, lists and tuples: what JAX's ``lax``
operators take.

How: torch is handed the flat leaves (nodes flattened in the ``"tdtree"`` namespace) and a body
that rebuilds the nodes around them, calls the user's function and flattens what it returns. The
structure of a carry is its input's; the structure of every other output is learned before torch
runs, by calling the body once, without gradients, on the first slice (``scan``, ``map``,
``associative_scan``) or on the operands (both branches of ``cond``, one step of
``while_loop``): one more step of the loop in eager, dropped from the compiled graph by the
aot_eager and inductor backends. That run also checks that a carry keeps its input's
structure, so a body that loses a key or changes a batch size, shape or dtype gets a
:class:`~tdtree.errors.ControlFlowError` naming the key, before torch's own check.

Results are new tensors: every node returned is untagged. Scanned and mapped outputs gain the
scanned dim as a batch dim (``ys.batch_size == (T, *y.batch_size)`` at ``dim=0``); carries keep
their batch size.

Aliasing: torch refuses a body whose outputs alias its inputs or each other, even over dicts.
JAX code returns an input unchanged or one tensor twice (``return carry.set("adv", adv), adv``),
so the body's outputs that *are* an input tensor, or an output already returned, are cloned
before torch sees them. A view of an input (``x[0]``, ``x.t()``) is not detected: torch refuses
it as it does for dicts; return ``x[0].clone()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from . import _torch_private as _private
from ._base import Holder, Node
from ._maps import leaves, unflat
from ._torch_private import TreeSpec as Spec
from ._validate import dim_index
from .errors import ControlFlowError

__all__ = ["cond", "while_loop", "scan", "associative_scan", "map"]


def _is_unit(x: object) -> bool:
    return isinstance(x, (Node, Holder))


def _node_of(unit: Any) -> Node:
    return unit._td if isinstance(unit, Holder) else unit


def _split(tree: Any) -> tuple[list[Any], Spec]:
    """The units of ``tree`` (nodes, tensorclasses and the other leaves) and the structure around them.

    torch's pytree, not optree, holds the structure around the units: the bodies rebuild it while
    dynamo traces them, and dynamo's stand-in for optree takes no structure made outside its trace."""
    return _private.torch_pytree.tree_flatten(tree, is_leaf=_is_unit)


def _flat(units: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for u in units:
        if _is_unit(u):
            out.extend(leaves(_node_of(u)))
        else:
            out.append(u)
    return out


def _batch_sizes(units: Sequence[Any], change: Callable[[torch.Size], torch.Size]) -> list[torch.Size | None]:
    """Each unit's batch size passed through ``change`` (None for a tensor or other leaf)."""
    return [change(_node_of(u)._meta[1]) if _is_unit(u) else None for u in units]


def _rebuild(spec: Spec, units: Sequence[Any], sizes: Sequence[torch.Size | None], it: Iterator[Any]) -> Any:
    """``spec`` over ``units`` refilled from ``it``: each node or tensorclass as a new, untagged one with
    the batch size of ``sizes``, each other leaf the next value."""
    out = []
    for u, size in zip(units, sizes):
        if _is_unit(u):
            node = unflat(_node_of(u), it, size)
            out.append(u._wrap(node) if isinstance(u, Holder) else node)
        else:
            out.append(next(it))
    return _private.torch_pytree.tree_unflatten(out, spec)


def _same(size: torch.Size) -> torch.Size:
    return size


def _unaliased(inputs: Sequence[Any], outs: list[Any]) -> list[Any]:
    """``outs`` with each tensor that is one of ``inputs`` or an earlier output cloned (torch refuses aliases)."""
    result: list[Any] = []
    for t in outs:
        if isinstance(t, torch.Tensor) and (any(t is s for s in inputs) or any(t is s for s in result)):
            t = t.clone()
        result.append(t)
    return result


def _probe(fn: Callable[[list[Any]], Any], tensors: list[Any]) -> Any:
    """What ``fn(tensors)`` returns, for its structure, shapes and dtypes: one run without gradients.

    A run on the tensors themselves (a first slice for a scan or map) costs one step of the loop;
    fake or meta tensors would save the arithmetic but cost far more per operation than the small
    steps these loops are made of, and fail on tensors the body closes over. Under ``torch.compile``
    the run is traced and its unused results are dropped by the aot_eager and inductor backends."""
    with torch.no_grad():
        return fn(tensors)


def _entries(node: Node, prefix: str, out: dict[str, str]) -> None:
    out[prefix] = f"a {type(node)._root.__name__} with batch_size {tuple(node._meta[1])}"
    for k, v in node._data.items():
        if isinstance(v, Node):
            _entries(v, f"{prefix}[{k!r}]", out)
        else:
            out[f"{prefix}[{k!r}]"] = _describe(v)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def _signature(tree: Any) -> dict[str, str]:
    """Every unit of ``tree`` and every entry of its nodes, by path, with its kind, batch size, shape
    and dtype (a tensorclass as its class)."""
    pairs, _ = _private.torch_pytree.tree_flatten_with_path(tree, is_leaf=_is_unit)
    out: dict[str, str] = {}
    for keys, u in pairs:
        path = _private.torch_pytree.keystr(keys)
        if _is_unit(u):
            _entries(_node_of(u), path, out)
            if isinstance(u, Holder):
                out[path] = f"a {type(u).__name__} with batch_size {tuple(_node_of(u)._meta[1])}"
        else:
            out[path] = _describe(u)
    return out


def _name(path: str, what: str) -> str:
    return what + path


def _check(op: str, what: str, expected: Any, got: Any, names: tuple[str, str]) -> None:
    """Raise :class:`ControlFlowError` naming each path where ``got`` differs from ``expected``;
    ``names`` says what each side is (``("the input", "the body's")``)."""
    want, have = _signature(expected), _signature(got)
    if want == have:
        return
    lines = [f"{_name(p, what)} is missing from {names[1]}" for p in want if p not in have]
    lines += [f"{_name(p, what)} is in {names[1]} only" for p in have if p not in want]
    lines += [
        f"{_name(p, what)} is {want[p]} in {names[0]}, {have[p]} in {names[1]}"
        for p in want
        if p in have and want[p] != have[p]
    ]
    raise ControlFlowError(op, f"{names[1]} {what} differs from {names[0]}", lines)


def _leaf_dims(op: str, units: Sequence[Any], dim: int) -> list[int]:
    """``dim`` as an index into each unit: a batch dim of a node or tensorclass, a dim of a tensor."""
    out = []
    for u in units:
        n = len(_node_of(u)._meta[1]) if _is_unit(u) else u.ndim
        d = dim_index(dim, n)
        if d is None:
            raise ValueError(
                f"tdtree.control.{op}: dim {dim} is out of range for {_describe(u) if not _is_unit(u) else 'a node'} "
                f"with {n} {'batch ' if _is_unit(u) else ''}dims"
            )
        out.append(d)
    return out


def _to_front(units: Sequence[Any], dims: Sequence[int]) -> list[Any]:
    """The flat leaves of ``units`` with each unit's ``dim`` moved first."""
    out = []
    for u, d in zip(units, dims):
        for leaf in _flat([u]):
            out.append(leaf if d == 0 else leaf.movedim(d, 0))
    return out


def _without(d: int) -> Callable[[torch.Size], torch.Size]:
    return lambda size: torch.Size((*size[:d], *size[d + 1 :]))


def _sliced(units: Sequence[Any], dims: Sequence[int]) -> list[torch.Size | None]:
    """Each unit's batch size without its scanned dim."""
    return [_without(d)(_node_of(u)._meta[1]) if _is_unit(u) else None for u, d in zip(units, dims)]


def _stacked(units: Sequence[Any], spec: Spec, flat: list[Any], size: int, dim: int) -> Any:
    """Outputs of structure ``spec`` over ``units`` from ``flat``, whose leaves lead with a dim of
    ``size``: placed at ``dim`` (a batch dim of each node; of each tensor)."""
    out = []
    it = iter(flat)
    for u in units:
        if _is_unit(u):
            bs = _node_of(u)._meta[1]
            d = dim_index(dim, len(bs) + 1)
            if d is None:
                raise ValueError(f"tdtree.control: dim {dim} is out of range for an output with batch_size {tuple(bs)}")
            values = [next(it) for _ in leaves(_node_of(u))]
            node = unflat(
                _node_of(u), (v if d == 0 else v.movedim(0, d) for v in values), torch.Size((*bs[:d], size, *bs[d:]))
            )
            out.append(u._wrap(node) if isinstance(u, Holder) else node)
        else:
            t = next(it)
            d = dim_index(dim, t.ndim)
            out.append(t if d in (0, None) else t.movedim(0, d))
    return _private.torch_pytree.tree_unflatten(out, spec)


def cond(
    pred: bool | int | float | torch.Tensor,
    true_fn: Callable[..., Any],
    false_fn: Callable[..., Any],
    operands: tuple | list = (),
) -> Any:
    """``torch.cond`` over nodes: ``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, one graph for both.

    Args:
        pred: a boolean scalar tensor (or a Python bool).
        true_fn, false_fn: functions of the operands returning the same structure (nodes with the
            same keys, batch sizes, shapes and dtypes).
        operands: a tuple or list of nodes, tensorclasses, tensors and pytrees of them.

    Returns:
        What the branches return, as new, untagged nodes.

    Raises:
        ControlFlowError: the branches return different structures (the message names the keys).

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.ones(2)}, batch_size=[2])
    >>> tt.control.cond(td["x"].sum() > 0, lambda t: t * 2, lambda t: t - 1, (td,))["x"]
    tensor([2., 2.])
    """
    units, spec = _split(tuple(operands))
    flat = _flat(units)
    sizes = _batch_sizes(units, _same)

    def branch(fn: Callable[..., Any]) -> Callable[[Sequence[Any]], Any]:
        return lambda ls: fn(*_rebuild(spec, units, sizes, iter(ls)))

    out_true = _probe(branch(true_fn), flat)
    _check("cond", "output", out_true, _probe(branch(false_fn), flat), ("true_fn's", "false_fn's"))
    out_units, out_spec = _split(out_true)

    def flat_branch(fn: Callable[..., Any]) -> Callable[..., tuple[Any, ...]]:
        def run(*ls: Any) -> tuple[Any, ...]:
            return tuple(_unaliased(ls, _flat(_split(branch(fn)(ls))[0])))

        return run

    result = torch.cond(pred, flat_branch(true_fn), flat_branch(false_fn), tuple(flat))
    return _rebuild(out_spec, out_units, _batch_sizes(out_units, _same), iter(result))


def while_loop(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried_inputs: tuple | list) -> Any:
    """``torch.while_loop`` over nodes: ``body_fn`` applied to the carry while ``cond_fn`` holds.

    Args:
        cond_fn: ``cond_fn(*carry)`` returns a boolean scalar tensor.
        body_fn: ``body_fn(*carry)`` returns the next carry: a tuple of the carry's structure (same
            keys, batch sizes, shapes and dtypes).
        carried_inputs: a tuple of nodes, tensorclasses, tensors and pytrees of them.

    Returns:
        The final carry, a tuple of ``carried_inputs``' structure, as new, untagged nodes.

    Raises:
        ControlFlowError: ``body_fn`` returns another structure than the carry's (names the key).

    >>> import torch, tdtree as tt
    >>> s = tt.TensorDict({"x": torch.ones(2), "n": torch.tensor(0)})
    >>> out, = tt.control.while_loop(lambda s: s["n"] < 3, lambda s: (s.set("x", s["x"] * 2).set("n", s["n"] + 1),), (s,))
    >>> out["x"], out["n"]
    (tensor([8., 8.]), tensor(3))
    """
    carry = tuple(carried_inputs)
    units, spec = _split(carry)
    flat = _flat(units)
    sizes = _batch_sizes(units, _same)

    def rebuilt(ls: Sequence[Any]) -> Any:
        return _rebuild(spec, units, sizes, iter(ls))

    _check(
        "while_loop", "carry", carry, tuple(_probe(lambda ls: body_fn(*rebuilt(ls)), flat)), ("the input", "body_fn's")
    )

    def flat_cond(*ls: Any) -> Any:
        return cond_fn(*rebuilt(ls))

    def flat_body(*ls: Any) -> tuple[Any, ...]:
        return tuple(_unaliased(ls, _flat(_split(tuple(body_fn(*rebuilt(ls))))[0])))

    return rebuilt(torch.while_loop(flat_cond, flat_body, tuple(flat)))


def scan(
    combine_fn: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, *, dim: int = 0, reverse: bool = False
) -> tuple[Any, Any]:
    """``torch._higher_order_ops.scan`` over nodes: ``carry, y = combine_fn(carry, x)`` for each slice ``x`` of ``xs``.

    Args:
        combine_fn: ``(carry, x) -> (next_carry, y)``; ``next_carry`` has ``init``'s structure (same
            keys, batch sizes, shapes and dtypes).
        init: the first carry: nodes, tensorclasses, tensors and pytrees of them.
        xs: scanned along ``dim``, a batch dim of each node and tensorclass (a dim of each tensor);
            ``combine_fn`` sees each slice without it.
        dim: the scanned dim.
        reverse: scan from the last slice to the first (``ys`` stay in ``xs``' order).

    Returns:
        ``(carry, ys)``: the last carry, of ``init``'s structure and batch sizes, and the outputs
        stacked at ``dim`` (``ys.batch_size == (T, *y.batch_size)`` for ``dim=0``). Both untagged.

    Raises:
        ControlFlowError: ``combine_fn``'s carry differs from ``init``'s structure (names the key).

    >>> import torch, tdtree as tt
    >>> xs = tt.TensorDict({"r": torch.tensor([1.0, 2.0, 3.0])}, batch_size=[3])
    >>> c, ys = tt.control.scan(lambda c, x: (c + x["r"], {"s": c + x["r"]}), torch.tensor(0.0), xs, reverse=True)
    >>> c, ys["s"]
    (tensor(6.), tensor([6., 5., 3.]))
    """
    c_units, c_spec = _split(init)
    x_units, x_spec = _split(xs)
    c_flat = _flat(c_units)
    c_sizes = _batch_sizes(c_units, _same)
    dims = _leaf_dims("scan", x_units, dim)
    x_flat = _to_front(x_units, dims)
    x_sizes = _sliced(x_units, dims)
    n_carry = len(c_flat)

    def step(ls: Sequence[Any]) -> Any:
        it = iter(ls)
        return combine_fn(_rebuild(c_spec, c_units, c_sizes, it), _rebuild(x_spec, x_units, x_sizes, it))

    probed = _probe(lambda ls: step(ls), [*c_flat, *(x[0] for x in x_flat)])
    _check("scan", "carry", init, probed[0], ("init", "combine_fn's"))
    y_units, y_spec = _split(probed[1])

    def flat_step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        inputs = [*carry, *x]
        c, y = step(inputs)
        outs = _unaliased(inputs, [*_flat(_split(c)[0]), *_flat(_split(y)[0])])
        return outs[:n_carry], outs[n_carry:]

    carry, ys = _private.scan(flat_step, c_flat, x_flat, dim=0, reverse=reverse)
    size = x_flat[0].shape[0]
    return _rebuild(c_spec, c_units, c_sizes, iter(carry)), _stacked(y_units, y_spec, list(ys), size, dim)


def associative_scan(
    combine_fn: Callable[[Any, Any], Any], xs: Any, dim: int, reverse: bool = False, combine_mode: str = "pointwise"
) -> Any:
    """``torch._higher_order_ops.associative_scan`` over nodes: the inclusive scan of ``xs`` along ``dim`` by ``combine_fn``.

    Args:
        combine_fn: an associative ``(x, y) -> z`` of two slices of ``xs`` (without ``dim``),
            returning their structure.
        xs: nodes, tensorclasses, tensors and pytrees of them; ``dim`` is a batch dim of each node
            and tensorclass (a dim of each tensor).
        dim, reverse, combine_mode: as for torch (``"pointwise"`` needs CUDA; ``"generic"`` runs anywhere).

    Returns:
        ``xs``' structure and batch sizes holding the scan, untagged.

    Raises:
        ControlFlowError: ``combine_fn`` returns another structure than a slice of ``xs``'.

    >>> import torch, tdtree as tt
    >>> xs = tt.TensorDict({"a": torch.tensor([1.0, 2.0, 3.0])}, batch_size=[3])
    >>> tt.control.associative_scan(lambda x, y: x + y, xs, 0, combine_mode="generic")["a"]
    tensor([1., 3., 6.])
    """
    units, spec = _split(xs)
    dims = _leaf_dims("associative_scan", units, dim)
    flat = _to_front(units, dims)
    sizes = _sliced(units, dims)
    n = len(flat)

    def combine(ls: Sequence[Any]) -> Any:
        return combine_fn(_rebuild(spec, units, sizes, iter(ls[:n])), _rebuild(spec, units, sizes, iter(ls[n:])))

    first = [x[0] for x in flat]
    _check(
        "associative_scan",
        "output",
        _rebuild(spec, units, sizes, iter(first)),
        _probe(combine, [*first, *first]),
        ("a slice of xs", "combine_fn's"),
    )

    def flat_combine(a: list[Any], b: list[Any]) -> list[Any]:
        inputs = [*a, *b]
        return _unaliased(inputs, _flat(_split(combine(inputs))[0]))

    out = _private.associative_scan(flat_combine, flat, 0, reverse=reverse, combine_mode=combine_mode)
    return _restored(units, spec, list(out), dims)


def _restored(units: Sequence[Any], spec: Spec, flat: list[Any], dims: Sequence[int]) -> Any:
    """``spec`` over ``units`` holding ``flat`` (each unit's dim moved back from the front to its place)."""
    it = iter(flat)
    moved: list[Any] = []
    for u, d in zip(units, dims):
        moved.extend(t if d == 0 else t.movedim(0, d) for t in (next(it) for _ in _flat([u])))
    return _rebuild(spec, units, _batch_sizes(units, _same), iter(moved))


def map(f: Callable[..., Any], xs: Any, *args: Any) -> Any:  # noqa: A001
    """``torch._higher_order_ops.map`` over nodes: ``f(x, *args)`` for each slice ``x`` of ``xs`` along its first dim.

    Args:
        f: a function of one slice of ``xs`` (and ``args``).
        xs: nodes, tensorclasses, tensors and pytrees of them, mapped along their first (batch) dim.
        *args: passed to every call unmapped (nodes, tensors and pytrees of them).

    Returns:
        ``f``'s outputs stacked along a new first dim (``out.batch_size == (T, *y.batch_size)``), untagged.

    >>> import torch, tdtree as tt
    >>> xs = tt.TensorDict({"a": torch.arange(3.0)}, batch_size=[3])
    >>> tt.control.map(lambda x, w: x * w, xs, torch.tensor(2.0))["a"]
    tensor([0., 2., 4.])
    """
    x_units, x_spec = _split(xs)
    a_units, a_spec = _split(args)
    dims = _leaf_dims("map", x_units, 0)
    x_flat = _flat(x_units)
    a_flat = _flat(a_units)
    x_sizes = _sliced(x_units, dims)
    a_sizes = _batch_sizes(a_units, _same)
    n = len(x_flat)

    def call(ls: Sequence[Any]) -> Any:
        return f(_rebuild(x_spec, x_units, x_sizes, iter(ls[:n])), *_rebuild(a_spec, a_units, a_sizes, iter(ls[n:])))

    y_units, y_spec = _split(_probe(call, [*(x[0] for x in x_flat), *a_flat]))

    def flat_call(x: list[Any], *a: Any) -> list[Any]:
        inputs = [*x, *a]
        return _unaliased(inputs, _flat(_split(call(inputs))[0]))

    out = _private.hop_map(flat_call, x_flat, *a_flat)
    return _stacked(y_units, y_spec, list(out), x_flat[0].shape[0], 0)
