"""``assert_equal`` and ``assert_close`` for nodes: the message names the differing key."""

from __future__ import annotations

from typing import Any

import torch

from .._base import Node
from .._keys import display

__all__ = ["assert_equal", "assert_close"]


def _compare(a: Any, b: Any, path: tuple[str, ...], rtol: float, atol: float, check_tags: bool) -> None:
    where = f"at {display(path)!r}" if path else "at the root"
    if isinstance(a, Node) or isinstance(b, Node):
        if not (isinstance(a, Node) and isinstance(b, Node)):
            raise AssertionError(f"{where}: one side is a node, the other a {type(b if isinstance(a, Node) else a).__name__}")
        if check_tags and type(a) is not type(b):
            raise AssertionError(f"{where}: types differ: {type(a).__name__} vs {type(b).__name__}")
        if a._meta[0] != b._meta[0]:
            raise AssertionError(f"{where}: keys differ: {list(a._meta[0])} vs {list(b._meta[0])}")
        if a._meta[1] != b._meta[1]:
            raise AssertionError(f"{where}: batch_size differs: {tuple(a._meta[1])} vs {tuple(b._meta[1])}")
        if a._meta[2] != b._meta[2]:
            raise AssertionError(f"{where}: device differs: {a._meta[2]} vs {b._meta[2]}")
        for k in a._meta[0]:
            _compare(a._data[k], b._data[k], (*path, k), rtol, atol, check_tags)
        return
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise AssertionError(f"{where}: expected tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise AssertionError(
            f"{where}: tensors differ in shape, dtype or device: "
            f"{tuple(a.shape)} {a.dtype} {a.device} vs {tuple(b.shape)} {b.dtype} {b.device}"
        )
    try:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as err:
        raise AssertionError(f"{where}: values differ: {err}") from None


def assert_equal(a: Any, b: Any, *, check_tags: bool = True) -> None:
    """Raise AssertionError naming the first key where ``a`` and ``b`` differ (exact values, NaN == NaN)."""
    _compare(a, b, (), 0.0, 0.0, check_tags)


def assert_close(a: Any, b: Any, *, rtol: float = 1.3e-6, atol: float = 1e-5, check_tags: bool = True) -> None:
    """Like :func:`assert_equal` with a tolerance on floating values."""
    _compare(a, b, (), rtol, atol, check_tags)
