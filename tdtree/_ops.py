"""Arithmetic, comparisons, unary math, ``where`` and reductions over batch dims.

Every leaf-wise operation flattens the node once (:func:`tdtree._maps.flat`), works on the
flat leaf list (``torch._foreach_*`` where one exists: it measured faster than
a Python loop over the leaves; inside a ``torch.func`` transform, where those
kernels have no batching rule, :func:`tdtree._foreach.foreach` runs the same op
leaf by leaf) and rebuilds the result with one unflatten of
the input's structure. Operands:

* a Python number: applied to every leaf as torch would;
* a tensor: aligned with the **batch** dims (DESIGN 8). A tensor of shape
  ``batch_size``, or one that broadcasts to it, acts per batch element on every
  leaf, whatever the leaf's feature dims; a 0-dim tensor acts as a scalar;
* a node: paired by key, whatever its tags. Different key sets raise
  KeyMismatchError; different batch sizes raise BatchSizeError.

Results hold new storage, so the tag rule drops tags (``td + 0`` included).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ._base import Holder, Node, NodeT
from ._foreach import foreach
from ._maps import flat, paired_leaves, rebuild, unflat
from ._tags import tag_rule
from ._validate import dim_index
from .errors import BatchDimError, BatchSizeError

if TYPE_CHECKING:
    from ._node import TensorDict

__all__ = [
    "add",
    "radd",
    "sub",
    "rsub",
    "mul",
    "rmul",
    "truediv",
    "rtruediv",
    "floordiv",
    "rfloordiv",
    "mod",
    "rmod",
    "pow",
    "rpow",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "sigmoid",
    "tanh",
    "sign",
    "clamp",
    "where",
    "sum",
    "mean",
    "amax",
    "amin",
    "all",
    "any",
    "batch_dims",
]

_SCALARS = (numbers.Number, torch.SymInt, torch.SymFloat, torch.SymBool)


def _aligned(what: str, node: Node, leaves: list[torch.Tensor], t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` viewed once per leaf so that it lines up with the leaf's batch dims."""
    if t.ndim == 0:
        return [t] * len(leaves)
    batch_size = node._meta[1]
    n = len(batch_size)
    fits = t.ndim <= n
    for s, b in zip(reversed(t.shape), reversed(batch_size)):
        fits = fits and (s == 1 or s == b)
    if not fits:
        raise BatchSizeError(
            f"{what}: a tensor operand of shape {tuple(t.shape)} does not broadcast to the batch_size "
            f"{tuple(batch_size)}; tensors act per batch element. For an operand aligned with the "
            "feature dims use td.apply(lambda x: ...)"
        )
    views: dict[int, torch.Tensor] = {}
    out = []
    for x in leaves:
        extra = x.ndim - n
        v = views.get(extra)
        if v is None:
            v = views[extra] = t.reshape(t.shape + (1,) * extra)
        out.append(v)
    return out


def _operands(what: str, node: Node, leaves: list[Any], other: Any) -> Any:
    """``other`` as a per-leaf list (nodes, tensors), as is (scalars), or NotImplemented."""
    if type(other) is int or type(other) is float:
        return other
    if isinstance(other, Node):
        return paired_leaves(what, node, other)
    if isinstance(other, torch.Tensor):
        return _aligned(what, node, leaves, other)
    if isinstance(other, _SCALARS):
        return other
    return NotImplemented


def _binary(
    name: str, op: Callable[[Any, Any], Any], kernel: Callable[..., Any] | None, reflected: bool
) -> Callable[[Node, Any], Any]:
    def fn(node: Node, other: Any) -> Any:
        leaves, spec = flat(node)
        rhs = _operands(name, node, leaves, other)
        if rhs is NotImplemented:
            return NotImplemented
        if not leaves:
            out = leaves
        elif kernel is not None:
            out = foreach(kernel)(leaves, rhs)
        elif type(rhs) is list:
            out = [op(y, x) for x, y in zip(leaves, rhs)] if reflected else [op(x, y) for x, y in zip(leaves, rhs)]
        else:
            out = [op(rhs, x) for x in leaves] if reflected else [op(x, rhs) for x in leaves]
        return unflat(spec, out)

    fn.__name__ = fn.__qualname__ = name
    side = "other OP node" if reflected else "node OP other"
    fn.__doc__ = (
        f"``{side}`` with OP = ``{name}``, leaf by leaf: other is a number, a tensor aligned with the batch "
        "dims, or a node paired by key. Returns a new node; tags dropped (new storage)."
    )
    return tag_rule(fn)


add = _binary("add", operator.add, torch._foreach_add, False)
# add and mul commute (in value and in dtype promotion), so their reflected forms use foreach too
radd = _binary("radd", operator.add, torch._foreach_add, True)
sub = _binary("sub", operator.sub, torch._foreach_sub, False)
rsub = _binary("rsub", operator.sub, None, True)
mul = _binary("mul", operator.mul, torch._foreach_mul, False)
rmul = _binary("rmul", operator.mul, torch._foreach_mul, True)
truediv = _binary("truediv", operator.truediv, torch._foreach_div, False)
rtruediv = _binary("rtruediv", operator.truediv, None, True)
floordiv = _binary("floordiv", operator.floordiv, None, False)
rfloordiv = _binary("rfloordiv", operator.floordiv, None, True)
mod = _binary("mod", operator.mod, None, False)
rmod = _binary("rmod", operator.mod, None, True)
pow = _binary("pow", operator.pow, torch._foreach_pow, False)  # noqa: A001
rpow = _binary("rpow", operator.pow, None, True)
eq = _binary("eq", operator.eq, None, False)
ne = _binary("ne", operator.ne, None, False)
lt = _binary("lt", operator.lt, None, False)
le = _binary("le", operator.le, None, False)
gt = _binary("gt", operator.gt, None, False)
ge = _binary("ge", operator.ge, None, False)


def _unary(name: str, kernel: Callable[..., Any]) -> Callable[[NodeT], NodeT]:
    def fn(node: NodeT) -> NodeT:
        leaves, spec = flat(node)
        return unflat(spec, foreach(kernel)(leaves) if leaves else leaves)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``torch.{name}`` of every leaf. Returns a new node; tags dropped (new storage)."
    return tag_rule(fn)


neg = _unary("neg", torch._foreach_neg)
abs = _unary("abs", torch._foreach_abs)  # noqa: A001
exp = _unary("exp", torch._foreach_exp)
log = _unary("log", torch._foreach_log)
sqrt = _unary("sqrt", torch._foreach_sqrt)
sigmoid = _unary("sigmoid", torch._foreach_sigmoid)
tanh = _unary("tanh", torch._foreach_tanh)
sign = _unary("sign", torch._foreach_sign)


@tag_rule
def clamp(node: NodeT, min: float | None = None, max: float | None = None) -> NodeT:  # noqa: A002
    """``torch.clamp(leaf, min, max)`` for every leaf. Returns a new node; tags dropped."""
    leaves, spec = flat(node)
    return unflat(spec, [torch.clamp(x, min, max) for x in leaves])


# Typed TensorDict, not NodeT: the result takes the type of whichever of three arguments is the first node.
@tag_rule
def where(condition: Node | torch.Tensor, input: Any, other: Any) -> TensorDict:  # noqa: A002
    """``torch.where(condition, input, other)`` leaf by leaf.

    Each of the three is a node (paired by key), a tensor (aligned with the
    batch dims) or a number; at least one is a node or a tensorclass. The
    result has the structure of the first of them among ``input``, ``other``,
    ``condition`` (an instance of its class when that is a tensorclass, whose
    tensorclass operands then compute through their inner nodes).
    Returns a new node; tags dropped (new storage).
    """
    first = next((x for x in (input, other, condition) if isinstance(x, (Node, Holder))), None)
    if isinstance(first, Holder):  # a tensorclass: its inner node computes, the result is rewrapped
        out = where(*(x._td if isinstance(x, Holder) else x for x in (condition, input, other)))
        return first._wrap(out)
    base = first
    if base is None:
        raise TypeError("tdtree.where needs a node or tensorclass among its arguments; for tensors use torch.where")
    leaves, spec = flat(base)
    parts = []
    for arg in (condition, input, other):
        part = _operands("where", base, leaves, arg)
        if part is NotImplemented:
            raise TypeError(f"where takes nodes, tensors or numbers, got {type(arg).__name__}")
        parts.append(part if type(part) is list else [part] * len(leaves))
    return unflat(spec, [torch.where(c, x, y) for c, x, y in zip(*parts)])


def batch_dims(what: str, dim: int | Sequence[int] | None, batch_size: torch.Size) -> tuple[int, ...]:
    """``dim`` as sorted non-negative batch dims (None: all); BatchDimError naming the dim and batch_size."""
    n = len(batch_size)
    if dim is None:
        return tuple(range(n))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        k = dim_index(d, n)
        if k is None:
            raise BatchDimError(
                f"{what}: dim {d!r} is out of range for the batch_size {tuple(batch_size)} "
                f"(batch dims are -{n}..{n - 1}; feature dims are reached through td.apply)"
                if n
                else f"{what}: dim {d!r} given, but the batch_size is () and has no dims to reduce"
            )
        out.append(k)
    if len(set(out)) != len(out):
        raise BatchDimError(f"{what}: dim {dims!r} names a batch dim twice")
    return tuple(sorted(out))


class _Reduction(Protocol):
    """A reduction's signature, generic in the node type (``Callable[..., T]`` cannot say that with defaults)."""

    def __call__(self, node: NodeT, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> NodeT: ...


def _reduction(name: str, torch_fn: Callable[..., torch.Tensor]) -> _Reduction:
    def fn(node: NodeT, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> NodeT:
        batch_size = node._meta[1]
        dims = batch_dims(name, dim, batch_size)
        if keepdim:
            kept = torch.Size(1 if i in dims else s for i, s in enumerate(batch_size))
        else:
            kept = torch.Size(s for i, s in enumerate(batch_size) if i not in dims)
        if dims:
            return rebuild(node, lambda x: torch_fn(x, dim=dims, keepdim=keepdim), kept)
        # torch reads dim=() as "every dim", so a reduction over no batch dims goes through a unit dim
        return rebuild(node, lambda x: torch_fn(x.unsqueeze(0), dim=0), kept)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"``torch.{name}`` over the batch dims ``dim`` (None: all of the root's batch dims), leaf by leaf; "
        "feature dims and a sub-node's extra batch dims stay. Returns a new node with the reduced "
        "batch_size; tags dropped (new storage)."
    )
    return tag_rule(fn)


sum = _reduction("sum", torch.sum)  # noqa: A001
mean = _reduction("mean", torch.mean)
amax = _reduction("amax", torch.amax)
amin = _reduction("amin", torch.amin)
_all = _reduction("all", torch.all)
_any = _reduction("any", torch.any)


def all(node: Node, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:  # noqa: A001
    """With ``dim``: a node of ``torch.all`` over those batch dims (tags dropped).

    Without ``dim``: one 0-dim bool tensor, True when every element of every
    leaf is nonzero (True for a node without leaves), usable in ``if``.
    """
    if dim is None:
        leaves, _ = flat(node)
        if not leaves:
            return torch.tensor(True)
        return torch.stack([x.all() for x in leaves]).all()
    return _all(node, dim, keepdim)


def any(node: Node, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:  # noqa: A001
    """With ``dim``: a node of ``torch.any`` over those batch dims (tags dropped).

    Without ``dim``: one 0-dim bool tensor, True when some element of some leaf
    is nonzero (False for a node without leaves), usable in ``if``.
    """
    if dim is None:
        leaves, _ = flat(node)
        if not leaves:
            return torch.tensor(False)
        return torch.stack([x.any() for x in leaves]).any()
    return _any(node, dim, keepdim)
