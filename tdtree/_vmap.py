"""``tdtree.vmap``: ``torch.func.vmap`` over nodes, with batch sizes rewritten explicitly.

The arguments are read as a pytree whose leaves are *units*: nodes and
tensorclass instances (each mapped as a whole, at one of its batch dims),
tensors, and anything else (passed as it is). ``in_dims`` is a pytree prefix of
the positional arguments, as for ``torch.func.vmap``, giving each unit one dim
or None. ``torch.func.vmap`` sees only the mapped units' tensors; inside the
function each mapped node is rebuilt over them with the dim removed from
every batch size, unmapped units and keyword arguments are passed as they are,
and the outputs' nodes get the dim back at ``out_dims``. Metadata is never
guessed from leaf shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import optree
import torch

from ._base import Node
from ._maps import leaves, unflat
from ._pytree import NAMESPACE
from ._tags import decide
from ._tensorclass import RecordOps
from ._validate import dim_index

__all__ = ["vmap"]


def _is_unit(x: object) -> bool:
    return isinstance(x, (Node, RecordOps))


def _node_of(unit: Any) -> Node:
    return unit._td if isinstance(unit, RecordOps) else unit


def _where(what: str, path: tuple[Any, ...]) -> str:
    """``path`` as a reader writes it: ``argument 0['a'][1]``, ``output[0]``."""
    if what != "in_dims":
        return "output" + "".join(f"[{k!r}]" for k in path) if path else "the output"
    head, rest = f"argument {path[0]}", path[1:]
    return head + "".join(f"[{k!r}]" for k in rest)


def _kind(unit: object) -> str:
    if isinstance(unit, RecordOps):
        return f"a {type(unit).__name__} (tensorclass)"
    if isinstance(unit, Node):
        return "a node"
    if isinstance(unit, torch.Tensor):
        return "a tensor"
    return f"a {type(unit).__name__}"


def _units(what: str, dims: Any, tree: Any, path: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any, Any]]) -> None:
    """Append ``(path, unit, dim)`` for each unit of ``tree``, with ``dims`` a pytree prefix of it."""
    if dims is None or type(dims) is int:
        paths, units, _ = optree.tree_flatten_with_path(tree, is_leaf=_is_unit, namespace=NAMESPACE)
        out.extend(((*path, *p), u, dims) for p, u in zip(paths, units))
        return
    if _is_unit(tree) or optree.tree_is_leaf(tree, namespace=NAMESPACE):
        raise ValueError(
            f"tdtree.vmap: {what} gives {dims!r} for {_where(what, path)}, which is {_kind(tree)} and takes one "
            "dim (an int, or None for unmapped)"
        )
    children, _, entries, _ = optree.tree_flatten_one_level(tree, namespace=NAMESPACE)
    if optree.tree_is_leaf(dims, namespace=NAMESPACE):
        raise ValueError(f"tdtree.vmap: {what} holds {dims!r} for {_where(what, path)}; dims are ints or None")
    dim_children, _, dim_entries, _ = optree.tree_flatten_one_level(dims, namespace=NAMESPACE)
    if dim_entries != entries:
        raise ValueError(
            f"tdtree.vmap: {what} gives {dims!r} for {_where(what, path)}, {_kind(tree)} with entries "
            f"{list(entries)}; a container in {what} must have the same entries (or be one int or None for all)"
        )
    for entry, d, child in zip(entries, dim_children, children):
        _units(what, d, child, (*path, entry), out)


def _in_dim(path: tuple[Any, ...], unit: Any, dim: int) -> tuple[int, int]:
    """The mapped dim of ``unit`` as a non-negative index, and its size."""
    if _is_unit(unit):
        batch_size = _node_of(unit)._meta[1]
        n = len(batch_size)
        d = dim_index(dim, n)
        if d is None:
            raise ValueError(
                f"tdtree.vmap: in_dim {dim} for {_where('in_dims', path)}, {_kind(unit)} with batch_size "
                f"{tuple(batch_size)}, is not one of its batch dims"
                + ("; for nodes without batch dims (parameter ensembles) use torch.func.vmap" if n == 0 else "")
            )
        return d, batch_size[d]
    if isinstance(unit, torch.Tensor):
        d = dim_index(dim, unit.ndim)
        if d is None:
            raise ValueError(
                f"tdtree.vmap: in_dim {dim} for {_where('in_dims', path)} is out of range for a tensor of shape "
                f"{tuple(unit.shape)}"
            )
        return d, unit.shape[d]
    raise ValueError(
        f"tdtree.vmap: in_dim {dim} for {_where('in_dims', path)}, which is {_kind(unit)}: only nodes, "
        "tensorclasses and tensors can be mapped; give None for it in in_dims (or pass it as a keyword argument)"
    )


def _top(what: str, dims: Any, count: int) -> tuple[Any, ...]:
    """``dims`` with one entry per top-level value: one int or None for all, or a tuple of ``count``."""
    if dims is None or type(dims) is int:
        return (dims,) * count
    if type(dims) is not tuple:
        raise ValueError(
            f"tdtree.vmap: {what} must be an int, None or a tuple with one entry per "
            + ("positional argument" if what == "in_dims" else "output")
            + f", got {type(dims).__name__} {dims!r}"
        )
    if len(dims) != count:
        raise ValueError(
            f"tdtree.vmap: {what} has {len(dims)} entries for {count} "
            + ("positional arguments" if what == "in_dims" else "outputs")
        )
    return dims


def _unit_leaves(unit: Any) -> list[torch.Tensor]:
    return leaves(_node_of(unit)) if _is_unit(unit) else [unit]


def _refilled(unit: Any, values: Iterator[torch.Tensor], batch_size: torch.Size) -> Any:
    """``unit`` (a node or tensorclass) holding the next of ``values`` as its leaves, with root batch size
    ``batch_size``."""
    node = unflat(_node_of(unit), values, batch_size)
    return unit._wrap(node) if isinstance(unit, RecordOps) else node


def _removed(unit: Any, dim: int, it: Iterator[torch.Tensor]) -> Any:
    """The mapped ``unit`` as the function sees it: its next mapped leaves from ``it``, ``dim`` gone."""
    if not _is_unit(unit):
        return next(it)
    batch_size = _node_of(unit)._meta[1]
    inner = _refilled(unit, it, torch.Size((*batch_size[:dim], *batch_size[dim + 1 :])))
    # the rule, with the argument as the input: the batched leaves wrap the argument's own storages,
    # so a tagged argument reaches the function with its tags (a Locked one refuses edits there too)
    return decide(inner, (unit,))


def _inserted(where: Callable[[], str], unit: Any, dim: int, size: int, it: Iterator[torch.Tensor]) -> Any:
    """An output ``unit`` over its next results from ``it`` (mapped dim first), with the dim moved to ``dim``;
    ``where()`` names the output in errors."""
    if _is_unit(unit):
        batch_size = _node_of(unit)._meta[1]
        n = len(batch_size) + 1
        d = dim_index(dim, n)
        if d is None:
            raise ValueError(
                f"tdtree.vmap: out_dim {dim} for {where()}, {_kind(unit)} with batch_size "
                f"{tuple(batch_size)} inside the function, is out of range (-{n}..{n - 1})"
            )
        # torch.func.vmap returned the mapped dim first
        at = d
        values = it if at == 0 else map(lambda t: t.movedim(0, at), it)
        return _refilled(unit, values, torch.Size((*batch_size[:d], size, *batch_size[d:])))
    t = next(it)
    d = dim_index(dim, t.ndim)
    if d is None:
        raise ValueError(
            f"tdtree.vmap: out_dim {dim} for {where()} is out of range for a tensor of shape "
            f"{tuple(t.shape[1:])} inside the function"
        )
    return t if d == 0 else t.movedim(0, d)


def _out_where(out_spec: optree.PyTreeSpec | None, i: int) -> str:
    """Output ``i`` of the structure ``out_spec`` (None: the one output) as :func:`_where` writes it."""
    return _where("out_dims", () if out_spec is None else out_spec.paths()[i])


def _restored(out_dims: Any, out_spec: optree.PyTreeSpec | None, out_units: list[Any], size: int, flat_out: Any) -> Any:
    """The outputs, ``out_units`` in the structure ``out_spec`` (None: one unit), over the mapped results
    ``flat_out`` with the mapped dim placed by ``out_dims``."""
    it = iter(flat_out)
    if type(out_dims) is int:  # one dim for every output: placed output by output, without a walk for paths
        restored = [
            _inserted(functools.partial(_out_where, out_spec, i), u, out_dims, size, it)
            for i, u in enumerate(out_units)
        ]
    else:
        out = out_units[0] if out_spec is None else optree.tree_unflatten(out_spec, out_units)
        odims = out_dims
        if type(out_dims) is tuple and type(out) is not tuple and len(out_dims) == 1:
            odims = out_dims[0]  # one output, its dim given as a 1-tuple
        elif type(out) is tuple:
            odims = _top("out_dims", out_dims, len(out))
        placed: list[tuple[tuple[Any, ...], Any, Any]] = []
        _units("out_dims", odims, out, (), placed)
        restored = []
        for path, unit, dim in placed:
            if dim is None:
                raise ValueError(f"tdtree.vmap: out_dims gives None for {_where('out_dims', path)}; out_dims are ints")
            restored.append(_inserted(functools.partial(_where, "out_dims", path), unit, dim, size, it))
    return restored[0] if out_spec is None else optree.tree_unflatten(out_spec, restored)


def vmap(
    func: Callable[..., Any],
    in_dims: Any = 0,
    out_dims: Any = 0,
    *,
    randomness: str = "error",
    chunk_size: int | None = None,
) -> Callable[..., Any]:
    """Map ``func`` over a batch dim of the nodes, tensorclasses and tensors in its positional arguments.

    Args:
        func: a function of nodes, tensorclasses, tensors and containers of
            them (dicts, lists, tuples, named tuples), returning the same kinds.
        in_dims: a pytree prefix of the positional arguments, as for
            ``torch.func.vmap``: one int or None for all, or a tuple with one
            entry per positional argument, each an int, None, or a container
            matching the argument (``({"a": 0, "b": None},)`` for a dict). A
            node or tensorclass takes one dim, one of its batch dims (negative
            counts from the end of the batch dims); a tensor any of its dims;
            None leaves it unmapped.
        out_dims: the same for the outputs (ints only): where the mapped dim
            goes, for a node or tensorclass a position among its batch dims.
        randomness, chunk_size: as for ``torch.func.vmap``.

    Keyword arguments of the mapped function are passed to ``func`` unmapped,
    as ``torch.func.vmap`` passes them.

    Returns:
        The mapped function. Inside ``func`` nodes and tensorclasses have lost
        the mapped dim from their batch sizes; those in the outputs have it
        back. Tags follow the rule, with the arguments as inputs: an output
        viewing its input's storage keeps the input's tags (``lambda q: q``),
        new tensors (``lambda q: q * 2``) drop them.

    Raises:
        ValueError: ``in_dims`` or ``out_dims`` does not fit the arguments or
            outputs (the message names the argument or output), or the mapped
            dims differ in size.
        TypeError: ``func`` returned something other than nodes,
            tensorclasses, tensors, None and containers of them.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.ones(5, 3)}, batch_size=[5])
    >>> out = tt.vmap(lambda q: q.sum())(td)  # inside, q has batch_size (); the sum is over nothing
    >>> out.batch_size, out["x"].shape
    (torch.Size([5]), torch.Size([5, 3]))
    """

    @functools.wraps(func)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        units: list[tuple[tuple[Any, ...], Any, Any]] = []
        nested = False  # whether an argument holds units inside a container (rebuilt inside by its structure)
        for i, (dims, arg) in enumerate(zip(_top("in_dims", in_dims, len(args)), args)):
            if (dims is None or type(dims) is int) and (_is_unit(arg) or isinstance(arg, torch.Tensor)):
                units.append(((i,), arg, dims))  # an argument that is one unit: no walk
            else:
                nested = True
                _units("in_dims", dims, arg, (i,), units)
        flat: list[torch.Tensor] = []
        flat_dims: list[int] = []
        mapped_units: list[tuple[int, Any, int]] = []  # (position in units, unit, non-negative dim)
        size: int | None = None
        first: tuple[Any, ...] = ()
        for pos, (path, unit, dim) in enumerate(units):
            if dim is None:
                continue
            d, n = _in_dim(path, unit, dim)
            if size is None:
                size, first = n, path
            elif n != size:
                raise ValueError(
                    f"tdtree.vmap: the mapped dims differ in size: {_where('in_dims', first)} has {size}, "
                    f"{_where('in_dims', path)} has {n} (at in_dim {dim})"
                )
            mapped_units.append((pos, unit, d))
            unit_leaves = _unit_leaves(unit)
            flat.extend(unit_leaves)
            flat_dims.extend([d] * len(unit_leaves))
        if size is None:
            raise ValueError(
                f"tdtree.vmap: in_dims {in_dims!r} maps no node, tensorclass or tensor of the positional arguments"
            )
        if not flat:
            raise ValueError("tdtree.vmap: the mapped arguments hold no tensors, so there is nothing to map over")
        # optree's stub types a tree as PyTree[T], a union optree builds at runtime, which mypy reads as
        # a class that no actual tree (a tuple of arguments) is an instance of
        args_spec = optree.tree_structure(args, is_leaf=_is_unit, namespace=NAMESPACE) if nested else None  # type: ignore[arg-type]
        outputs: list[tuple[optree.PyTreeSpec | None, list[Any]]] = []

        def inner(inner_leaves: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
            given = [unit for _, unit, _ in units]
            it = iter(inner_leaves)
            for pos, unit, d in mapped_units:
                given[pos] = _removed(unit, d, it)
            out = func(*(given if args_spec is None else optree.tree_unflatten(args_spec, given)), **kwargs)
            out_spec: optree.PyTreeSpec | None = None  # None: the output is one unit
            if _is_unit(out) or isinstance(out, torch.Tensor):
                out_units = [out]
            else:
                out_units, out_spec = optree.tree_flatten(out, is_leaf=_is_unit, namespace=NAMESPACE)
            result: list[torch.Tensor] = []
            for i, unit in enumerate(out_units):
                if _is_unit(unit):
                    result.extend(leaves(_node_of(unit)))
                elif isinstance(unit, torch.Tensor):
                    result.append(unit)
                else:
                    path = () if out_spec is None else out_spec.paths()[i]
                    raise TypeError(
                        f"tdtree.vmap: the function returned {_kind(unit)} at {_where('out_dims', path)}; outputs "
                        "are nodes, tensorclasses, tensors, None and containers of them"
                    )
            outputs.append((out_spec, out_units))
            return tuple(result)

        # the leaves go as one list argument, and one dim for all of them as one int: torch.func.vmap's
        # work per argument (and that of libraries patching it, such as tensordict) is then done once
        leaf_dims = flat_dims[0] if flat_dims.count(flat_dims[0]) == len(flat_dims) else flat_dims
        flat_out = torch.func.vmap(
            inner, in_dims=(leaf_dims,), out_dims=0, randomness=randomness, chunk_size=chunk_size
        )(flat)
        out_spec, out_units = outputs[-1]
        result = _restored(out_dims, out_spec, out_units, size, flat_out)
        # the rule in the body, with the arguments' units (every node they hold) as the inputs: tdtree.vmap
        # may be called inside a compiled function, where the wrapper tag_rule writes cannot be made
        return decide(result, (*(unit for _, unit, _ in units), *kwargs.values()))

    return mapped
