"""Optimiser state records, and how they load with ``torch.load(weights_only=True)``.

:class:`AdamState` is ``tdtree.optim``'s state; it is defined here, below the
lazily imported ``tdtree.optim``, so that ``import tdtree`` alone registers its
rebuild function with torch's safe globals: a checkpoint holding an
``AdamState`` loads with ``weights_only=True`` in a process that never imported
``tdtree.optim``. An ``AdamState`` pickles as :func:`rebuild_adam_state` and its
three fields (tensors, or trees of them that torch's unpickler rebuilds by its
own rules), so that function, not the class, is what torch is told to trust.
SGD's state is a tree like the parameters (or None): it needs nothing here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .errors import SerializationError

__all__ = ["AdamState", "rebuild_adam_state"]


class AdamState(NamedTuple):
    """Adam's state: the step count (a 0-dim float tensor, so a compiled step
    does not recompile as it grows) and the two moment trees."""

    step: torch.Tensor
    exp_avg: Any
    exp_avg_sq: Any

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return rebuild_adam_state, (self.step, self.exp_avg, self.exp_avg_sq)


def rebuild_adam_state(step: Any, exp_avg: Any, exp_avg_sq: Any) -> AdamState:
    """The :class:`AdamState` of these fields (unpickling).

    It is on torch's safe-globals list, so a hand-made pickle can call it with
    anything: ``step`` must be a 0-dim floating-point plain tensor, else it
    raises SerializationError. The moments are whatever the unpickler built
    for them (under ``weights_only``, only tensors, nodes and plain containers);
    a step over moments of the wrong structure raises where it reads them.
    """
    if type(step) is not torch.Tensor or step.dim() != 0 or not step.dtype.is_floating_point:
        found = (
            f"{step.dtype} tensor of shape {tuple(step.shape)}"
            if isinstance(step, torch.Tensor)
            else type(step).__name__
        )
        raise SerializationError(
            f"cannot unpickle an AdamState: its step should be a 0-dim float tensor, found {found}"
        )
    return AdamState(step, exp_avg, exp_avg_sq)


torch.serialization.add_safe_globals([rebuild_adam_state])
