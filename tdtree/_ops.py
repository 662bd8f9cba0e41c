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

import itertools
import numbers
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from ._base import Holder, Node, NodeT
from ._foreach import foreach
from ._kinds import error
from ._lookup import walk_keys
from ._maps import flat, leafwise, paired_leaves, rebuild, retried, unflat, unflat_scalar
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
    "detach",
    "where",
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "norm",
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


_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**"}
_SYMBOLS.update(eq="==", ne="!=", lt="<", le="<=", gt=">", ge=">=")

_BINARY_DOC = """``{expr}`` leaf by leaf (what ``{dunder}`` runs).

Args:
    node: the node (``self`` as a method).
    other: a number (applied to every leaf); a tensor aligned with the batch dims, of shape
        ``batch_size`` or one that broadcasts to it, acting per batch element on every leaf (a
        0-dim tensor acts as a number); or a node paired by key, whatever its tags.

Returns:
    A new node with ``node``'s keys and batch sizes holding {what}; tags dropped (new storage).
    NotImplemented for any other ``other``, so Python then raises TypeError.

Raises:
    KeyMismatchError: ``other`` is a node with other keys (the message lists them).
    BatchSizeError: ``other`` is a node of another batch size, or a tensor that does not
        broadcast to ``batch_size``.
"""


def _binary(
    name: str, op: Callable[[Any, Any], Any], kernel: Callable[..., Any] | None, reflected: bool
) -> Callable[[NodeT, Any], NodeT]:
    def fn(node: NodeT, other: Any) -> NodeT:
        leaves, spec = flat(node)
        rhs = _operands(name, node, leaves, other)
        if rhs is NotImplemented:
            return NotImplemented
        try:
            if not leaves:
                out = leaves
            elif kernel is not None:
                out = foreach(kernel)(leaves, rhs)
            elif type(rhs) is list:
                out = [op(y, x) for x, y in zip(leaves, rhs)] if reflected else [op(x, y) for x, y in zip(leaves, rhs)]
            else:
                out = [op(rhs, x) for x in leaves] if reflected else [op(x, rhs) for x in leaves]
        except Exception:
            column = rhs if type(rhs) is list else itertools.repeat(rhs)
            fallback = retried(name, node, (lambda x, y: op(y, x)) if reflected else op, leaves, column)
            if fallback is None:
                raise
            out = fallback
        return unflat(spec, out)

    fn.__name__ = fn.__qualname__ = name
    symbol = _SYMBOLS[name[1:] if reflected else name]
    fn.__doc__ = _BINARY_DOC.format(
        expr=f"other {symbol} node" if reflected else f"node {symbol} other",
        dunder=f"__{name}__",
        what="bools" if name in ("eq", "ne", "lt", "le", "gt", "ge") else "the results",
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
    per_leaf = getattr(torch, name)

    def fn(node: NodeT) -> NodeT:
        leaves, spec = flat(node)
        try:
            return unflat(spec, foreach(kernel)(leaves) if leaves else leaves)
        except Exception:
            out = retried(name, node, per_leaf, leaves)
            if out is None:
                raise
            return unflat(spec, out)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"``torch.{name}`` of every leaf (``td.{name}()``).\n\n"
        "Args:\n    node: the node (``self`` as a method).\n\n"
        "Returns:\n    A new node with the same keys and batch sizes; tags dropped (new storage).\n"
    )
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
def detach(node: NodeT) -> NodeT:
    """Every leaf detached from autograd (``Tensor.detach``), as ``td.detach()`` (tensordict's ``detach``).

    Returns:
        A new node of the same keys and batch size whose leaves share the input's storage and
        require no grad (an ``nn.Parameter`` leaf becomes a plain tensor). The storage is the
        input's, so the tags are kept (the rule).

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"w": torch.ones(2, requires_grad=True)})
    >>> out = td.detach()
    >>> out["w"].requires_grad, out["w"].data_ptr() == td["w"].data_ptr()
    (False, True)
    """
    leaves, spec = flat(node)
    return unflat(spec, [x.detach() for x in leaves])


@tag_rule
def clamp(node: NodeT, min: Any = None, max: Any = None) -> NodeT:  # noqa: A002
    """``torch.clamp(leaf, min, max)`` for every leaf.

    Args:
        node: the node (``self`` as a method).
        min: the lower bound (a number or a tensor broadcasting to every leaf), or None for none.
        max: the upper bound, likewise.

    Returns:
        A new node with the same keys and batch sizes; tags dropped (new storage).

    >>> import torch, tdtree as tt
    >>> tt.TensorDict({"x": torch.tensor([-2.0, 0.5, 3.0])}).clamp(0, 1)["x"]
    tensor([0.0000, 0.5000, 1.0000])
    """
    leaves, spec = flat(node)
    return unflat(spec, leafwise("clamp", node, torch.clamp, leaves, itertools.repeat(min), itertools.repeat(max)))


# Typed TensorDict, not NodeT: the result takes the type of whichever of three arguments is the first node.
@tag_rule
def where(condition: Node | torch.Tensor, input: Any, other: Any) -> TensorDict:  # noqa: A002
    """``torch.where(condition, input, other)`` leaf by leaf (``tdtree.where``).

    Args:
        condition: a node of bools (paired by key), a bool tensor aligned with the batch dims
            (one value per batch element) or a bool.
        input: the values where ``condition`` holds: a node, a tensor aligned with the batch
            dims, or a number.
        other: the values elsewhere, likewise.

    At least one of the three is a node or a tensorclass instance.

    Returns:
        A new node with the structure of the first node among ``input``, ``other``, ``condition``
        (an instance of its class when that is a tensorclass: tensorclass operands compute through
        their inner nodes); tags dropped (new storage).

    Raises:
        TypeError: none of the three is a node or tensorclass, or one is of another type.
        KeyMismatchError: two nodes hold different keys.
        BatchSizeError: two nodes' batch sizes differ, or a tensor does not broadcast to the batch size.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.tensor([1.0, 2.0])}, batch_size=[2])
    >>> tt.where(torch.tensor([True, False]), td, 0)["x"]
    tensor([1., 0.])
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
    return unflat(spec, leafwise("where", base, torch.where, *parts))


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


_N = TypeVar("_N", bound=Node, covariant=True)


class _BoundReduction(Protocol[_N]):
    def __call__(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> _N: ...


class _Reduction(Protocol):
    """A reduction's signature, generic in the node type (``Callable[..., T]`` cannot say that with defaults);
    ``__get__`` types it as a method where a class binds it (``TensorDict.sum = _ops.sum``)."""

    def __call__(self, node: NodeT, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> NodeT: ...

    def __get__(self, obj: NodeT, owner: Any) -> _BoundReduction[NodeT]: ...


_REDUCTION_DOC = """``torch.{name}`` of every leaf over batch dims ``dim`` (``td.{name}(dim)``).

Args:
    node: the node (``self`` as a method).
    dim: a batch dim or a sequence of them (negative counts from the end of the batch dims);
        None: all of the root's batch dims. Feature dims and a sub-node's extra batch dims stay.
    keepdim: keep the reduced batch dims with size 1.

Returns:
    A new node with the reduced batch size; tags dropped (new storage).

A node without batch dims (batch_size ()) has nothing to reduce: the result is a new node
with the same values (new storage, so untagged; the dtype is torch's for the reduction, so a
sum of bools is int64). ``torch.{name}(t, dim=())`` would reduce every dim, feature dims
included; here ``dim=None`` means every *batch* dim, of which there are none. Reduce a leaf's
own dims with ``td.apply(torch.{name})`` or ``td.norm()``.

Raises:
    BatchDimError: a dim is out of range for the batch dims, or named twice.
"""


def _kept(batch_size: torch.Size, dims: tuple[int, ...], keepdim: bool) -> torch.Size:
    """The batch size left after reducing batch dims ``dims``."""
    if keepdim:
        return torch.Size(1 if i in dims else s for i, s in enumerate(batch_size))
    return torch.Size(s for i, s in enumerate(batch_size) if i not in dims)


def _reduction(name: str, torch_fn: Callable[..., torch.Tensor]) -> _Reduction:
    def fn(node: NodeT, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> NodeT:
        dims = batch_dims(name, dim, node._meta[1])
        kept = _kept(node._meta[1], dims, keepdim)
        if dims:
            return rebuild(node, lambda x: torch_fn(x, dim=dims, keepdim=keepdim), kept)
        # torch reads dim=() as "every dim", so a reduction over no batch dims goes through a unit dim
        return rebuild(node, lambda x: torch_fn(x.unsqueeze(0), dim=0), kept)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = _REDUCTION_DOC.format(name=name)
    return tag_rule(fn)


sum = _reduction("sum", torch.sum)  # noqa: A001
mean = _reduction("mean", torch.mean)
amax = _reduction("amax", torch.amax)
amin = _reduction("amin", torch.amin)
_all = _reduction("all", torch.all)
_any = _reduction("any", torch.any)


_EXTREME_DOC = """The {what} over batch dims, as ``torch.{name}`` (``td.{name}()``, ``td.{name}(dim)``).

Args:
    node: the node (``self`` as a method).
    dim: None: the {what} over every batch dim, the node :func:`a{name}` gives (values only, as
        ``torch.{name}(t)``; feature dims stay, by DESIGN 4, where tensordict's ``td.{name}()``
        reduces them too). An int: one batch dim (negative counts from the last batch dim).
    keepdim: keep the reduced batch dims with size 1.

Returns:
    Without ``dim``: a new node. With ``dim``: a ``torch.return_types.{name}`` ``(values,
    indices)`` of two new nodes with the reduced batch size, as ``torch.{name}(t, dim)`` and
    tensordict's ``td.{name}(dim)`` give; ``indices`` holds int64 positions along ``dim``. Tags
    dropped (new storage). A node without batch dims has nothing to reduce: ``td.{name}()`` is a
    new node of the same values; reduce a leaf's own dims with ``td.apply(torch.a{name})`` or
    ``td.norm()``.

Raises:
    BatchDimError: ``dim`` is out of range for the batch dims.
    TypeError: ``dim`` is a sequence (``td.a{name}(dims)`` reduces several dims).

>>> import torch, tdtree as tt
>>> td = tt.TensorDict({{"x": torch.tensor([[1, 5], [4, 2]])}}, batch_size=[2])
>>> td.{name}()["x"]
tensor({example_all})
>>> td.{name}(0).indices["x"]
tensor({example_indices})
"""


def _extreme(
    name: str, torch_fn: Callable[..., Any], over_all: _Reduction, example: tuple[str, str]
) -> Callable[..., Any]:
    structseq = getattr(torch.return_types, name)

    def fn(node: Node, dim: int | None = None, keepdim: bool = False) -> Any:
        if dim is None:
            return over_all(node, None, keepdim)
        if not isinstance(dim, int):
            raise TypeError(
                f"{name}: dim is one batch dim (an int), got {dim!r}; td.a{name}(dims) reduces several batch dims"
            )
        (d,) = batch_dims(name, dim, node._meta[1])
        kept = _kept(node._meta[1], (d,), keepdim)
        leaves, spec = flat(node)
        pairs = leafwise(name, node, torch_fn, leaves, itertools.repeat(d), itertools.repeat(keepdim))
        values = unflat(spec, [v for v, _ in pairs], kept)
        indices = unflat(spec, [i for _, i in pairs], kept)
        # torch's structseq holds any objects; its stub types the fields as tensors
        return structseq((values, indices))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = _EXTREME_DOC.format(
        name=name, what="maxima" if name == "max" else "minima", example_all=example[0], example_indices=example[1]
    )
    return tag_rule(fn)


max = _extreme("max", torch.max, amax, ("[4, 5]", "[1, 0]"))  # noqa: A001
min = _extreme("min", torch.min, amin, ("[1, 2]", "[0, 1]"))  # noqa: A001


@tag_rule
def norm(node: NodeT, p: float = 2.0) -> NodeT:
    """Each leaf's vector ``p``-norm over all of its elements (``td.norm()``), as tensordict's ``td.norm()``.

    A per-leaf measure (what gradient clipping reads), not a batch reduction: the batch dims
    and the feature dims of each leaf go into its one number. The reductions (``td.sum()``,
    ``td.amax()``, ...) reduce batch dims only.

    Args:
        node: the node (``self`` as a method).
        p: the order, as ``torch.linalg.vector_norm``'s ``ord`` (2, 1, ``float("inf")``, ...).

    Returns:
        A new node of the same keys holding 0-dim tensors of each leaf's dtype (the real dtype
        for a complex leaf), batch_size () at every level; tags dropped (new storage).

    Raises:
        TypeError: a leaf is neither floating point nor complex (the message names its key).

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"a": torch.full((3, 4), 2.0), "b": {"c": torch.ones(3)}}, batch_size=[3])
    >>> norms = td.norm()
    >>> norms["a"], norms["b", "c"], norms.batch_size
    (tensor(6.9282), tensor(1.7321), torch.Size([]))
    """
    leaves, spec = flat(node)
    for i, x in enumerate(leaves):
        if not (x.is_floating_point() or x.is_complex()):
            named = error("norm", walk_keys(node, True, True)[i], x, f"dtype {x.dtype}")
            if named is not None:
                raise named
            raise TypeError(
                f"norm: the leaf {walk_keys(node, True, True)[i]!r} has dtype {x.dtype}; a norm needs floating point or complex "
                "leaves (cast with td.float(), or td.exclude the key)"
            )
    try:
        out = foreach(torch._foreach_norm)(leaves, p) if leaves else leaves
    except Exception:
        fallback = retried("norm", node, torch.norm, leaves, itertools.repeat(p))
        if fallback is None:
            raise
        out = fallback
    return unflat_scalar(spec, out)


def _over_leaves(node: Node, torch_fn: Callable[..., torch.Tensor], empty: bool) -> torch.Tensor:
    """``torch_fn`` (``torch.all`` or ``torch.any``) over every element of every leaf, one 0-dim bool;
    ``empty`` for a node without leaves."""
    leaves, _ = flat(node)
    if not leaves:
        return torch.tensor(empty)
    return torch_fn(torch.stack(leafwise(torch_fn.__name__, node, torch_fn, leaves)))


def all(node: Node, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:  # noqa: A001
    """Whether every element is nonzero: over everything, or over batch dims ``dim`` (``td.all()``).

    Args:
        node: the node (``self`` as a method).
        dim: None for one answer over every element of every leaf; else a batch dim or a
            sequence of them, reduced leaf by leaf as :func:`sum` does.
        keepdim: with ``dim``, keep the reduced batch dims with size 1.

    Returns:
        Without ``dim``: one 0-dim bool tensor (True for a node without leaves), usable in
        ``if``. With ``dim``: a new node of bools with the reduced batch size; tags dropped.

    Raises:
        BatchDimError: a dim is out of range for the batch dims, or named twice.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.tensor([1, 0])}, batch_size=[2])
    >>> td.all(), (td >= 0).all()
    (tensor(False), tensor(True))
    """
    return _over_leaves(node, torch.all, True) if dim is None else _all(node, dim, keepdim)


def any(node: Node, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:  # noqa: A001
    """Whether some element is nonzero: over everything, or over batch dims ``dim`` (``td.any()``).

    Args:
        node: the node (``self`` as a method).
        dim: None for one answer over every element of every leaf; else a batch dim or a
            sequence of them, reduced leaf by leaf as :func:`sum` does.
        keepdim: with ``dim``, keep the reduced batch dims with size 1.

    Returns:
        Without ``dim``: one 0-dim bool tensor (False for a node without leaves), usable in
        ``if``. With ``dim``: a new node of bools with the reduced batch size; tags dropped.

    Raises:
        BatchDimError: a dim is out of range for the batch dims, or named twice.
    """
    return _over_leaves(node, torch.any, False) if dim is None else _any(node, dim, keepdim)
