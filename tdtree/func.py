"""``tdtree.func.grad`` and ``grad_and_value``: ``torch.func.grad`` over nodes, flattened once.

``torch.func.grad(f)(params, batch)`` works on nodes as it is (they are torch pytrees), but torch
walks a node with its Python pytree: for each call it flattens the differentiated arguments, builds a
``TreeSpec`` per sub-node, unflattens them to hand ``f`` its wrapped nodes and unflattens the
gradients again. For the small models of a training loop that walk is a large part of a step.
These wrappers flatten each differentiated argument once with optree (namespace ``"tdtree"``), hand
``torch.func`` a tuple of leaves, rebuild the nodes around the wrapped leaves for ``f``, and rebuild
the gradients from the leaves it returns. The computation is the same, so values and gradients are
those of ``torch.func.grad`` over the node, bit for bit.

Tags follow ``torch.func``'s: ``f`` is handed nodes rebuilt from leaves, which are untagged (DESIGN
3.1), and the gradients are new tensors, untagged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import optree
import torch

from ._pytree import NAMESPACE

__all__ = ["grad", "grad_and_value"]


def _argnums(argnums: int | tuple[int, ...], nargs: int) -> tuple[int, ...]:
    """``argnums`` as a tuple of non-negative positions, checked as ``torch.func.grad`` checks them."""
    nums = (argnums,) if isinstance(argnums, int) else argnums
    if not isinstance(nums, tuple) or not nums or not all(isinstance(n, int) for n in nums):
        raise RuntimeError(f"argnums must be an int or a non-empty tuple of ints, got {argnums!r}")
    out = []
    for n in nums:
        if not -nargs <= n < nargs:
            raise RuntimeError(f"Got argnum={n}, but only {nargs} positional inputs")
        out.append(n % nargs)
    if len(set(out)) != len(out):
        raise RuntimeError(f"argnums {argnums!r} name one argument twice")
    return tuple(out)


def grad_and_value(
    func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``torch.func.grad_and_value`` for functions of nodes: ``(gradients, value)``, as torch returns them.

    Each argument at ``argnums`` (any tree in the ``"tdtree"`` namespace: a node, a dict or tuple of
    nodes and tensors) is flattened once with optree; ``torch.func.grad_and_value`` differentiates
    with respect to the tuple of its leaves, and ``func`` is called with the argument rebuilt around
    them. Arguments not in ``argnums`` and keyword arguments are passed as they are. ``None`` in a
    differentiated argument is an empty subtree, as in :mod:`tdtree.tree` (its gradient is ``None``;
    torch's pytree reads it as a leaf, and ``torch.func.grad`` refuses it).

    Returns:
        A function returning ``(grads, value)``, or ``(grads, (value, aux))`` with ``has_aux``:
        ``grads`` has the structure of the argument (a tuple of them when ``argnums`` is a tuple) and
        holds new tensors, so its nodes are untagged; ``value`` and ``aux`` are what ``func``
        returned, detached. Values and gradients equal ``torch.func.grad_and_value``'s over the same
        arguments, bit for bit. As there, ``func`` gets untagged nodes (built from leaves).

    Raises:
        RuntimeError: ``argnums`` names no positional argument, or one twice; and whatever
            ``torch.func.grad_and_value`` raises (a non-tensor leaf to differentiate, a value that is
            not a scalar tensor).

    >>> import torch, tdtree
    >>> p = tdtree.TensorDict({"w": torch.ones(2), "sub": {"b": torch.zeros(())}})
    >>> g, v = tdtree.func.grad_and_value(lambda p, x: (p["w"] * x).sum() + p["sub", "b"])(p, torch.arange(2.0))
    >>> g["w"], g["sub", "b"], v
    (tensor([0., 1.]), tensor(1.), tensor(1.))
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums(argnums, len(args))
        flats = [optree.tree_flatten(args[n], namespace=NAMESPACE) for n in nums]
        specs = [spec for _, spec in flats]

        def flat_func(leaves: tuple[tuple[Any, ...], ...], *rest: Any) -> Any:
            full = list(rest)
            for n, spec, xs in zip(nums, specs, leaves):
                full.insert(n, optree.tree_unflatten(spec, xs))
            return func(*full, **kwargs)

        rest = [a for i, a in enumerate(args) if i not in nums]
        leaves = tuple(tuple(xs) for xs, _ in flats)
        grads, value = torch.func.grad_and_value(flat_func, argnums=0, has_aux=has_aux)(leaves, *rest)
        out = tuple(optree.tree_unflatten(spec, gs) for spec, gs in zip(specs, grads))
        return (out[0] if isinstance(argnums, int) else out), value

    return wrapper


def grad(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable[..., Any]:
    """``torch.func.grad`` for functions of nodes: :func:`grad_and_value` without the value.

    Returns:
        A function returning the gradients (``(grads, aux)`` with ``has_aux``), with the structure of
        the arguments at ``argnums``; new tensors, so untagged. Equal to ``torch.func.grad``'s, bit for bit.

    >>> import torch, tdtree
    >>> p = tdtree.TensorDict({"w": torch.ones(2)})
    >>> tdtree.func.grad(lambda p: (p["w"] ** 2).sum())(p)["w"]
    tensor([2., 2.])
    """
    both = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        grads, value = both(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return wrapper
