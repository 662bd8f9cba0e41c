"""Leaf values for the strategies: ordinary and special elements per dtype, made from a seed.

Values come from a drawn seed through a torch Generator, so hypothesis shrinks
over structure (keys, shapes, dtypes, tags) rather than over every element.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["DEFAULT_DTYPES", "ALL_DTYPES", "SPECIAL_RATES", "ELEMENTS", "values", "available_devices"]

DEFAULT_DTYPES = (torch.float32, torch.int64, torch.bool)
ALL_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.int8,
    torch.uint8,
    torch.int64,
    torch.bool,
)
ELEMENTS = ("normal", "special")
# the share of a leaf's elements replaced by special values under elements="special" (drawn per leaf)
SPECIAL_RATES = (0.0, 0.2, 0.5, 1.0)


def available_devices() -> tuple[torch.device, ...]:
    """The CPU, and each CUDA device when CUDA is available: the ``devices=`` that reaches every device here.

    Returns:
        A tuple of ``torch.device``, the CPU first.
    """
    cuda = tuple(torch.device("cuda", i) for i in range(torch.cuda.device_count())) if torch.cuda.is_available() else ()
    return (torch.device("cpu"), *cuda)


def _specials(dtype: torch.dtype) -> Sequence[complex | float | int | bool]:
    """The values of ``dtype`` where arithmetic goes wrong: NaN, infinities, -0.0, subnormals, the extremes."""
    if dtype == torch.bool:
        return [True, False]
    if dtype.is_complex:
        real = _specials(torch.float32 if dtype == torch.complex64 else torch.float64)
        return [complex(r, i) for r, i in zip(real, reversed(real))]
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        tiny = info.smallest_normal
        return [math.nan, math.inf, -math.inf, -0.0, 0.0, tiny / 2, -tiny / 2, tiny, info.max, info.min, info.eps]
    iinfo = torch.iinfo(dtype)
    extremes: set[int] = {iinfo.min, iinfo.max, 0, 1, iinfo.max - 1} | ({-1, iinfo.min + 1} if iinfo.min < 0 else set())
    return sorted(extremes)


def values(shape: tuple[int, ...], dtype: torch.dtype, seed: int, special_rate: float = 0.0) -> torch.Tensor:
    """A contiguous CPU tensor of ``shape`` and ``dtype`` made from ``seed``; ``special_rate`` of its
    elements (at positions the seed picks) are special values of the dtype."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.rand(shape, generator=gen) > 0.5
    elif dtype.is_floating_point or dtype.is_complex:
        t = torch.randn(shape, generator=gen, dtype=dtype)
    else:
        low = -50 if dtype.is_signed else 0
        t = torch.randint(low, 50, shape, generator=gen, dtype=dtype)
    if special_rate <= 0 or t.numel() == 0:
        return t
    pool = torch.tensor(_specials(dtype), dtype=dtype)
    pick = torch.randint(len(pool), shape, generator=gen)
    mask = torch.rand(shape, generator=gen) < special_rate
    return torch.where(mask, pool[pick], t)
