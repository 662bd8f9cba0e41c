"""Pure optimisers over parameter nodes: ``sgd`` and ``adam``.

Each step takes the parameters, the gradients (a tree of the same structure,
as ``torch.func.grad`` returns it) and the optimiser state, and returns new
parameters and a new state; nothing is written in place. The arithmetic runs
as ``torch._foreach_*`` over the flat leaf lists followed by one unflatten
(measured 0.77x the time of a per-leaf ``tree.map`` on a 3-layer MLP), and it
compiles with ``torch.compile(fullgraph=True)``. Inside a ``torch.func``
transform the same arithmetic runs leaf by leaf (``tdtree._foreach.foreach``),
so a step runs inside ``vmap``: an ensemble trains with one step per member,
and a step inside a vmap over samples may take unmapped parameters and state
with mapped gradients. Like ``torch.optim``, a step
is not recorded by autograd: the new parameters do not require grad.

The steps match ``torch.optim.SGD`` (momentum, no dampening or Nesterov) and
``torch.optim.Adam`` (no weight decay, no amsgrad) step for step.

States save and load as parameters do: SGD's momentum is a tree like the
parameters; an :class:`AdamState` loads with ``torch.load(weights_only=True)``
once ``tdtree`` is imported (it is defined in ``tdtree._optstate``, which
``import tdtree`` loads, and pickles as a function on torch's safe-globals list).
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import Node
from ._foreach import foreach
from ._maps import flat, unflat
from ._maps import leaves as node_leaves
from ._optstate import AdamState
from ._pytree import NAMESPACE
from ._tags import tag_rule
from .tree import flatten, leaves, unflatten
from .tree import map as tree_map

__all__ = ["AdamState", "adam", "adam_init", "sgd"]


# A node's leaves and structure come from a walk of its ``_data`` (``_maps``): optree calls back into
# Python for every node of a tree; any other tree goes through optree.


def _flatten(tree: Any) -> tuple[list[Any], Any]:
    return flat(tree) if isinstance(tree, Node) else flatten(tree)


def _unflatten(spec: Any, values: list[Any]) -> Any:
    return unflat(spec, values) if isinstance(spec, Node) else unflatten(spec, values)


def _leaves_like(ps: list[Any], tree: Any, what: str) -> list[Any]:
    out = node_leaves(tree) if isinstance(tree, Node) else leaves(tree)
    if len(out) != len(ps):
        raise ValueError(
            f"{what} has {len(out)} leaves for {len(ps)} parameters; it must have the parameters' structure "
            f"(namespace {NAMESPACE!r})"
        )
    return out


@tag_rule
def _sgd(params: Any, grads: Any, buf: Any, lr: float, momentum: float) -> tuple[Any, Any]:
    ps, spec = _flatten(params)
    gs = _leaves_like(ps, grads, "grads")
    if not ps:  # torch._foreach_* refuse empty lists
        return _unflatten(spec, []), None if momentum == 0.0 else _unflatten(spec, [])
    if momentum == 0.0:
        return _unflatten(spec, foreach(torch._foreach_add)(ps, gs, alpha=-lr)), None
    bs: Any
    if buf is None:
        # a copy, as torch.optim.SGD's first buffer is: the state must not be the caller's gradients
        # (a later in-place write to them would change it, and inside grad they are still recorded)
        bs = [g.clone() for g in gs]
    else:
        bs = foreach(torch._foreach_mul)(_leaves_like(ps, buf, "momentum_state"), momentum)
        bs = foreach(torch._foreach_add_, fresh=True)(bs, gs)
    return _unflatten(spec, foreach(torch._foreach_add)(ps, bs, alpha=-lr)), _unflatten(spec, bs)


@torch.no_grad()
def sgd(params: Any, grads: Any, lr: float, momentum: float = 0.0, momentum_state: Any = None) -> tuple[Any, Any]:
    """One step of SGD: ``(new_params, new_momentum_state)``.

    Args:
        params: a node (or any tree of tensors in the ``"tdtree"`` namespace).
        grads: the gradients, with the structure of ``params``.
        lr: the learning rate.
        momentum: the momentum factor; ``0.0`` is plain SGD and the state
            returned is None.
        momentum_state: the state the previous step returned; None on the
            first step (the buffer starts as the gradient, as in torch).

    Returns:
        New parameters and the new momentum buffers (a tree like ``params``,
        or None without momentum). Results hold new tensors, so tags are
        dropped (the rule).

    Raises:
        ValueError: ``grads`` or ``momentum_state`` has another number of leaves than ``params``.

    >>> import torch, tdtree
    >>> p = tdtree.TensorDict({"w": torch.ones(2)})
    >>> sgd(p, p, lr=0.5)[0]["w"]
    tensor([0.5000, 0.5000])
    """
    return _sgd(params, grads, momentum_state, lr, momentum)


@tag_rule
def _zeros(params: Any) -> Any:
    return tree_map(torch.zeros_like, params)


def adam_init(params: Any) -> AdamState:
    """Adam's first state for ``params``: step 0 (on the parameters' device) and zero moments.

    Args:
        params: a node (or any tree of tensors in the ``"tdtree"`` namespace).

    Returns:
        An :class:`AdamState`: ``step`` a 0-dim float32 tensor 0, and two trees of zeros like
        ``params``. The moments are new tensors, so they carry no tags.
    """
    first = leaves(params)
    device = first[0].device if first else None
    return AdamState(torch.zeros((), dtype=torch.float32, device=device), _zeros(params), _zeros(params))


@tag_rule
def _adam(
    params: Any,
    grads: Any,
    exp_avg: Any,
    exp_avg_sq: Any,
    step: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> tuple[Any, Any, Any]:
    ps, spec = _flatten(params)
    gs = _leaves_like(ps, grads, "grads")
    if not ps:  # torch._foreach_* refuse empty lists
        return _unflatten(spec, []), _unflatten(spec, []), _unflatten(spec, [])
    ms = foreach(torch._foreach_lerp)(_leaves_like(ps, exp_avg, "exp_avg"), gs, 1 - beta1)
    vs = foreach(torch._foreach_mul)(_leaves_like(ps, exp_avg_sq, "exp_avg_sq"), beta2)
    vs = foreach(torch._foreach_addcmul_, fresh=True)(vs, gs, gs, value=1 - beta2)
    # torch.optim.Adam's order of operations, with the bias corrections kept
    # as tensors of the step so that nothing leaves the graph.
    step_size = lr / (1 - beta1**step)
    denom = foreach(torch._foreach_sqrt)(vs)
    denom = foreach(torch._foreach_div_, fresh=True)(denom, (1 - beta2**step).sqrt())
    denom = foreach(torch._foreach_add_, fresh=True)(denom, eps)
    update = foreach(torch._foreach_div)(ms, denom)
    update = foreach(torch._foreach_mul_, fresh=True)(update, step_size)
    return _unflatten(spec, foreach(torch._foreach_sub)(ps, update)), _unflatten(spec, ms), _unflatten(spec, vs)


@torch.no_grad()
def adam(
    params: Any,
    grads: Any,
    state: AdamState,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> tuple[Any, AdamState]:
    """One step of Adam: ``(new_params, new_state)``.

    Args:
        params: a node (or any tree of tensors in the ``"tdtree"`` namespace).
        grads: the gradients, with the structure of ``params``.
        state: :func:`adam_init` ``(params)`` on the first step, then the state
            the previous step returned.
        lr, betas, eps: as in ``torch.optim.Adam``.

    Returns:
        New parameters and the new :class:`AdamState`. Results hold new
        tensors, so tags are dropped (the rule).

    Raises:
        ValueError: ``grads`` or a moment tree has another number of leaves than ``params``.

    >>> import torch, tdtree
    >>> p = tdtree.TensorDict({"w": torch.ones(2)})
    >>> new, state = adam(p, p, adam_init(p), lr=0.1)
    >>> new["w"], state.step
    (tensor([0.9000, 0.9000]), tensor(1.))
    """
    step = state.step + 1
    new, exp_avg, exp_avg_sq = _adam(params, grads, state.exp_avg, state.exp_avg_sq, step, lr, betas[0], betas[1], eps)
    return new, AdamState(step, exp_avg, exp_avg_sq)
