"""Indexing over the batch dims (``td[idx]``) and the scatter ``td.at[idx].set(value)`` / ``.set_(value)``.

An index is normalized once per call into the index every leaf gets and the
result's batch size, computed by arithmetic with torch's rules (ints select
first; index tensors broadcast together and their result dims stay in place
when they are adjacent, else they lead). The leaf index covers exactly the
root's batch dims, so feature dims and a sub-node's extra batch dims are never
indexed: ``...`` expands over the batch dims only. A bool mask becomes long
indices once (``nonzero``) instead of once per leaf.

Tags follow the rule: basic indexing (ints, slices, None, ``...``) returns
views and keeps them; index tensors and masks copy and drop them.
"""

from __future__ import annotations

from typing import Any, Generic

import torch

from ._base import Node, NodeT, with_meta
from ._foreach import foreach
from ._inplace import (
    broadcasts,
    cast,
    check_number,
    checked,
    each_writable,
    read_first,
    refuse_kinds,
    same_device,
    targets_writable,
)
from ._keyops import check_unlocked_tree
from ._keys import as_path, display
from ._lookup import walk, walk_keys
from ._maps import flat, rebuild, unflat
from ._tags import Locked, tag_rule
from .errors import BatchDimError, KeyMismatchError, WriteError, WriteIndexError, WriteShapeError, WriteTypeError

__all__ = ["normalize", "getitem", "scatter", "scatter_", "At", "AtIndex"]


def _mixed(index: tuple) -> TypeError:
    return TypeError(
        f"td[{', '.join(map(repr, index))}] mixes a key with a batch index: index and look up separately, "
        "e.g. td['a'][0] or td[0]['a']"
    )


def _item(item: Any, index: tuple) -> Any:
    """One part of an index in the form the arithmetic reads: int, slice, None, ..., or a tensor."""
    if isinstance(item, torch.Tensor):
        if item.dtype == torch.uint8 or (item.dtype == torch.bool and item.dim() == 0):
            # torch reads both as masks that add a dim (uint8 with a deprecation warning): refused, as a
            # Python bool is, rather than modelled
            raise TypeError(
                f"a {'uint8' if item.dtype == torch.uint8 else '0-dim bool'} tensor index is not supported: "
                "use a bool tensor mask over batch dims, None to add a dim, or a long tensor of positions"
            )
        return item
    if item is None or item is Ellipsis or type(item) is slice:
        return item
    if type(item) is bool:
        raise TypeError(f"a bool index ({item}) is not supported: use None to add a dim, or a bool tensor mask")
    if type(item) is int:
        return item
    if type(item) is str or type(item) is tuple:
        raise _mixed(index)
    if type(item) is range:
        return torch.arange(item.start, item.stop, item.step)  # the ints of list(item), half the cost
    if type(item) is list:
        return torch.tensor(item) if item else torch.zeros(0, dtype=torch.long)
    if hasattr(item, "__index__"):
        return item.__index__()
    raise TypeError(
        f"unsupported index {item!r} of type {type(item).__name__}: use int, slice, None, ..., "
        "a list or range of ints, or a long or bool tensor"
    )


def _consumed(item: Any) -> int:
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, torch.Tensor) and item.dtype == torch.bool:
        return item.dim()
    return 1


def normalize(batch: torch.Size, index: Any) -> tuple[tuple[Any, ...], torch.Size]:
    """The index every leaf gets and the batch size of the result, for ``index`` over ``batch``.

    Raises:
        BatchDimError: more indices than batch dims, an int out of range, or a
            mask whose shape does not match the batch dims it covers.
        TypeError: a key mixed with an index, or an unsupported index type.
    """
    # the common indices (None, ..., an int, a positive slice, one index tensor or list, a tuple of
    # them but lists, a mask over the leading dims) skip the general normalization
    if index is None:
        return (None,), torch.Size((1, *batch))
    if index is Ellipsis:
        return (index,), batch
    if type(index) is tuple:
        plain = _plain(batch, index)
        if plain is not None:
            return plain
    if batch:
        if type(index) is int and -batch[0] <= index < batch[0]:
            return (index,), batch[1:]
        if type(index) is slice and (index.step is None or index.step > 0):
            return (index,), torch.Size((len(range(*index.indices(batch[0]))), *batch[1:]))
        if type(index) is list or type(index) is range:
            index = _item(index, (index,))
        if isinstance(index, torch.Tensor):
            dtype = index.dtype
            if dtype != torch.bool and dtype != torch.uint8:  # uint8: refused by the general path
                # a 0-dim tensor of ints selects like an int (torch's rule): shape () adds no dim
                return (index,), torch.Size((*index.shape, *batch[1:]))
            k = index.dim()
            if dtype == torch.bool and k and index.shape == batch[:k]:
                # a mask over the leading batch dims: one nonzero() indexes every leaf, and the masked dims
                # become one dim of the count of True
                parts = index.nonzero(as_tuple=True)
                return parts, torch.Size((len(parts[0]), *batch[k:]))
    raw = index if type(index) is tuple else (index,)
    items = [_item(i, raw) for i in raw]
    n = len(batch)
    used = sum(_consumed(i) for i in items)
    ellipses = sum(1 for i in items if i is Ellipsis)
    if ellipses > 1:
        raise BatchDimError("an index can only have a single ellipsis ('...')")
    if used > n:
        raise BatchDimError(
            f"too many indices: {used} batch dims indexed, but the node has batch_size {tuple(batch)} "
            f"({n} batch dims); feature dims cannot be indexed: index a leaf, e.g. td['key'][...]"
        )
    leaf: list[Any] = []
    kept: list[Any] = []  # after ints select: ("dim", size) or ("adv", index tensor)
    dim = 0
    for item in items:
        if item is Ellipsis:
            for _ in range(n - used):
                leaf.append(slice(None))
                kept.append(batch[dim])
                dim += 1
        elif item is None:
            leaf.append(None)
            kept.append(1)
        elif type(item) is int:
            size = batch[dim]
            if not -size <= item < size:
                raise BatchDimError(
                    f"index {item} is out of range for batch dim {dim} of size {size} (batch_size {tuple(batch)})"
                )
            leaf.append(item)
            dim += 1
        elif type(item) is slice:
            if item.step is not None and item.step <= 0:
                raise ValueError(f"slice step must be positive, got {item.step} (batch dim {dim})")
            leaf.append(item)
            kept.append(len(range(*item.indices(batch[dim]))))
            dim += 1
        elif item.dtype == torch.bool:
            k = item.dim()
            if tuple(item.shape) != tuple(batch[dim : dim + k]):
                raise BatchDimError(
                    f"the mask of shape {tuple(item.shape)} does not match batch dims {dim}..{dim + k - 1} "
                    f"of batch_size {tuple(batch)}"
                )
            for part in item.nonzero(as_tuple=True) if k else ():
                leaf.append(part)
                kept.append(part)
            dim += k
        else:
            leaf.append(item)
            if item.dim():
                kept.append(item)
            # else a 0-dim tensor of ints: torch selects with it as with an int (before the index tensors
            # are paired), so it keeps no dim and takes no part in where their dims go; torch checks its range
            dim += 1
    kept.extend(batch[dim:])
    return tuple(leaf), _result_size(kept)


def _plain(batch: torch.Size, index: tuple) -> tuple[tuple[Any, ...], torch.Size] | None:
    """The leaf index and result batch size for a tuple of in-range ints, positive slices, None, one
    ``...`` and index tensors (not masks); None for anything else (the general path, which also raises
    the errors)."""
    n = len(batch)
    kept: list[int] = []  # the result's dims other than the index tensors' own
    at: list[int] = []  # for each index tensor, where in ``kept`` its dims would go
    shapes: list[torch.Size] = []
    dim = 0
    for item in index:
        if item is None:
            kept.append(1)
            continue
        if item is Ellipsis:
            return _spread(batch, index)
        if dim == n:
            return None
        size = batch[dim]
        if type(item) is int:
            if not -size <= item < size:
                return None
        elif type(item) is slice:
            if item.step is not None and item.step <= 0:
                return None
            kept.append(len(range(*item.indices(size))))
        elif isinstance(item, torch.Tensor) and item.dtype not in _MASKS:
            if item.dim():  # a 0-dim index tensor selects as an int does: no dim, no part in where they go
                at.append(len(kept))
                shapes.append(item.shape)
        else:
            return None
        dim += 1
    if dim < n:
        kept.extend(batch[dim:])
    if at:
        # adjacent index tensors put their broadcast dims where they stand, separated ones lead
        where = at[0] if at[0] == at[-1] else 0
        kept[where:where] = _broadcast_shapes(shapes)
    return index, torch.Size(kept)


def _spread(batch: torch.Size, index: tuple) -> tuple[tuple[Any, ...], torch.Size] | None:
    """:func:`_plain` of ``index`` with its ``...`` replaced by the slices of the batch dims it spans (a
    leaf's own ``...`` would reach its feature dims); None for a second ``...``."""
    pos = -1
    taken = 0  # every item but None takes a batch dim, or is one _plain refuses
    for i, item in enumerate(index):
        if item is Ellipsis:
            if pos >= 0:
                return None
            pos = i
        elif item is not None:
            taken += 1
    if taken > len(batch):
        return None
    return _plain(batch, (*index[:pos], *(slice(None),) * (len(batch) - taken), *index[pos + 1 :]))


# torch reads a bool tensor index as a mask (uint8 too, deprecated): the general path takes them
_MASKS = (torch.bool, torch.uint8)


def _broadcast_shapes(shapes: list[torch.Size]) -> tuple[int, ...]:
    """``torch.broadcast_shapes(*shapes)`` by arithmetic: torch's costs ~14 us a call in Python."""
    if shapes.count(shapes[0]) == len(shapes):
        return shapes[0]
    out = [1] * max(map(len, shapes))
    for shape in shapes:
        for i, s in enumerate(shape, len(out) - len(shape)):
            if s != 1:
                if out[i] == 1:
                    out[i] = s
                elif out[i] != s:
                    # torch's own getitem raises an IndexError here (torch.broadcast_shapes a RuntimeError)
                    raise BatchDimError(
                        "shape mismatch: index tensors could not be broadcast together with shapes "
                        + ", ".join(str(list(x)) for x in shapes)
                    )
    return tuple(out)


def _result_size(kept: list[Any]) -> torch.Size:
    where = [i for i, k in enumerate(kept) if isinstance(k, torch.Tensor)]
    if not where:
        return torch.Size(kept)
    shape = _broadcast_shapes([kept[i].shape for i in where])
    rest = [k for k in kept if not isinstance(k, torch.Tensor)]
    if where[-1] - where[0] + 1 == len(where):
        at = where[0]
        return torch.Size((*rest[:at], *shape, *rest[at:]))
    return torch.Size((*shape, *rest))


@tag_rule
def getitem(node: NodeT, index: Any) -> NodeT:
    """``node[index]`` over the batch dims, as torch indexes a tensor; tags kept when leaves are views."""
    leaf_index, new = normalize(node._meta[1], index)
    if len(leaf_index) == 1:
        one = leaf_index[0]
        if isinstance(one, torch.Tensor) and one.dim() == 1 and one.dtype in _ROW_DTYPES:
            return _rows(node, one, new)
        return rebuild(node, lambda x: x[one], new)
    return rebuild(node, lambda x: x[leaf_index], new)


_ROW_DTYPES = (torch.int64, torch.int32)
# elements per row from which a leaf's rows are copied whole (index_select) rather than gathered
# element by element (advanced indexing computes an offset per element)
_WHOLE_ROWS = 32


def _rows(node: NodeT, positions: torch.Tensor, new: torch.Size) -> NodeT:
    """``node[positions]`` for a 1-d tensor of positions along the first batch dim (a batch of rows, a
    mask's nonzero). Negative positions count from the end, as torch's indexing does: index_select
    does not, so they are made positive, once, for the first leaf with rows long enough to copy whole."""
    size = node._meta[1][0]
    made: list[torch.Tensor] = []

    def take(x: torch.Tensor) -> torch.Tensor:
        if size == 0 or x.numel() < _WHOLE_ROWS * size:
            return x[positions]
        if not made:
            made.append(torch.where(positions < 0, positions + size, positions))
        whole = made[0]
        return x.index_select(0, whole if whole.device == x.device else whole.to(x.device))

    return rebuild(node, take, new)


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
