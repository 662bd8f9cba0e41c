"""Shared memory: ``share_memory()`` puts a node's leaves in shared memory.

When every leaf holding data already lives in torch's shared memory (the
leaves of ``module.share_memory()``, or a node received from another process),
nothing is copied: the result holds the same leaves, tagged. Otherwise the
copy is made once, leaf by leaf, like ``clone()``: the input is not changed,
and leaves that were views of one storage become separate storages (a small
view of a large tensor costs only its own bytes). Either way the result is
tagged ``{Shared, Locked}`` on every sub-node: its storages are what other
processes see, so writes to it must go in place (``update_``, ``copy_``,
``at[...].set_``).

A copy is a new leaf of autograd, not a step autograd records (a recorded
copy is not a leaf, and torch refuses to send a non-leaf that requires grad to
another process): it keeps the input leaf's ``requires_grad``, and a copy of
an ``nn.Parameter`` is an ``nn.Parameter``.

Under torch's ``file_descriptor`` sharing strategy (Linux's default) every
shared cpu leaf keeps a file descriptor open for as long as it lives, so a
process holding many shared leaves runs out of them: that failure is raised as
``SharedMemoryError`` naming the fix, and the copies made before it are freed.
"""

from __future__ import annotations

import errno
import resource
from typing import Any

import torch
from torch import nn

from ._base import Node
from ._kinds import kind
from ._lookup import walk
from ._maps import leaves, map_leaves, refuse_first
from ._tags import Locked, Shared, retag, storage_key
from ._torch_private import in_shared_memory
from .errors import LeafError, SharedMemoryError

__all__ = ["share_memory"]

_SHARED_LOCKED = frozenset({Shared, Locked})

# Tensor's own __torch_dispatch__ (torch's "disabled" implementation), which subclasses that leave
# torch's operations to torch inherit (nn.Parameter, a plain subclass holding its own storage).
_TORCH_DISPATCH = torch.Tensor.__torch_dispatch__


def _check_shareable(node: Node, found: list[torch.Tensor]) -> None:
    """LeafError naming the first of ``found`` (``node``'s leaves) of a tensor subclass that runs torch's
    operations itself (``__torch_dispatch__``: DTensor and other wrapper subclasses): its storage is not
    its data, and torch's own ``share_memory_()`` of a DTensor crashes the process, so none is touched."""
    for leaf in found:
        cls = type(leaf)
        if cls is not torch.Tensor and cls.__torch_dispatch__ is not _TORCH_DISPATCH:
            key = next(k for k, v in walk(node, True, True) if v is leaf)
            odd = kind(leaf)  # a jagged nested tensor is such a subclass
            what, advice = (
                (f"a {cls.__name__}", "share plain tensors (a DTensor's local shard is leaf.to_local())")
                if odd is None
                else (f"{odd[0]}, a {cls.__name__}", f"convert it first with {odd[1]}")
            )
            raise LeafError(
                f"share_memory: leaf {key!r} is {what}, a tensor subclass that runs torch's operations itself "
                f"(__torch_dispatch__), whose data tdtree cannot put in shared memory: {advice}"
            )


def _shared_copy(leaf: torch.Tensor) -> torch.Tensor:
    # A CPU clone is moved into shared memory; a CUDA clone is already
    # shareable (share_memory_ is a no-op there and is_shared() is True).
    copy = leaf.detach().clone()
    if not copy.is_meta:  # a meta leaf holds no data: nothing to share (torch refuses to try)
        copy.share_memory_()
    if isinstance(leaf, nn.Parameter):
        return nn.Parameter(copy, requires_grad=leaf.requires_grad)
    return copy.requires_grad_() if leaf.requires_grad else copy


def _sendable(leaf: torch.Tensor) -> bool:
    """Whether ``leaf`` can be handed to other processes as it is: no autograd history (torch refuses to
    send a non-leaf that requires grad), and its data, if any (a meta leaf has none), in torch's shared
    memory."""
    if leaf.requires_grad and not leaf.is_leaf:
        return False
    return leaf.is_meta or storage_key(leaf) is None or in_shared_memory(leaf)


def _out_of_descriptors(err: RuntimeError, node: Node) -> SharedMemoryError | None:
    """The named error for torch's failure to open one more shared-memory file (None: another failure)."""
    if "Too many open files" not in str(err):
        return None
    count = sum(1 for _ in leaves(node))
    strategy = torch.multiprocessing.get_sharing_strategy()
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return SharedMemoryError(
        errno.EMFILE,
        f"share_memory() of a node of {count} leaves ran out of file descriptors: torch's {strategy!r} "
        f"sharing strategy keeps one open file per shared leaf, and this process may open {limit}. "
        'Call torch.multiprocessing.set_sharing_strategy("file_system") before sharing (in every '
        "process), or raise the limit (ulimit -n, resource.setrlimit(resource.RLIMIT_NOFILE, ...)). "
        f"torch said: {err}",
    )


def share_memory(node: Node) -> Any:
    """``node`` with its leaves in shared memory, tagged ``{Shared, Locked}``: its own leaves when they
    already are, else a copy.

    The tags are set, not decided by the rule: the ``Shared`` claim is made true
    whatever the input's tags were. When every leaf that holds data is in
    torch's shared memory (``share_memory_()`` of a tensor or module, a tensor
    received from another process, CUDA memory) and none has autograd history,
    the result holds those same leaves, as ``Tensor.share_memory_()`` leaves a
    shared tensor where it is. Otherwise every leaf is copied into new shared
    memory, detached, with the input leaf's ``requires_grad`` and
    ``nn.Parameter`` type. Leaves mapped from files (``memmap()``,
    ``torch.from_file``) are copied: ``is_shared()`` is True for them, but they
    cannot be sent to other processes (a ``Memmap`` input gives
    ``{Shared, Locked}``). Passing the result to ``torch.multiprocessing``
    workers hands them the same storages, so their in-place writes are seen
    here, and writes here (under ``torch.no_grad()`` for leaves that require
    grad) are seen there.

    Args:
        node: the node (``self`` as a method); it is not changed.

    Returns:
        A node tagged ``{Shared, Locked}`` on every sub-node (set, not kept: only
        ``update_``, ``copy_``, ``at[...].set_`` write into it): the input's leaves,
        or new copies of them in shared memory.

    Raises:
        LeafError: a leaf is a tensor subclass that runs torch's operations itself
            (``__torch_dispatch__``, e.g. a DTensor); nothing was copied.
        SharedMemoryError: the process ran out of file descriptors (torch's ``file_descriptor``
            strategy keeps one per shared leaf); nothing is returned or tagged, the copies made are freed.

    Example:
        >>> import torch, tdtree as tt
        >>> td = tt.TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]).share_memory()
        >>> td["x"].is_shared(), sorted(t.name for t in td.tags)
        (True, ['Locked', 'Shared'])
        >>> td.unlock().share_memory()["x"] is td["x"]  # already shared: nothing copied
        True
    """
    found = leaves(node)
    _check_shareable(node, found)
    try:
        sendable = all(map(_sendable, found))
    except Exception as exc:
        refuse_first("share_memory", node, _sendable, exc)
        raise
    if sendable:
        return retag(node, _SHARED_LOCKED)
    try:
        copied = map_leaves(_shared_copy, node)
    except RuntimeError as err:
        failure = _out_of_descriptors(err, node)
        if failure is None:
            raise
    else:
        return retag(copied, _SHARED_LOCKED)
    # raised outside the handler: torch's error, and the copies its traceback holds, are freed first
    raise failure
