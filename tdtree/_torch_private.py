"""The names from torch's private internals that tdtree needs, in one place.

torch has no public way to ask these questions, so each is read from a private
name here and nowhere else; ``tests/test_torch_private.py`` fails loudly when a
torch release moves one of them. Checked against torch 2.13.0 (the version the
Makefile pins).

* Whether a ``torch.func`` transform is running: ``torch._foreach_*`` kernels
  have no batching rule, so the leaf-wise maps run per-leaf ops inside a
  transform (one test, made once per operation in the map layer).
* The tensor a functorch wrapper (a batched or grad-tracking tensor, at any
  nesting level) wraps: its storage is the wrapper's storage identity, so the
  tag rule and the alias check work inside transforms as they do in eager.
* A storage's identity: ``id()`` of its Python object, which torch keeps one of
  per storage for as long as the storage lives (as it does for tensors), so that
  views share it; defined for the fake tensors dynamo traces with too, where
  ``data_ptr()`` is not. torch does not document this, so the test checks it.
* ``nonstrict_trace``: how the tag rule runs its storage test, as plain Python
  on fake tensors, under ``torch.compile`` without a graph break.
* Whether a storage holds bytes when its size is data-dependent (``td[mask]``
  under ``torch.compile``): ``guard_or_true`` answers without guarding on a
  size the trace cannot know, and the answer is "it may", so the rule fails safe.
* torch's pytree registry (``torch.utils._pytree``): how ``torch.func``, ``torch.compile`` and
  ``torch.export`` see nodes and tensorclasses as trees; it has no public spelling.
* ``nn.Module``'s ``_parameters`` / ``_buffers`` / ``_modules`` dicts, read and written (for the
  call) by ``tdtree.nn`` (``from_module``, ``functional_call``) as ``torch.func.functional_call``
  itself does; they are attributes of every module, so they are not re-exported here, and the test
  checks a module's call reads what is put in them.
* For ``tdtree.control``: ``scan``, ``associative_scan`` and ``map``, which torch offers only under
  ``torch._higher_order_ops`` (``cond`` and ``while_loop`` are public).
* For ``tdtree.testing``'s compile law: a backend that counts the frames it
  compiles, and dynamo's count of graph breaks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.utils._pytree as torch_pytree
from torch._C import _functorch
from torch._higher_order_ops import associative_scan as associative_scan
from torch._higher_order_ops import map as hop_map
from torch._higher_order_ops import scan as scan
from torch.fx.experimental.symbolic_shapes import guard_or_true

__all__ = [
    "transforms_active",
    "unwrapped",
    "storages",
    "storage_ids",
    "storage_id",
    "holds_data",
    "nonstrict_trace",
    "compile_counter",
    "graph_breaks",
    "torch_pytree",
    "scan",
    "associative_scan",
    "hop_map",
]

# One C call: dynamo folds it to a constant while tracing (it is on its list of such calls), so a
# compiled function takes the branch its transforms take, with no guard and no graph break.
transforms_active: Callable[[], bool] = torch._C._are_functorch_transforms_active

_is_wrapped = _functorch.is_functorch_wrapped_tensor
_get_unwrapped = _functorch.get_unwrapped


def unwrapped(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor under every functorch wrapper of ``tensor`` (``tensor`` itself when unwrapped)."""
    while _is_wrapped(tensor):
        tensor = _get_unwrapped(tensor)
    return tensor


_storage = torch.Tensor.untyped_storage

# The identity of a storage: its Python object, shared exactly by tensors viewing the same memory
# (a builtin, so that mapping it over many storages runs at C speed).
storage_id: Callable[[torch.UntypedStorage], int] = id


def storage_ids(tensors: Iterable[torch.Tensor]) -> Iterator[int]:
    """The storage identity of each of ``tensors``, seen through functorch wrappers.

    Asking a wrapper for its storage raises, so inside a transform each tensor
    is unwrapped first; outside one (the eager common path) the tensors are
    mapped at C speed, with no Python frame per tensor.
    """
    return map(storage_id, storages(tensors))


def storages(tensors: Iterable[torch.Tensor]) -> Iterator[torch.UntypedStorage]:
    """The untyped storage of each of ``tensors``, seen through functorch wrappers."""
    if transforms_active():
        tensors = map(unwrapped, tensors)
    return map(_storage, tensors)


def holds_data(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` holds any bytes; True when its size is known only at run time.

    In eager, and for sizes a compiled trace knows, this is ``nbytes() != 0``. A
    data-dependent size (the result of a boolean mask under ``torch.compile``)
    cannot be turned into a bool while tracing: such a storage counts as holding
    data, so the tag rule drops tags rather than claim them for new memory.
    """
    return guard_or_true(storage.nbytes() != 0)


nonstrict_trace = torch._dynamo.nonstrict_trace  # typed by torch: it keeps the function's signature


def compile_counter(backend: str) -> Any:
    """A ``torch.compile`` backend that compiles with the backend named ``backend`` and counts the
    frames it compiles (``.frame_count``): how ``tdtree.testing.check_compiles`` sees recompiles."""
    # torch's test helpers load only for the law that asks for them, not with every import of tdtree
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend(backend)


def graph_breaks() -> int:
    """How many graph breaks dynamo has counted in this process (``torch._dynamo.utils.counters``)."""
    return sum(torch._dynamo.utils.counters["graph_break"].values())
