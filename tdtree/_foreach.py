"""``torch._foreach_*`` kernels, or the same op leaf by leaf inside a ``torch.func`` transform.

A foreach kernel runs one op over whole lists of leaves and is faster than a
Python loop over them, but it has no batching rule: inside ``vmap`` it raises
"Batching rule not implemented for aten::_foreach_...". Every foreach call in
tdtree asks :func:`foreach` what to run, ``foreach(kernel)(*args)``: the
kernel itself outside a transform, so the eager path pays one call and one
C query, and inside a transform (a test folded to a constant under
``torch.compile``) a runner doing the same op leaf by leaf, so the user never
meets the difference.

The per-leaf op of ``torch._foreach_NAME`` is ``torch.NAME``; of an in-place
``torch._foreach_NAME_`` it is the method ``Tensor.NAME_``. Each list
argument is paired leaf by leaf; any other argument (a number, a tensor) is
passed to every leaf, as the kernels read it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from ._torch_private import transforms_active

__all__ = ["foreach"]

_PREFIX = "_foreach_"

Runner = Callable[..., Any]


def _runner(op: Callable[..., Any], in_place: bool) -> Runner:
    def run(*args: Any, **kwargs: Any) -> list[Any]:
        columns = [a if type(a) is list or type(a) is tuple else itertools.repeat(a) for a in args]
        out = [op(*row, **kwargs) for row in zip(*columns)]
        return args[0] if in_place else out  # an in-place kernel returns the list it wrote

    return run


def _runners() -> dict[Callable[..., Any], tuple[Runner, Runner | None]]:
    """For each foreach kernel: its per-leaf runner, and for an in-place kernel the runner for ``fresh`` lists.

    Built once from the kernels' names: a table, because under ``torch.compile``
    dynamo looks a kernel up in a dict but cannot read its ``__name__``.
    """
    table = {}
    for name in dir(torch):
        if not name.startswith(_PREFIX):
            continue
        op = name[len(_PREFIX) :]
        in_place = op.endswith("_")
        leaf = getattr(torch.Tensor if in_place else torch, op, None)
        if leaf is None:
            continue
        out_of_place = getattr(torch, op[:-1], None) if in_place else None
        fresh = _runner(out_of_place, False) if out_of_place is not None else None
        table[getattr(torch, name)] = (_runner(leaf, in_place), fresh)
    return table


_RUNNERS = _runners()


def foreach(kernel: Callable[..., Any], fresh: bool = False) -> Runner:
    """What runs ``kernel``, a ``torch._foreach_*`` kernel, here: call it as the kernel.

    Outside a ``torch.func`` transform it is ``kernel`` itself; inside one, the
    same op leaf by leaf (see the module docstring), returning what the kernel
    returns: a list of new tensors, or for an in-place kernel its first list,
    whose tensors it wrote. With ``fresh``, meant for an in-place kernel over
    a list the caller made itself and rebinds to the result (an optimiser's
    intermediates: ``vs = foreach(k, fresh=True)(vs, ...)``), a transform
    returns new tensors instead of writing: writing a batched value into an
    unbatched tensor is refused by ``vmap`` (per-sample gradients into a state
    shared by the samples), computing a new one is not. Lists must not be
    empty, as for the kernels.
    """
    if transforms_active():
        plain, for_fresh = _RUNNERS[kernel]
        return for_fresh if fresh and for_fresh is not None else plain
    return kernel
