"""The checks of the in-place writers (``_writers``: ``update_``, ``copy_``, ``zero_``, ``fill_``; ``_scatter``: ``at[idx].set_``).

They are the only functions that change a node's storage contents, and they
never change anything else: keys, shapes, dtypes and devices stay as they are.
Each one checks every value and every leaf first and writes only when all of
them fit, so a refused call leaves the node untouched, bit for bit. They work on
``Locked`` nodes (that is what ``Locked`` asks for) and return the node they
were called on, so they are not subject to the tag rule.

Values: a tensor must be on the leaf's device, have a shape that broadcasts
to the leaf's shape, and a dtype that ``torch.can_cast`` to the leaf's (float64
into float32 is written, float into an integer leaf is refused rather than
truncated; a quantized value into a leaf of another dtype is refused: torch
copies it only after ``dequantize()``); a Python number must fit the leaf's dtype kind the same way (bool
into any dtype, int into integer, float and complex leaves, float into float
and complex leaves) and its range (300 into uint8, -1 into uint8, 1e300 into
float32 are refused; inf and nan into float leaves are written). No transfers
between devices: move the value with ``.to(...)`` first.

Leaves: an expanded leaf (several elements share one memory cell), an
inference tensor outside ``torch.inference_mode``, a leaf requiring grad (or a
view of one) while grad mode is on, and a leaf of a node loaded with
``load_memmap(prefix, mode="r")`` are refused, as torch would refuse them midway;
so is a sparse, nested or mkldnn leaf, and a quantized one but by ``update_``,
``copy_`` and ``fill_`` (:func:`leaf_kinds_writable`).
Lazy conjugate / negative views (``td.apply(torch.conj)`` on complex leaves) are
written, as ``Tensor.copy_`` / ``zero_`` write them (through the base they view).

All values are read before any leaf is written, so
``td.update_({"a": td["b"], "b": td["a"]})`` swaps. Every refusal is a
:class:`WriteError` naming the key (its subclasses are also the TypeError /
BatchSizeError / BatchDimError that ``at[idx].set_`` raised before); a key not
in the node is a ``KeyNotFoundError`` / ``KeyMismatchError``.
"""

from __future__ import annotations

import collections
import math
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ._base import Node, memo
from ._foreach import foreach
from ._keys import as_path, display
from ._kinds import kind
from ._lookup import walk
from ._torch_private import is_compiling, storage_id, storage_ids, transforms_active
from .errors import WriteError, WriteShapeError, WriteTypeError

__all__ = [
    "Writes",
    "refused",
    "math_bits",
    "cast",
    "checked",
    "check_number",
    "writable",
    "targets_writable",
    "each_writable",
    "read_first",
    "refuse_kinds",
    "leaf_kinds_writable",
    "mark_read_only",
]

_SCALAR_KIND = {bool: 0, int: 1, float: 2, complex: 3}


def _dtype_kind(dtype: torch.dtype) -> int:
    if dtype is torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def _overlapping(leaf: torch.Tensor) -> bool:
    # expand() makes stride-0 dims: several elements share one memory cell,
    # and copy_ refuses to write such a tensor (after earlier leaves were written).
    # An empty tensor has no elements to share a cell, whatever its strides.
    return leaf.numel() > 0 and any(st == 0 and n > 1 for st, n in zip(leaf.stride(), leaf.shape))


def broadcasts(source: torch.Size, target: torch.Size) -> bool:
    # torch.broadcast_shapes costs ~14 us; this is the same test for a fixed target.
    if len(source) > len(target):
        return False
    return all(s == t or s == 1 for s, t in zip(reversed(source), reversed(target)))


# the Python ints torch takes as a number at all (an int64, or a uint64 above int64's range)
_TORCH_INT_LOW, _TORCH_INT_HIGH = -(2**63), 2**64 - 1


def _in_range(value: bool | int | float | complex, dtype: torch.dtype) -> bool:
    """Whether the Python number ``value`` (of a kind the dtype takes) is in ``dtype``'s range.

    Integers: within ``torch.iinfo`` (no wrapping: -1 into uint8 is refused, as
    300 is); into a float or complex dtype, within the 64-bit range torch reads
    a Python int in before converting it. Floats and complex parts: finite values up to ``torch.finfo(dtype).max``
    in magnitude (torch's own overflow test refuses the rest, after rounding
    would have made some of them fit); inf and nan are values of every float dtype.
    """
    if type(value) is bool or dtype is torch.bool:
        return True
    limits = _LIMITS.get(dtype)
    if limits is None:
        limits = _LIMITS[dtype] = _limits(dtype)
    low, high, integral = limits
    if integral:
        return not isinstance(value, complex) and low <= value <= high
    if type(value) is int and not _TORCH_INT_LOW <= value <= _TORCH_INT_HIGH:
        return False  # torch reads a Python int as a 64-bit integer first, whatever the leaf's dtype
    parts: tuple[float, ...] = (value.real, value.imag) if isinstance(value, complex) else (value,)
    for part in parts:
        if not (low <= part <= high or (type(part) is float and not math.isfinite(part))):
            return False
    return True


def _limits(dtype: torch.dtype) -> tuple[int | float, int | float, bool]:
    if dtype.is_floating_point or dtype.is_complex:
        top = torch.finfo(dtype).max
        return -top, top, False
    info = torch.iinfo(dtype)
    return info.min, info.max, True


_LIMITS: dict[torch.dtype, tuple[int | float, int | float, bool]] = {}


# Storages mapped read-only (load_memmap(mode="r")), by storage identity: what the in-place
# writers refuse. Empty in most processes, which then skip the test.
_READ_ONLY: dict[int, str] = {}


def mark_read_only(storage: torch.UntypedStorage, what: str) -> None:
    """Make the in-place writers refuse every tensor viewing ``storage`` (``what`` names it in the error)."""
    key = storage_id(storage)
    _READ_ONLY[key] = what
    weakref.finalize(storage, _READ_ONLY.pop, key, None)


def _grad_leaf(leaf: torch.Tensor) -> bool:
    # torch's own test (check_inplace): a leaf requiring grad, or a view of one, while grad mode is on
    if not (leaf.requires_grad and torch.is_grad_enabled()):
        return False
    base = leaf._base
    return leaf.is_leaf or (base is not None and base.is_leaf)


def writable(op: str, path: tuple[str, ...], leaf: torch.Tensor, fill: bool = False) -> None:
    """Raise WriteError when torch (or a read-only memmap) would refuse to write into ``leaf``.

    ``fill``: the write sets every element to one value, which an expanded leaf takes.
    """
    if not fill and 0 in leaf.stride() and _overlapping(leaf):
        raise WriteError(
            f"{_where(op, path)} is an expanded tensor (stride 0 in shape {tuple(leaf.shape)}): several of "
            "its elements share one memory cell, so it cannot be written element by element; clone() it first"
        )
    if is_compiling():
        # a compiled graph applies its writes to its inputs after it ran, all of them or none:
        # torch's own refusals come while tracing, before anything is written
        return
    try:
        leaf._version  # noqa: B018 - an inference tensor has no version counter: the cheapest test for one
    except RuntimeError:
        if not torch.is_inference_mode_enabled():
            raise WriteError(
                f"{_where(op, path)} is an inference tensor, which torch writes only inside torch.inference_mode(); "
                "write it there, or clone() the leaf outside it"
            ) from None
    if leaf.requires_grad and _grad_leaf(leaf):
        raise WriteError(
            f"{_where(op, path)} is a leaf that requires grad (or a view of one, e.g. an nn.Parameter): torch "
            "refuses to write it in place while grad mode is on; write it under torch.no_grad()"
        )
    if _READ_ONLY:
        what = _READ_ONLY.get(next(storage_ids([leaf])))
        if what is not None:
            raise WriteError(f"{_where(op, path)} is read-only: {what}")


def targets_writable(dst: list[torch.Tensor], foreach: bool = True) -> bool:
    """Whether every one of ``dst`` (contiguous leaves, so none expanded) is surely writable, in a
    C-speed scan; False sends the caller to :func:`each_writable`. True under torch.compile (see
    :func:`writable`).

    With ``foreach`` (the leaves are written by one ``torch._foreach_*`` call) a leaf
    requiring grad is not scanned for: that kernel checks it for every tensor before it
    writes any (:func:`refused` turns its refusal into WriteError), except inside a
    transform, where the map layer writes leaf by leaf.
    """
    if is_compiling():
        return True
    if not torch.is_inference_mode_enabled():
        try:
            # an inference tensor has no version counter: reading every leaf's is the cheapest
            # scan for one (half the cost of calling is_inference on each)
            _deque(map(_VERSION, dst), 0)
        except RuntimeError:
            return False
    if _READ_ONLY and not _READ_ONLY.keys().isdisjoint(storage_ids(dst)):
        return False
    if foreach and not transforms_active():
        return True
    return not (torch.is_grad_enabled() and any(map(_REQUIRES_GRAD, dst)))


_REQUIRES_GRAD: Callable[[Tensor], bool] = operator.attrgetter("requires_grad")
_VERSION: Callable[[Tensor], int] = operator.attrgetter("_version")
_deque = collections.deque


def refused(op: str, node: Node, dst: list[torch.Tensor], fill: bool = False) -> None:
    """After a ``torch._foreach_*`` kernel over ``dst`` raised: WriteError naming the key when it
    refused a leaf requiring grad (a test it makes for every tensor before it writes any)."""
    if not is_compiling() and torch.is_grad_enabled() and any(map(_REQUIRES_GRAD, dst)):
        each_writable(op, node, dst, fill)


def cast(value: Any, dtype: torch.dtype) -> Any:
    """``value`` in ``dtype`` when it is a tensor of another one, before a copy into a leaf.

    ``Tensor.copy_`` casts, but into a negative view (the ``.imag`` of a conjugate view) it
    writes a float16 value with the wrong sign (torch 2.13), and ``index_put_`` refuses another
    dtype: casting first writes what every other copy writes.
    """
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.dtype != dtype else value


def math_bits(dst: list[torch.Tensor]) -> bool:
    """After a ``torch._foreach_*`` kernel over ``dst`` raised: whether one of ``dst`` is a lazy
    conjugate or negative view (``torch.conj`` of a complex tensor, its ``.imag``).

    The kernels' fallback for those refuses a list holding one before it writes any tensor,
    where ``Tensor.copy_`` / ``zero_`` write them: the caller then writes leaf by leaf. Found
    from the refusal rather than scanned for, so the common call pays nothing.
    """
    return any(x.is_conj() or x.is_neg() for x in dst)


# The in-place writers test each value against its leaf fast, inline (a call per leaf
# costs more than the test): a tensor of the leaf's dtype and shape, on its device
# (not tested when same_device says both nodes hold every leaf there), and a
# contiguous leaf (so no stride 0); the leaves' other writability is tested in one
# scan over them. Every other value goes through checked.


def same_device(node: Node, other: Any) -> bool:
    """Whether ``node`` and ``other`` are nodes with every leaf on one device: a node's device, when
    it has one, is every leaf's (checked when the node was built)."""
    return isinstance(other, Node) and node._meta[2] is not None and node._meta[2] == other._meta[2]


def checked(
    op: str,
    path: tuple[str, ...],
    leaf: torch.Tensor,
    value: Any,
    exact_shape: bool = False,
    fill: bool = False,
    shape: torch.Size | None = None,
    leaf_checks: bool = True,
) -> Any:
    """``value`` when it can be written into ``leaf`` (at an entry of ``shape``, the leaf's shape by
    default) without changing the leaf's dtype, shape or device and ``leaf`` is writable; else a
    WriteError naming ``path``. The one check of every in-place writer (and of the functional
    ``at[idx].set``, which writes into a copy: ``leaf_checks=False`` skips the writability test)."""
    if leaf_checks:
        writable(op, path, leaf, fill)
    target = leaf.shape if shape is None else shape
    if isinstance(value, torch.Tensor):
        if value.dtype != leaf.dtype and value.is_quantized:
            # can_cast says yes (quint8 into float32), copy_ and index_put refuse: quantized
            # values are read through dequantize(), never cast implicitly
            raise WriteTypeError(
                f"{_where(op, path)} holds {leaf.dtype} and the value is a quantized {value.dtype} tensor, "
                f"which torch does not copy into another dtype: give value.dequantize().to({leaf.dtype}) instead"
            )
        if value.dtype != leaf.dtype and not torch.can_cast(value.dtype, leaf.dtype):
            raise WriteTypeError(
                f"{_where(op, path)} holds {leaf.dtype} and the value is {value.dtype}, which does not cast to "
                f"it without truncation; in-place writes never change a dtype: convert the value with "
                f".to({leaf.dtype}) first"
            )
        if value.device != leaf.device:
            raise WriteError(
                f"{_where(op, path)} is on {leaf.device} and the value is on {value.device}; in-place writes "
                f"never change a device: move the value with .to({str(leaf.device)!r}) first"
            )
        if value.shape != target:
            if exact_shape:
                refuse_kinds(op, ((path, value),))
                raise WriteShapeError(
                    f"{_where(op, path)} has shape {tuple(target)} and the value has shape "
                    f"{tuple(value.shape)}; copy_ needs equal shapes (update_ broadcasts)"
                )
            if not broadcasts(value.shape, target):
                refuse_kinds(op, ((path, value),))
                raise WriteShapeError(
                    f"{_where(op, path)} has shape {tuple(target)} and the value's shape "
                    f"{tuple(value.shape)} does not broadcast to it; in-place writes never change a shape: "
                    "use set() on an unlocked node for a new shape"
                )
        return value
    return check_number(op, path, leaf.dtype, value)


def refuse_kinds(op: str, named: Any) -> None:
    """WriteTypeError for the first of ``named`` ((path, value) pairs) that is a sparse, nested,
    quantized or mkldnn tensor, naming the key, the kind and the conversion; nothing for the others.

    Called only where a write already failed (a shape that does not fit, torch refusing to read a
    storage or a shape): the common path reads no kind, so a refused kind costs nothing to writes of
    strided tensors, and the error it would have met is told by name."""
    for path, value in named:
        found = kind(value)
        if found is None:
            continue
        what, conversion = found
        why = f"{what}; in-place writes take strided, unquantized tensors: convert it with {conversion}"
        raise WriteTypeError(f"{_where(op, path) if path else op}: the value is {why}")


def _odd_leaves(node: Node) -> dict[int, tuple[tuple[str, ...], Tensor]]:
    """The path of each leaf of ``node`` that :func:`kind` names (sparse, nested, quantized, mkldnn),
    by the leaf's id."""
    return {id(leaf): (as_path(path), leaf) for path, leaf in walk(node, True, True) if kind(leaf) is not None}


_QUANTIZED_WRITERS = frozenset({"update_", "copy_", "fill_"})


def leaf_kinds_writable(
    op: str, node: Node, leaves: list[Tensor] | None = None, filled: Sequence[tuple[Tensor, Any]] = ()
) -> None:
    """WriteTypeError when one of ``leaves`` and of the leaves of ``filled`` (``(leaf, number)`` pairs),
    leaves of ``node`` about to be written (``leaves`` None: every leaf of ``node``), is a sparse,
    nested, quantized or mkldnn tensor, naming the key, the kind and the conversion, before anything
    is written.

    torch writes some of these kinds in place and not others, and a call over several leaves that
    meets one it refuses has written the leaves before it: the writers write strided leaves, and
    quantized ones by ``update_``, ``copy_`` and ``fill_``. The node's leaves of those kinds are found once for each node (``memo``:
    a node's leaves never change), so a node written again pays a lookup; not asked under
    torch.compile, where torch refuses these kinds while tracing, before anything is written.
    """
    if is_compiling():
        return
    odd = memo(node, _odd_leaves)
    if not odd:
        return
    written = [value for _, value in odd.values()] if leaves is None else [*leaves, *(leaf for leaf, _ in filled)]
    for leaf in written:
        hit = odd.get(id(leaf))
        # a quantized leaf is written by Tensor.copy_ / fill_, which quantize the values (torch has no
        # zero_ for it, and at[idx] writes cast the value to the leaf's dtype, which torch cannot)
        if hit is not None and (op not in _QUANTIZED_WRITERS or not leaf.is_quantized):
            path, value = hit
            what, conversion = kind(value) or ("", "")
            raise WriteTypeError(
                f"{_where(op, path)} is {what}, which {op} does not write: "
                f"convert the leaf first, e.g. node.set({display(path)!r}, {conversion}) with value the leaf"
            )


def check_number(op: str, path: tuple[str, ...], dtype: torch.dtype, value: Any) -> Any:
    """``value`` when it is a Python number of a kind ``dtype`` takes, in its range; else WriteError."""
    kind = _SCALAR_KIND.get(type(value))
    if kind is None:
        raise WriteTypeError(f"{_where(op, path)}: a value is a tensor or a Python number, got {type(value).__name__}")
    if kind > _dtype_kind(dtype):
        raise WriteTypeError(
            f"{_where(op, path)} holds {dtype} and the value {value!r} is a {type(value).__name__}; "
            "in-place writes never change a dtype and do not truncate: give a value of the leaf's kind"
        )
    if not _in_range(value, dtype):
        raise WriteError(
            f"{_where(op, path)} holds {dtype} and the value {value!r} is out of its range; in-place "
            "writes do not wrap or overflow: give a value the dtype holds"
        )
    return value


def _where(op: str, path: tuple[str, ...]) -> str:
    return f"{op}: {display(path)!r}"


class Writes:
    """The writes one call makes, gathered while checking: tensor values, then Python numbers.

    Leaves paired with a value by the inline fast test (see above) are checked for
    writability in :meth:`run`, before anything is written; the others were checked
    already by :func:`checked`.
    """

    __slots__ = ("op", "node", "dst", "src", "fills")

    def __init__(self, op: str, node: Node) -> None:
        self.op = op
        self.node = node
        self.dst: list[torch.Tensor] = []
        self.src: list[torch.Tensor] = []
        self.fills: list[tuple[torch.Tensor, Any]] = []

    def add(self, leaf: torch.Tensor, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.dst.append(leaf)
            self.src.append(value)
        else:
            self.fills.append((leaf, value))

    def run(self) -> None:
        """Write everything, reading all values before the first write."""
        leaf_kinds_writable(self.op, self.node, self.dst, self.fills)
        src = self.src
        if src:
            if not targets_writable(self.dst):
                each_writable(self.op, self.node, self.dst)
            try:
                src = read_first(src, self.dst)
            except (NotImplementedError, RuntimeError):  # torch reads no storage of a sparse or mkldnn value
                paths = {id(t): p for p, t in walk(self.node, True, True)}
                refuse_kinds(self.op, ((as_path(paths.get(id(t), ("?",))), v) for t, v in zip(self.dst, src)))
                raise
            try:
                foreach(torch._foreach_copy_)(self.dst, src)
            except RuntimeError:
                refused(self.op, self.node, self.dst)
                if not math_bits(self.dst):
                    raise
                for leaf, value in zip(self.dst, src):
                    leaf.copy_(cast(value, leaf.dtype))
        # numbers are read already; tensor values were read by the copy above
        for leaf, value in self.fills:
            leaf.fill_(value)


def each_writable(op: str, node: Node, leaves: list[torch.Tensor], fill: bool = False) -> None:
    """:func:`writable` for each of ``leaves`` (leaves of ``node``), naming the key of a refused one."""
    paths = {id(t): p for p, t in walk(node, True, True)}
    for leaf in leaves:
        writable(op, as_path(paths.get(id(leaf), ("?",))), leaf, fill)


def read_first(values: list[torch.Tensor], targets: list[torch.Tensor]) -> list[torch.Tensor]:
    """``values``, each one that uses a storage one of ``targets`` uses copied, so that writing the
    targets in any order writes what every value held before the first write."""
    if is_compiling():
        # Compiled code copies every value first: inductor's code for clone-then-write is the
        # code for the write alone, and no trace-time _aliased means no guards on torch's
        # pytree registry, which cost ~1 us on every call of a compiled update_ of 20 leaves.
        return [v.clone() for v in values]
    flags = _aliased(values, targets)
    if not flags:
        return values
    return [v.clone() if aliased else v for v, aliased in zip(values, flags)]


def _aliased(values: list[torch.Tensor], targets: list[torch.Tensor]) -> tuple[bool, ...]:
    """For each of ``values``: whether it uses a storage one of ``targets`` uses; ``()`` when none does."""
    # Eager only (compiled code copies every value, see read_first). Without storage_key's zero-byte
    # exception: a shared empty storage only costs a needless clone of an empty value.
    known = set(storage_ids(targets))
    keys = list(storage_ids(values))
    if known.isdisjoint(keys):
        return ()
    return tuple(key in known for key in keys)
