"""Indexing over the batch dims: ``td[idx]``.

An index is normalized once per call into the index every leaf gets and the
result's batch size, computed by arithmetic with torch's rules (ints select
first; index tensors broadcast together and their result dims stay in place
when they are adjacent, else they lead). The leaf index covers exactly the
root's batch dims, so feature dims and a sub-node's extra batch dims are never
indexed: ``...`` expands over the batch dims only. A bool mask becomes long
indices once (``nonzero``) instead of once per leaf.

Tags follow the rule: basic indexing (ints, slices, None, ``...``) returns
views and keeps them; index tensors and masks copy and drop them. The scatter
``td.at[idx]`` is in ``_scatter``.
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import NodeT
from ._maps import rebuild
from ._tags import tag_rule
from .errors import BatchDimError

__all__ = ["normalize", "getitem"]


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
