"""Nodes and tensorclasses as map-style datasets, and minibatches without a DataLoader.

A node is a Mapping: ``len(td)`` counts its keys and iteration walks them, as
for a dict. Its rows become a dataset through an explicit view,
:class:`TensorDictDataset` (``td.as_dataset()``), whose length is the first
batch dim. A tensorclass is a record, not a Mapping: it is a dataset itself
(its ``len`` is its first batch dim), as in tensordict.

Both read a batch in one index operation (``__getitems__``, which torch's
``DataLoader`` calls with the batch's list of indices), and importing this
module adds nodes and tensorclasses to torch's ``default_collate`` table
(:data:`tdtree._torch_private.default_collate_fn_map`): a batch read in one
operation is returned as is, a list of rows (from a dataset that reads them
one by one) is stacked with ``tdtree.stack``. So a ``DataLoader`` gives a node
(an instance) per batch with the default ``collate_fn`` as with
``collate_fn=lambda x: x``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch
import torch.utils.data

from ._base import Holder, Node
from ._combine import stack
from ._torch_private import default_collate_fn_map

__all__ = ["TensorDictDataset", "Minibatches", "minibatches", "rows", "not_a_dataset", "collate"]

T = TypeVar("T")


def rows(data: Any) -> int:
    """The first batch dim of a node or tensorclass instance: its number of rows as a dataset.

    Raises:
        TypeError: ``data`` is neither, or has no batch dims (as ``len`` of a 0-d tensor).
    """
    name = type(data).__name__
    if isinstance(data, Holder):
        data = data._td
    elif not isinstance(data, Node):
        raise TypeError(f"expected a TensorDict or a tensorclass instance, got {name}")
    batch = data._meta[1]
    if not batch:
        raise TypeError(f"a {name} with no batch dims has no rows: a dataset's rows are its first batch dim")
    return batch[0]


def not_a_dataset(node: Node) -> TypeError:
    """The error of a node handed to torch as a dataset (``DataLoader(td)``, ``Subset(td, ...)``)."""
    return TypeError(
        f"a {type(node).__name__} is a mapping: len(td) counts its {len(node._data)} keys, not its rows. "
        "Pass td.as_dataset() to DataLoader (a dataset of the rows of the first batch dim), or iterate "
        "tdtree.data.minibatches(td, batch_size)"
    )


class TensorDictDataset(torch.utils.data.Dataset[T]):
    """The rows of a node (or tensorclass instance) along its first batch dim, as a map-style dataset.

    ``len(ds)`` is the first batch dim, ``ds[i]`` is ``data[i]`` (a view of row ``i``; tags kept as
    indexing keeps them), ``ds.__getitems__(indices)`` is ``data[indices]``: the whole batch in one
    index operation, a new node (new storage: untagged). ``torch.utils.data.DataLoader(ds, batch_size=64)``
    yields one node per batch, with the default ``collate_fn`` or ``collate_fn=lambda x: x``. The data is
    held, not copied; a Memmap node mapped ``"r+"`` or ``"r"`` stays file-backed (in worker processes too:
    it pickles by reference); a copy-on-write one reaches workers by value.

    Args:
        data: a TensorDict or tensorclass instance with at least one batch dim.

    Raises:
        TypeError: ``data`` is neither, or has no batch dims.

    >>> import torch, tdtree as tt
    >>> from torch.utils.data import DataLoader
    >>> td = tt.TensorDict({"x": torch.arange(10.0), "y": torch.arange(10) % 2}, batch_size=[10])
    >>> len(td), len(td.as_dataset())
    (2, 10)
    >>> [b.batch_size[0] for b in DataLoader(td.as_dataset(), batch_size=4)]
    [4, 4, 2]
    """

    def __init__(self, data: T) -> None:
        self._len = rows(data)
        self.data = data

    def __len__(self) -> int:
        """The first batch dim of the data."""
        return self._len

    def __getitem__(self, index: Any) -> T:
        """``data[index]``: a row for an int (a view, tags kept)."""
        return self.data[index]  # type: ignore[index, no-any-return]

    def __getitems__(self, indices: Sequence[int]) -> T:
        """``data[indices]``: the batch of rows ``indices`` in one index operation (new storage, untagged)."""
        return self.data[indices]  # type: ignore[index, no-any-return]

    def __repr__(self) -> str:
        return f"TensorDictDataset(rows={self._len}, data={type(self.data).__name__})"


class Minibatches(Generic[T]):
    """The batches of :func:`minibatches`: iterable any number of times (a new order each time when
    shuffled), with ``len`` the number of batches, as a DataLoader."""

    __slots__ = ("data", "batch_size", "shuffle", "generator", "drop_last", "_rows")

    def __init__(
        self, data: T, batch_size: int, shuffle: bool, generator: torch.Generator | None, drop_last: bool
    ) -> None:
        if type(batch_size) is not int or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer, got {batch_size!r}")
        self._rows = rows(data)
        self.data = data
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.generator = generator
        self.drop_last = drop_last

    def __len__(self) -> int:
        """The number of batches one pass yields."""
        if self.drop_last:
            return self._rows // self.batch_size
        return -(-self._rows // self.batch_size)

    def __iter__(self) -> Iterator[T]:
        """One pass over the rows: a new permutation when shuffled, one index operation per batch."""
        data: Any = self.data
        size = self.batch_size
        stop = self._rows - self._rows % size if self.drop_last else self._rows
        if not self.shuffle:
            for start in range(0, stop, size):
                yield data[start : start + size]
            return
        order = torch.randperm(self._rows, generator=self.generator)
        device = data.device
        if device is not None and device != order.device:
            order = order.to(device)  # once per pass, not once per leaf and batch
        for start in range(0, stop, size):
            yield data[order[start : start + size]]


def minibatches(
    data: T, batch_size: int, shuffle: bool = True, generator: torch.Generator | None = None, drop_last: bool = False
) -> Minibatches[T]:
    """The rows of ``data`` (a node or tensorclass instance) along its first batch dim, in batches of
    ``batch_size``: a training loop's minibatches, with no DataLoader, sampler or collate.

    Shuffled, each pass draws ``torch.randperm(rows, generator=generator)``, the permutation torch's
    ``RandomSampler(dataset, generator=g)`` draws (a ``DataLoader(..., shuffle=True, generator=g)`` draws
    its workers' base seed from ``g`` first, so its order is another), and yields
    ``data[perm[i:i + batch_size]]``: one
    index operation per batch, new storage, untagged (a Memmap node's rows are read from its files
    into memory). Not shuffled, it yields ``data[i:i + batch_size]``: views, tags kept (a Memmap node's
    batches stay file-backed). The last batch is smaller unless ``drop_last``.

    Args:
        data: a TensorDict or tensorclass instance with at least one batch dim.
        batch_size: rows per batch, a positive int.
        shuffle: a new random order on every pass (the global RNG when ``generator`` is None).
        generator: the ``torch.Generator`` the permutation is drawn from.
        drop_last: leave out the last batch when it is smaller than ``batch_size``.

    Returns:
        An iterable of nodes (instances of ``data``'s class) that can be iterated again, once per
        epoch, with ``len`` the number of batches.

    Raises:
        TypeError: ``data`` is not a node or tensorclass instance, or has no batch dims.
        ValueError: ``batch_size`` is not a positive int.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"x": torch.arange(10)}, batch_size=[10])
    >>> batches = tt.data.minibatches(td, 4, generator=torch.Generator().manual_seed(0))
    >>> len(batches), sorted(torch.cat([b["x"] for b in batches]).tolist()) == list(range(10))
    (3, True)
    """
    return Minibatches(data, batch_size, shuffle, generator, drop_last)


def collate(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """torch's ``default_collate`` for nodes and tensorclass instances: a batch read in one index
    operation (by ``__getitems__``) as is, a list of rows stacked along a new first batch dim."""
    if isinstance(batch, (Node, Holder)):
        return batch
    return stack(list(batch))


default_collate_fn_map.setdefault(Node, collate)
default_collate_fn_map.setdefault(Holder, collate)
