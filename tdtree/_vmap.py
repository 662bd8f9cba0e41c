"""``tdtree.vmap``: ``torch.func.vmap`` over nodes, with batch sizes rewritten explicitly.

``torch.func.vmap`` sees only tensors here: nodes are flattened by optree, their
leaves mapped at the node's batch dim, and inside the function the nodes are
rebuilt with that dim removed from every batch size; node outputs get it back
at ``out_dims``. Metadata is never guessed from leaf shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import optree
import torch

from ._base import Node
from ._maps import rebuild
from ._pytree import NAMESPACE

__all__ = ["vmap"]


def _is_node(x: object) -> bool:
    return isinstance(x, Node)


def _batch_dim(node: Node, dim: int) -> int:
    n = len(node._meta[1])
    if not -n <= dim < n:
        raise ValueError(
            f"tdtree.vmap: in_dim {dim} is not a batch dim of a node with batch_size {tuple(node._meta[1])}"
            + ("; for nodes without batch dims (parameter ensembles) use torch.func.vmap" if n == 0 else "")
        )
    return dim % n


def _drop(node: Node, dim: int) -> Node:
    batch_size = node._meta[1]
    return rebuild(node, lambda x: x, torch.Size((*batch_size[:dim], *batch_size[dim + 1 :])))


def _per_arg(dims: Any, count: int, what: str) -> tuple[Any, ...]:
    if isinstance(dims, tuple):
        if len(dims) != count:
            raise ValueError(f"tdtree.vmap: {what} has {len(dims)} entries for {count} values")
        return dims
    return (dims,) * count


def vmap(
    func: Callable[..., Any],
    in_dims: int | None | tuple[int | None, ...] = 0,
    out_dims: int | tuple[int, ...] = 0,
    *,
    randomness: str = "error",
    chunk_size: int | None = None,
) -> Callable[..., Any]:
    """Map ``func`` over a batch dim of its node and tensor arguments.

    Args:
        func: a function of nodes and tensors returning nodes and tensors.
        in_dims: per positional argument (or one for all), the dim to map; for
            a node it is one of its batch dims (negative counts from the end of
            the batch dims), None leaves the argument unmapped.
        out_dims: per top-level output (or one for all), where the mapped dim goes;
            for a node output, a position among its batch dims.

    Returns:
        The mapped function. Inside ``func`` nodes have lost the mapped dim from
        their batch sizes; node outputs have it back. Tags follow the leaves:
        results are new tensors, so they carry no tags.
    """

    @functools.wraps(func)
    def mapped(*args: Any) -> Any:
        dims = _per_arg(in_dims, len(args), "in_dims")
        # optree's stub is wrong here: it types a tree as PyTree[T], a union optree builds at runtime,
        # which mypy reads as a class that no actual tree (tuple, node) is an instance of
        leaves: list[Any]
        leaves, spec = optree.tree_flatten(args, namespace=NAMESPACE)  # type: ignore[arg-type]
        leaf_dims: list[int | None] = []
        size: int | None = None
        # one flatten of all the arguments: each argument's leaf count comes from its part of the spec
        for arg, dim, arg_spec in zip(args, dims, spec.children()):
            if dim is not None and isinstance(arg, Node):
                dim = _batch_dim(arg, dim)
                size = arg._meta[1][dim] if size is None else size
            elif dim is not None and isinstance(arg, torch.Tensor):
                size = arg.shape[dim] if size is None else size
            leaf_dims.extend([dim] * arg_spec.num_leaves)
        out_spec: list[optree.PyTreeSpec] = []

        def inner(*inner_leaves: Any) -> tuple[Any, ...]:
            given = optree.tree_unflatten(spec, inner_leaves)
            inner_args = tuple(
                _drop(a, _batch_dim(a, d)) if d is not None and isinstance(a, Node) else a
                for a, d in zip(given, dims)
            )
            out_leaves, tree = optree.tree_flatten(func(*inner_args), namespace=NAMESPACE)
            out_spec.append(tree)
            return tuple(out_leaves)

        flat_out = torch.func.vmap(
            inner, in_dims=tuple(leaf_dims), out_dims=0, randomness=randomness, chunk_size=chunk_size
        )(*leaves)
        out: Any = optree.tree_unflatten(out_spec[-1], flat_out)  # what func returned
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        odims = _per_arg(out_dims, len(outs), "out_dims")
        fixed = tuple(_restore(o, d, size) for o, d in zip(outs, odims))
        return fixed[0] if single else type(out)(fixed)

    return mapped


def _restore(out: Any, dim: int, size: int | None) -> Any:
    def one(x: Any) -> Any:
        if isinstance(x, Node):
            batch_size = x._meta[1]
            n = len(batch_size) + 1
            if not -n <= dim < n:
                raise ValueError(f"tdtree.vmap: out_dim {dim} is out of range for batch_size {tuple(batch_size)}")
            d = dim % n
            if size is None:
                raise TypeError(
                    "tdtree.vmap: a node output needs the mapped size, which is read from a mapped node or "
                    "tensor argument; the mapped arguments here are other containers (pass nodes or tensors)"
                )
            return rebuild(x, lambda t: t.movedim(0, d), torch.Size((*batch_size[:d], size, *batch_size[d:])))
        return x.movedim(0, dim) if isinstance(x, torch.Tensor) else x

    return optree.tree_map(one, out, is_leaf=_is_node, namespace=NAMESPACE)
