"""``tdtree.func.grad`` and ``grad_and_value``: ``torch.func.grad`` for training loops over nodes.

``torch.func.grad(f)(params, batch)`` works on nodes as it is (they are torch pytrees), but it costs
a small model's training step twice over: torch walks every sub-node with its Python pytree on each
call (flatten, a ``TreeSpec`` per sub-node, unflatten to hand ``f`` its nodes, unflatten the
gradients), and functorch runs ``f`` on wrapped tensors and differentiates with ``create_graph=True``
so that gradients stay differentiable at the level outside. These wrappers flatten each
differentiated argument once (a node by a walk of its entries, any other tree with optree in the
``"tdtree"`` namespace) and rebuild nodes from the leaves. In plain eager code, when no argument
leaf requires grad and no transform is active, one forward and ``torch.autograd.grad`` give what
torch.func gives (with ``create_graph`` only when ``f`` reaches a tensor outside requiring grad);
otherwise, inside ``vmap``, another ``grad`` or ``torch.compile``, ``torch.func.grad_and_value``
runs over the tuple of leaves. Either way values and gradients are ``torch.func.grad``'s, bit for bit.

Tags follow ``torch.func``'s: ``f`` is handed nodes rebuilt from leaves, which are untagged (DESIGN
3.1), and the gradients are new tensors, untagged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import optree
import torch

from ._maps import flat_tree, unflat_tree
from ._pytree import NAMESPACE
from ._torch_private import transforms_active

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
    nodes and tensors) is flattened once, and ``func`` is called with it rebuilt around the leaves
    being differentiated; arguments not in ``argnums`` and keyword arguments are passed as they
    are. In eager code outside transforms, with no argument leaf requiring grad, the gradients come
    from one forward and ``torch.autograd.grad`` (functorch's wrapped tensors and its differentiable
    backward are much of a small model's step); otherwise from ``torch.func.grad_and_value`` over
    the leaves (see the module doc). ``None`` in a differentiated argument is an empty subtree, as in :mod:`tdtree.tree` (its
    gradient is ``None``; torch's pytree reads it as a leaf, and ``torch.func.grad`` refuses it).

    Returns:
        A function returning ``(grads, value)``, or ``(grads, (value, aux))`` with ``has_aux``:
        ``grads`` has the structure of the argument (a tuple of them when ``argnums`` is a tuple) and
        holds new tensors, so its nodes are untagged. Values and gradients equal
        ``torch.func.grad_and_value``'s over the same arguments, bit for bit, and are differentiable
        where torch's are (with respect to tensors outside ``func`` that require grad, or argument
        leaves that do); an ``aux`` tensor is detached unless ``func`` reaches such a tensor. As
        there, ``func`` gets untagged nodes (built from leaves).

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
        flats = [flat_tree(args[n]) for n in nums]
        specs = [spec for _, spec in flats]

        def flat_func(leaves: tuple[tuple[Any, ...], ...], *rest: Any) -> Any:
            full = list(rest)
            for n, spec, xs in zip(nums, specs, leaves):
                full.insert(n, unflat_tree(spec, xs))
            return func(*full, **kwargs)

        rest = [a for i, a in enumerate(args) if i not in nums]
        leaves = tuple(tuple(xs) for xs, _ in flats)
        if _plain_eager(leaves):
            grads, value = _by_autograd(flat_func, leaves, rest, has_aux)
        else:
            grads, value = torch.func.grad_and_value(flat_func, argnums=0, has_aux=has_aux)(leaves, *rest)
        out = tuple(unflat_tree(spec, gs) for spec, gs in zip(specs, grads))
        return (out[0] if isinstance(argnums, int) else out), value

    return wrapper


def _plain_eager(leaves: tuple[tuple[Any, ...], ...]) -> bool:
    """Whether torch.autograd can stand in for torch.func: eager, outside every transform and
    inference mode, and every leaf to differentiate a tensor that does not require grad (one that
    does would make torch.func's gradients differentiable with respect to it)."""
    if transforms_active() or torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
        return False
    return all(isinstance(x, torch.Tensor) and not x.requires_grad for xs in leaves for x in xs)


def _reaches_others(output: torch.Tensor, inputs: set[int]) -> bool:
    """Whether ``output``'s graph reaches a tensor requiring grad that is not one of ``inputs`` (ids)."""
    seen = set()
    stack = [output.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # an AccumulateGrad: a leaf of the graph
        if variable is not None and id(variable) not in inputs:
            return True
        stack.extend(f for f, _ in fn.next_functions)
    return False


def _check_output(output: Any, has_aux: bool) -> tuple[Any, Any]:
    """``(value, aux)`` of what the function returned, checked as torch.func.grad_and_value checks it."""
    aux = None
    if has_aux:
        if not (isinstance(output, tuple) and len(output) == 2):
            raise RuntimeError(
                "grad_and_value(f)(*args): output of function f should be a tuple: (output, aux) if has_aux is True"
            )
        output, aux = output
    if not isinstance(output, torch.Tensor):
        raise RuntimeError(f"grad_and_value(f)(*args): Expected f(*args) to return a Tensor, got {type(output)}")
    if output.dim() != 0:
        raise RuntimeError(
            "grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor with "
            f"{output.dim()} dims. Maybe you wanted to use the vjp or jacrev APIs instead?"
        )
    return output, aux


def _detached(tree: Any) -> Any:
    return optree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, tree, namespace=NAMESPACE)


def _by_autograd(
    flat_func: Callable[..., Any], leaves: tuple[tuple[torch.Tensor, ...], ...], rest: list[Any], has_aux: bool
) -> tuple[tuple[tuple[torch.Tensor, ...], ...], Any]:
    """torch.func.grad_and_value's result by one forward and torch.autograd.grad, without functorch's
    wrapped tensors. torch.func differentiates with ``create_graph=True`` so that its gradients stay
    differentiable at the level outside; here that is needed only when the function reaches a
    tensor requiring grad other than the inputs (a closure's parameter) and grad mode is on outside."""
    outside = torch.is_grad_enabled()
    inputs = tuple(tuple(x.detach().requires_grad_() for x in xs) for xs in leaves)
    flat = [x for xs in inputs for x in xs]
    with torch.enable_grad():
        output, aux = _check_output(flat_func(inputs, *rest), has_aux)
        keep = outside and output.requires_grad and _reaches_others(output, {id(x) for x in flat})
        if output.requires_grad:
            grads = torch.autograd.grad(output, flat, create_graph=keep, allow_unused=True, materialize_grads=True)
        else:  # nothing to differentiate: torch.func gives zeros
            grads = tuple(torch.zeros_like(x) for x in flat)
    if not keep:
        output, aux = output.detach(), _detached(aux)
    it = iter(grads)
    grouped = tuple(tuple(next(it) for _ in xs) for xs in leaves)
    return grouped, ((output, aux) if has_aux else output)


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
