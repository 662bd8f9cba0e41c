"""The scatter ``td.at[idx].set(value)`` / ``.set_(value)``: writes at an index of the batch dims.

The index is normalized as ``td[idx]`` normalizes it (``_index.normalize``).
Every check runs before anything is written: a refused write leaves nothing
written. ``set`` returns a new node of new storage (tags dropped); ``set_``
writes into the node's leaves and returns it (tags kept).
"""

from __future__ import annotations

from typing import Any, Generic

import torch

from ._base import Node, NodeT, with_meta
from ._foreach import foreach
from ._index import getitem, normalize
from ._inplace import (
    broadcasts,
    cast,
    check_number,
    checked,
    each_writable,
    leaf_kinds_writable,
    read_first,
    refuse_kinds,
    same_device,
    targets_writable,
)
from ._keyops import check_unlocked_tree
from ._keys import as_path, display
from ._lookup import walk, walk_keys
from ._maps import flat, unflat
from ._tags import Locked, tag_rule
from .errors import BatchDimError, KeyMismatchError, WriteError, WriteIndexError, WriteShapeError, WriteTypeError

__all__ = ["scatter", "scatter_", "At", "AtIndex"]


def _same_keys(a: Node, b: Node) -> bool:
    """True when ``a`` and ``b`` have the same keys at every level (then their leaves pair in order)."""
    if a._meta[0] != b._meta[0]:
        return False
    for v, w in zip(a._data.values(), b._data.values()):
        if isinstance(v, Node) is not isinstance(w, Node) or (isinstance(v, Node) and not _same_keys(v, w)):
            return False
    return True


def _pairs(
    node: Node, index: Any, value: Any, op: str, inplace: bool
) -> tuple[list[torch.Tensor], Any, tuple[Any, ...], list[Any]]:
    """Every check of a scatter, before anything is written: (leaves, treespec, leaf index, values).

    ``values`` holds one value per leaf, in leaf order, ready for ``leaf[idx] = v``:
    each tensor passed :func:`tdtree._inplace.checked` (the casting rule of
    ``update_``); with ``inplace`` numbers did too (kind and range), each leaf is
    writable and every index in range.
    """
    try:
        leaf_index, new = normalize(node._meta[1], index)
    except BatchDimError as err:
        raise WriteIndexError(f"{op}: {err}") from None
    except TypeError as err:
        raise WriteTypeError(f"{op}: {err}") from None
    except ValueError as err:
        raise WriteIndexError(f"{op}: {err}") from None
    leaves, spec = flat(node)
    if not inplace:  # (scatter_ asked first, for its fast path too)
        leaf_kinds_writable(op, node, leaves)
    n = len(node._meta[1])
    if isinstance(value, Node):
        if value._meta[1] != new:
            raise WriteShapeError(
                f"{op}: the value's batch_size {tuple(value._meta[1])} is not td[idx].batch_size {tuple(new)}"
            )
        if _same_keys(node, value):
            values = flat(value)[0]
        else:  # same leaf keys can still differ in empty sub-nodes, which hold nothing to write
            paths = walk_keys(node, True, True)
            given = dict(walk(value, True, True))
            if list(given) != paths:
                raise KeyMismatchError(op, paths, given)
            values = [given[p] for p in paths]
    elif isinstance(value, torch.Tensor):
        try:
            fits = broadcasts(value.shape, new)
            if fits and inplace:  # one value for every leaf: read it first once (not once per leaf in scatter_)
                value = read_first([value], leaves)[0]
            values = [value[(..., *(None,) * (leaf.dim() - n))] for leaf in leaves] if fits else []
        except (NotImplementedError, RuntimeError):  # no shape (strided nested) or no storage (sparse)
            refuse_kinds(op, (((), value),))
            raise
        if not fits:
            refuse_kinds(op, (((), value),))
            raise WriteShapeError(
                f"{op}: a tensor value of shape {tuple(value.shape)} is aligned with the batch dims and does not "
                f"broadcast to td[idx].batch_size {tuple(new)}"
            )
    elif isinstance(value, (bool, int, float, complex)):
        values = [value] * len(leaves)
        if inplace:  # the functional set writes a number into a copy as torch's x[idx] = number does
            _check_number_writes(op, node, leaves, value)
        _check_bounds(op, node._meta[1], leaf_index)
        return leaves, spec, leaf_index, values
    else:
        raise WriteTypeError(f"{op}: the value must be a node, a tensor or a number, got {type(value).__name__}")
    # a node's device, when set, is every leaf's: equal devices spare the per-leaf test
    device = node._meta[2]
    same_device = device is not None and (
        value._meta[2] == device
        if isinstance(value, Node)
        else isinstance(value, torch.Tensor) and value.device == device
    )
    fast = []  # leaves whose value passed the inline test (update_'s): their writability is scanned at once
    for i, (leaf, v) in enumerate(zip(leaves, values)):
        if (
            isinstance(v, torch.Tensor)
            and v.dtype == leaf.dtype
            and (same_device or v.device == leaf.device)
            and leaf.is_contiguous()
            and broadcasts(v.shape, torch.Size((*new, *leaf.shape[n:])))
        ):
            fast.append(leaf)
            continue
        target = torch.Size((*new, *leaf.shape[n:]))
        try:
            checked(op, (), leaf, v, shape=target, leaf_checks=inplace)
        except WriteError:
            # the key, for the message, only when there is one to give (walking costs more than checking)
            checked(op, as_path(walk(node, True, True)[i][0]), leaf, v, shape=target, leaf_checks=inplace)
            raise
    if inplace and fast and not targets_writable(fast, foreach=False):
        each_writable(op, node, fast)
    _check_bounds(op, node._meta[1], leaf_index)
    return leaves, spec, leaf_index, values


def _check_number_writes(op: str, node: Node, leaves: list[torch.Tensor], value: Any) -> None:
    """:func:`tdtree._inplace.checked` of the number ``value`` for every leaf: the number once per
    dtype, the leaves' writability in one scan (leaf by leaf only for a non-contiguous leaf or a refusal)."""
    dtypes = {leaf.dtype for leaf in leaves}
    for i, leaf in enumerate(leaves):
        if leaf.dtype in dtypes:
            dtypes.discard(leaf.dtype)
            try:
                check_number(op, (), leaf.dtype, value)
            except WriteError:
                check_number(op, as_path(walk(node, True, True)[i][0]), leaf.dtype, value)
                raise
    if not (all(map(_IS_CONTIGUOUS, leaves)) and targets_writable(leaves, foreach=False)):
        each_writable(op, node, leaves)


_IS_CONTIGUOUS = torch.Tensor.is_contiguous


def _check_bounds(op: str, batch: torch.Size, leaf_index: tuple[Any, ...]) -> None:
    """Raise WriteIndexError when an index tensor of ``leaf_index`` is out of range for its batch dim
    (torch finds it only while writing, after the leaves before it were written)."""
    dim = 0
    for item in leaf_index:
        if item is None:
            continue
        if item is Ellipsis:
            dim += len(batch) - sum(1 for i in leaf_index if i is not None and i is not Ellipsis)
            continue
        if isinstance(item, torch.Tensor) and item.numel():
            size = batch[dim]
            # a short index is cheaper to read than to reduce (aminmax and two item() calls)
            low, high = (
                (min(v := item.reshape(-1).tolist()), max(v)) if item.numel() <= 64 else map(int, torch.aminmax(item))
            )
            if low < -size or high >= size:
                bad = high if high >= size else low
                raise WriteIndexError(
                    f"{op}: index {bad} is out of range for batch dim {dim} of size {size} (batch_size {tuple(batch)})"
                )
        dim += 1


# Dtypes torch has no index_put kernel for: written through a view as the signed (or byte) dtype
# of the same size, which moves the same bits.
_INDEX_PUT_AS = {
    getattr(torch, name): getattr(torch, bits)
    for name, bits in (("uint16", "int16"), ("uint32", "int32"), ("uint64", "int64"), ("float8_e8m0fnu", "uint8"))
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def _write(leaf: torch.Tensor, index: tuple[Any, ...], value: Any, advanced: bool) -> None:
    """``leaf[index] = value``, casting ``value`` to the leaf's dtype for every index kind, also for
    the dtypes torch cannot index_put.

    The value (checked by the casting rule already) is cast first (:func:`tdtree._inplace.cast`):
    an index tensor writes through ``index_put_``, which refuses another dtype, so every index
    kind writes what a basic one would. ``advanced``: whether ``index``
    holds a tensor (:func:`_advanced`, once per call).
    """
    value = cast(value, leaf.dtype)
    if advanced:
        bits = _INDEX_PUT_AS.get(leaf.dtype)
        if bits is not None:
            value = torch.as_tensor(value, dtype=leaf.dtype, device=leaf.device).view(bits)
            leaf = leaf.view(bits)
    leaf[index] = value


def _advanced(index: tuple[Any, ...]) -> bool:
    return any(isinstance(i, torch.Tensor) for i in index)


def _put(leaf: torch.Tensor, index: tuple[Any, ...], value: Any, advanced: bool) -> torch.Tensor:
    out = leaf.clone()
    _write(out, index, value, advanced)
    return out


_SET = "at[...].set"


@tag_rule
def scatter(node: NodeT, index: Any, value: Any) -> NodeT:
    """A new node equal to ``node`` with ``value`` written at ``index`` of the batch dims; the input is untouched.

    ``value``: a node with the same keys shaped like ``node[index]``, or a
    number or tensor (aligned with the batch dims) for every leaf. Refused on a
    Locked node. Leaves are new storage, so tags are dropped.
    """
    if isinstance(value, Node):
        out = _scatter_node(node, index, value)
        if out is not None:
            return out
    # the checked path, from the start: it raises what the one pass declined, in this order, or writes
    # the values it left to it (of other dtypes, or broadcast)
    check_unlocked_tree(node, _SET)
    leaves, spec, leaf_index, values = _pairs(node, index, value, _SET, inplace=False)
    advanced = _advanced(leaf_index)
    out = []
    for i, (x, v) in enumerate(zip(leaves, values)):
        try:
            out.append(_put(x, leaf_index, v, advanced))
        except (RuntimeError, ValueError) as err:
            # a number torch refuses for this dtype (1j into a float leaf, an int past 64 bits):
            # the input is untouched (every write went into a copy)
            path = as_path(walk(node, True, True)[i][0])
            refuse_kinds(_SET, ((path, v),))
            where = display(path)
            raise WriteTypeError(f"{_SET}: {where!r} holds {x.dtype}; torch refuses the value {v!r}: {err}") from None
    return unflat(spec, out)


def _scatter_node(node: Node, index: Any, value: Node) -> Any:
    """:func:`scatter` of a node value in one pass, when the index is valid, no node is Locked and every
    value fits its leaf as it is (see :func:`_written`); None for anything else."""
    try:
        leaf_index, new = normalize(node._meta[1], index)
    except Exception:  # raised by the checked path, after its Locked test (which comes first)
        return None
    if value._meta[1] != new:
        return None
    one = leaf_index[0] if len(leaf_index) == 1 else leaf_index
    return _written(node, value, one, new, len(node._meta[1]), same_device(node, value))


def _written(node: Node, value: Node, index: Any, new: torch.Size, n: int, same_device: bool) -> Any:
    """``node`` with the leaves of ``value`` written at the leaf index ``index`` into copies of its own;
    None at the first Locked node, or value that is not a tensor of its leaf's dtype and exact shape
    (``new`` then the leaf's dims after the ``n`` batch dims) on its device, or write torch refuses
    (an index tensor out of range, a sparse leaf, a batched value under vmap). The copies made before
    are dropped: the checked path then finds the refusal that comes first, as it does every check
    before its first write."""
    tags = node._meta[3]
    if (tags and Locked in tags) or node._meta[0] != value._meta[0]:
        return None
    data = {}
    for (k, leaf), v in zip(node._data.items(), value._data.values()):
        if isinstance(leaf, Node):
            if not isinstance(v, Node):
                return None
            sub = _written(leaf, v, index, new, n, same_device)
            if sub is None:
                return None
            data[k] = sub
        elif (
            isinstance(v, torch.Tensor)
            and v.dtype == leaf.dtype
            and v.shape == new + leaf.shape[n:]
            and (same_device or v.device == leaf.device)
        ):
            out = leaf.clone()
            try:
                out[index] = v
            except Exception:  # (also the dtypes torch has no index_put kernel for, which _write takes)
                return None
            data[k] = out
        else:
            return None
    return with_meta(type(node), data, node._meta)


def _row_pairs(node: Node, value: Node, same_device: bool, leaves: list[torch.Tensor], values: list[Any]) -> bool:
    """Append the leaves of ``node`` and ``value`` pairwise, in leaf order; False as soon as the keys
    differ at a level or a value is not a tensor of its leaf's dtype, device and row shape (no cast,
    no broadcast), or a leaf is not contiguous."""
    if node._meta[0] != value._meta[0]:
        return False
    for leaf, v in zip(node._data.values(), value._data.values()):
        if isinstance(leaf, Node):
            if not (isinstance(v, Node) and _row_pairs(leaf, v, same_device, leaves, values)):
                return False
        elif (
            isinstance(v, torch.Tensor)
            and v.dtype == leaf.dtype
            and (same_device or v.device == leaf.device)
            and v.shape == leaf.shape[1:]
            and leaf.is_contiguous()
        ):
            leaves.append(leaf)
            values.append(v)
        else:
            return False
    return True


def _row_writes(node: Node, index: int, value: Node) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """The fast path of ``set_`` of one row (an int index) from a node: ``(rows, values)`` for one
    ``copy_`` per leaf when every check passes at once, else None (``_pairs`` then checks, and
    raises, leaf by leaf). Checked here: the index in range, the value's batch size, keys and leaves
    (:func:`_row_pairs`), every leaf writable; the values read before the first write."""
    batch = node._meta[1]
    if not batch or not -batch[0] <= index < batch[0] or value._meta[1] != batch[1:]:
        return None
    device = node._meta[2]
    leaves: list[torch.Tensor] = []
    values: list[Any] = []
    if not _row_pairs(node, value, device is not None and value._meta[2] == device, leaves, values):
        return None
    if not leaves or not targets_writable(leaves, foreach=False):  # (torch._foreach_* refuse empty lists)
        return None
    return [leaf[index] for leaf in leaves], read_first(values, leaves)


def scatter_(node: NodeT, index: Any, value: Any) -> NodeT:
    """Write ``value`` into ``node``'s leaves at ``index`` in place and return ``node`` itself (tags kept).

    Not under :func:`tag_rule`: the result is the input object, not a new node
    (the rule would intersect with an untagged value's tags). Allowed on Locked nodes.
    The checks and the casting rule are ``update_``'s: every value, leaf and index
    is checked and every value read before the first write, so a refused call
    writes nothing and ``td.at[0].set_(swapped)`` swaps.

    Raises:
        WriteError: a value does not fit its entry (shape: ``WriteShapeError``, dtype or type:
            ``WriteTypeError``), a leaf cannot be written, or the index does not fit the batch
            dims (``WriteIndexError``); nothing was written.
        KeyMismatchError: a node value with other keys.
    """
    leaf_kinds_writable("at[...].set_", node)  # every leaf is written at the index
    if type(index) is int and isinstance(value, Node):
        rows = _row_writes(node, index, value)
        if rows is not None:
            foreach(torch._foreach_copy_)(*rows)
            return node
    leaves, _, leaf_index, values = _pairs(node, index, value, "at[...].set_", inplace=True)
    if isinstance(value, Node):  # (a tensor or number value was read in _pairs)
        values = read_first(values, leaves)
    advanced = _advanced(leaf_index)
    for leaf, v in zip(leaves, values):
        _write(leaf, leaf_index, v, advanced)
    return node


class AtIndex(Generic[NodeT]):
    """``td.at[idx]``: ``get()`` is ``td[idx]``, ``set(v)`` a new node, ``set_(v)`` an in-place write."""

    __slots__ = ("_node", "_index")

    def __init__(self, node: NodeT, index: Any) -> None:
        self._node = node
        self._index = index

    def get(self) -> NodeT:
        """``td[idx]``: the node indexed over its batch dims (views keep tags; see ``TensorDict.__getitem__``)."""
        return getitem(self._node, self._index)

    def set(self, value: Any) -> NodeT:
        """A new node equal to ``td`` with ``value`` written at ``idx`` of the batch dims; ``td`` is untouched.

        Args:
            value: a node with ``td``'s keys and ``td[idx].batch_size``; or a tensor aligned with
                the batch dims (broadcasting to ``td[idx].batch_size``) or a number, for every leaf.

        Returns:
            A new node (its leaves are new storage, so tags are dropped).

        Raises:
            LockedError: ``td`` (or a sub-node) is Locked.
            WriteIndexError: ``idx`` does not fit the batch dims.
            WriteShapeError: ``value``'s batch size or shape does not fit ``td[idx]``.
            WriteTypeError: ``value`` is of another type, or a dtype that does not cast to a leaf's.
            KeyMismatchError: ``value`` is a node with other keys.
        """
        return scatter(self._node, self._index, value)

    def set_(self, value: Any) -> NodeT:
        """Write ``value`` at ``idx`` of the batch dims into ``td``'s leaves, in place; works on Locked nodes.

        Args:
            value: as in :meth:`set`; numbers must fit each leaf's dtype kind and range, as in ``update_``.

        Returns:
            ``td`` itself (same object, tags kept).

        Raises:
            WriteError: as :meth:`set` (its subclasses WriteIndexError, WriteShapeError,
                WriteTypeError), or a leaf cannot be written; nothing was written.
            KeyMismatchError: ``value`` is a node with other keys.
        """
        return scatter_(self._node, self._index, value)


class At(Generic[NodeT]):
    """``td.at``: index it (``td.at[idx]``) for the scatter operations."""

    __slots__ = ("_node",)

    def __init__(self, node: NodeT) -> None:
        self._node = node

    def __getitem__(self, index: Any) -> AtIndex[NodeT]:
        """The scatter operations at ``index`` (any index ``td[index]`` takes over the batch dims)."""
        return AtIndex(self._node, index)
