"""Named errors of tdtree: each says what went wrong and what to do instead.

An error whose constructor builds its message sets ``self.args`` itself rather than
calling ``super().__init__``: dynamo cannot trace a builtin exception's ``__init__``
called from a subclass, and code that raises one under ``torch.compile`` would stop
at that call instead of at the error. Each such error pickles by its constructor's
arguments (``__reduce__``), so it crosses process boundaries as it was raised.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "BatchDimError",
    "BatchSizeError",
    "ControlFlowError",
    "FieldError",
    "KeyCollisionError",
    "KeyMismatchError",
    "KeyNotFoundError",
    "LeafError",
    "LockedError",
    "MemmapError",
    "NotANodeKeyError",
    "OutKeysError",
    "PeerFailedError",
    "SerializationError",
    "SharedMemoryError",
    "StructureMismatchError",
    "TorchVersionError",
    "WriteError",
    "WriteIndexError",
    "WriteShapeError",
    "WriteTypeError",
]


def _fmt(key: object) -> str:
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    return repr(key)


class KeyNotFoundError(KeyError):
    """A key is not in the node; the message lists the keys there and close matches."""

    def __init__(self, key: object, available: Iterable[object]) -> None:
        self.key = key
        self.available = tuple(available)
        names = [_fmt(k) for k in self.available]
        close = difflib.get_close_matches(_fmt(key), names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        shown = ", ".join(names) if names else "none"
        self.args = (f"key {_fmt(key)} not found; the keys here are: {shown}.{hint}",)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.key, self.available)


class NotANodeKeyError(KeyNotFoundError):
    """A nested key goes through an entry that is a tensor, not a node."""

    def __init__(self, key: object, prefix: object) -> None:
        self.key = key
        self.prefix = prefix
        self.available = ()
        self.args = (f"key {_fmt(key)} not found: {_fmt(prefix)} is a tensor, not a node, so it has no sub-keys.",)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.key, self.prefix)


class BatchSizeError(ValueError):
    """A leaf's shape, or a nested node's batch size, does not start with the batch size."""


class LeafError(TypeError):
    """A leaf of a kind an operation cannot take; the message names the key. An operation that torch
    fails on a sparse, nested, quantized or mkldnn leaf raises it naming the kind and the conversion
    (``to_dense()``, ``torch.nested.to_padded_tensor``, ``dequantize()``), torch's error chained as its
    ``__cause__``; ``share_memory()`` raises it, before any leaf is touched, for a leaf of a tensor
    subclass that runs torch's operations itself (``__torch_dispatch__``, a DTensor), whose storage is
    not its data."""


class KeyMismatchError(ValueError):
    """Two nodes combined by key do not hold the same keys."""

    def __init__(self, what: str, left: Iterable[object], right: Iterable[object]) -> None:
        self.what = what
        self.left, self.right = tuple(left), tuple(right)
        only_left = ", ".join(sorted(map(_fmt, set(self.left) - set(self.right))))
        only_right = ", ".join(sorted(map(_fmt, set(self.right) - set(self.left))))
        self.args = (
            f"{what}: the nodes' keys differ; only in the first: {only_left or 'none'}; "
            f"only in the second: {only_right or 'none'}.",
        )

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.what, self.left, self.right)


class KeyCollisionError(ValueError):
    """An operation would give two entries the same key."""


class LockedError(RuntimeError):
    """A functional editor was called on a node tagged ``Locked`` (or whose sub-node at ``at``, on the
    path the editor changes, is)."""

    def __init__(self, op: str, at: object = None) -> None:
        self.op = op
        self.at = at
        where = "" if at is None else f" (the sub-node at {at!r} is locked)"
        self.args = (
            f"{op}() on a locked node{where}: a Locked node takes writes in place only. "
            "Use update_(), copy_() or at[idx].set_() to write into its storage, "
            "or unlock() for a node that the functional editors accept.",
        )

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.op, self.at)


class MemmapError(OSError):
    """A memory-mapped node could not be written or read; the message names the file."""


class WriteError(ValueError):
    """An in-place writer refused a write: a value that would change a leaf's shape, dtype or
    device, a number out of the leaf dtype's range, or a leaf that cannot be written (expanded,
    an inference tensor, a leaf requiring grad, a read-only memmap).

    Raised before anything is written; the message names the key, both shapes or dtypes, and
    the functional editor or conversion to use instead.
    """


class BatchDimError(IndexError):
    """A batch dim, or an index over the batch dims, does not fit the node's batch size."""


# The subclasses below are WriteErrors that are also the errors at[idx].set_ raised before it
# raised WriteError, so that old except clauses still catch them.


class WriteTypeError(WriteError, TypeError):
    """A value whose dtype does not cast to its leaf's (``torch.can_cast``), or that is neither a
    tensor, a node nor a Python number."""


class WriteShapeError(WriteError, BatchSizeError):
    """A value whose shape does not broadcast to the entry it is written to."""


class WriteIndexError(WriteError, BatchDimError):
    """An index of ``at[idx].set_`` out of range for its batch dim, or not an index over the batch dims."""


class SerializationError(OSError):
    """A file given to ``tdtree.load`` is not a tdtree save file, is corrupt, or holds objects that
    safe loading refuses to rebuild, or ``tdtree.save`` was given a leaf that ``load`` could not read
    back; the message names the file."""


class SharedMemoryError(OSError):
    """``share_memory()`` ran out of file descriptors: under torch's ``file_descriptor`` sharing strategy
    (Linux's default) every shared leaf holds one open file. The message names the leaf count, the
    strategy and the fixes: ``torch.multiprocessing.set_sharing_strategy("file_system")``, or a higher
    ``RLIMIT_NOFILE``. ``errno`` is ``EMFILE``."""


class OutKeysError(ValueError):
    """A module wrapped by ``tdtree.nn.TDModule`` returned a different number of outputs than it has out_keys."""


class StructureMismatchError(ValueError):
    """Processes exchanging nodes over ``tdtree.distributed`` hold nodes of different structures.

    Raised on every side of the exchange, before any data is used: the message names the keys found
    on one side only and the keys whose shape, dtype or batch size differ, with the ranks holding
    each. ``differences`` holds those lines.
    """

    def __init__(self, op: str, differences: Iterable[str]) -> None:
        self.op = op
        self.differences = tuple(differences)
        self.args = (
            f"{op}: the processes' nodes differ, so the transfer was refused: "
            + "; ".join(self.differences)
            + ". Every process must pass a node (or template) with the same keys, shapes and dtypes.",
        )

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.op, self.differences)


class ControlFlowError(ValueError):
    """A body given to ``tdtree.control`` returned another structure than the operator needs: a carry
    that is not its input's (a key missing or new, another batch size, shape or dtype), or branches
    of ``cond`` that differ. Raised before torch runs the operator; the message names each key that
    differs, and ``differences`` holds those lines."""

    def __init__(self, op: str, what: str, differences: Iterable[str]) -> None:
        self.op = op
        self.what = what
        self.differences = tuple(differences)
        self.args = (f"tdtree.control.{op}: {what}: " + "; ".join(self.differences),)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.op, self.what, self.differences)


class PeerFailedError(RuntimeError):
    """Another process of a ``tdtree.distributed`` exchange failed before any data moved.

    That process raised its own error there (a value that is not a node, a leaf it could not
    pack) and sent a failure marker in place of its structure header, so the others raise this
    at once instead of waiting until the process group's timeout. ``rank`` is the failed
    process's global rank, ``reason`` what it raised (type and message).
    """

    def __init__(self, op: str, rank: int, reason: str) -> None:
        self.op = op
        self.rank = rank
        self.reason = reason
        self.args = (f"{op}: rank {rank} failed before any data moved, so nothing was exchanged: {reason}",)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.op, self.rank, self.reason)


class FieldError(TypeError):
    """A tensorclass was given an unknown or missing field, a value whose type does not fit the
    field, or a class body declares a field it cannot have; the message names the field."""


class TorchVersionError(RuntimeError):
    """The installed torch lacks a name tdtree reads from torch's internals (``tdtree._torch_private``).

    tdtree is tested with the torch versions its package metadata declares (``torch>=2.13,<2.14``);
    another torch works only as far as it keeps those names. Raised where the name is first needed.
    """

    def __init__(self, name: str, version: str) -> None:
        self.name, self.version = name, version
        self.args = (
            f"tdtree needs {name}, which torch {version} does not have: tdtree is tested with "
            "torch>=2.13,<2.14 (the README's 'Using another torch' says how to install that one).",
        )

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.name, self.version)
