"""Hypothesis strategies for nodes, keys and batch sizes.

Tensor values come from a drawn seed through a torch Generator, so hypothesis
shrinks over structure (keys, shapes, dtypes) rather than over every element.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from .._node import TensorDict

__all__ = ["batch_sizes", "nested_keys", "tensordicts", "DEFAULT_DTYPES"]

DEFAULT_DTYPES = (torch.float32, torch.int64, torch.bool)
_NAMES = st.text(alphabet="abcdefgh", min_size=1, max_size=3)


def batch_sizes(min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4) -> st.SearchStrategy[torch.Size]:
    """Batch sizes of ``min_dims`` to ``max_dims`` dims, each of ``min_side`` to ``max_side``."""
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(torch.Size)


def nested_keys(max_depth: int = 3, names: st.SearchStrategy[str] = _NAMES) -> st.SearchStrategy[Any]:
    """Keys: a str, or a tuple of 1 to ``max_depth`` str."""
    return st.one_of(names, st.lists(names, min_size=1, max_size=max_depth).map(tuple))


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int, noncontiguous: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    make_shape = tuple(reversed(shape)) if noncontiguous else shape
    if dtype == torch.bool:
        t = torch.rand(make_shape, generator=gen) > 0.5
    elif dtype.is_floating_point or dtype.is_complex:
        t = torch.randn(make_shape, generator=gen, dtype=dtype)
    else:
        t = torch.randint(-50 if dtype.is_signed else 0, 50, make_shape, generator=gen, dtype=dtype)
    return t.permute(tuple(reversed(range(len(shape))))) if noncontiguous else t


@st.composite
def _node(
    draw: st.DrawFn,
    batch_size: torch.Size,
    depth: int,
    max_keys: int,
    dtypes: tuple[torch.dtype, ...],
    names: st.SearchStrategy[str],
    extra_batch_dims: bool,
    noncontiguous: bool,
    min_keys: int,
) -> TensorDict:
    keys = draw(st.lists(names, min_size=min_keys, max_size=max_keys, unique=True))
    data: dict[str, Any] = {}
    for key in keys:
        if depth > 0 and draw(st.booleans()):
            sub_batch = batch_size
            if extra_batch_dims:
                sub_batch = torch.Size((*batch_size, *draw(st.lists(st.integers(0, 3), max_size=1))))
            data[key] = draw(
                _node(sub_batch, depth - 1, max_keys, dtypes, names, extra_batch_dims, noncontiguous, 0)
            )
        else:
            feature = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
            dtype = draw(st.sampled_from(dtypes))
            seed = draw(st.integers(0, 2**31 - 1))
            bent = noncontiguous and draw(st.booleans())
            data[key] = _tensor((*batch_size, *feature), dtype, seed, bent)
    return TensorDict(data, batch_size)


def tensordicts(
    batch_size: torch.Size | tuple[int, ...] | st.SearchStrategy[torch.Size] | None = None,
    *,
    max_depth: int = 2,
    max_keys: int = 4,
    min_keys: int = 0,
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES,
    names: st.SearchStrategy[str] = _NAMES,
    extra_batch_dims: bool = False,
    noncontiguous: bool = False,
) -> st.SearchStrategy[TensorDict]:
    """Untagged nodes on the CPU.

    Args:
        batch_size: a fixed batch size or a strategy of them (default: :func:`batch_sizes`).
        max_depth: how deep sub-nodes may nest.
        max_keys / min_keys: entries per node (``min_keys`` applies to the root).
        dtypes: the leaf dtypes to draw from.
        names: the strategy for key parts.
        extra_batch_dims: let sub-nodes have more batch dims than their parent.
        noncontiguous: let leaves be non-contiguous (permuted) views.
    """
    if batch_size is None:
        sizes: st.SearchStrategy[torch.Size] = batch_sizes()
    elif isinstance(batch_size, st.SearchStrategy):
        sizes = batch_size
    else:
        sizes = st.just(torch.Size(batch_size))
    return sizes.flatmap(
        lambda bs: _node(bs, max_depth, max_keys, dtypes, names, extra_batch_dims, noncontiguous, min_keys)
    )
