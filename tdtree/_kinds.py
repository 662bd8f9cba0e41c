"""Leaves of a kind a node's operations are not made for: sparse, nested, quantized and mkldnn tensors.

A node's operations are made for strided tensors. The constructor does not check a leaf's kind
(telling the kinds apart costs a tensor getter or two a leaf, a large part of creating one), and
neither do the operations: :func:`refuse` is called only in the ``except`` path of a leaf walk or an
operation, where torch already failed, so strided leaves pay nothing (a ``try`` block costs nothing
until something raises). It turns torch's error on such a leaf into a :class:`~tdtree.errors.LeafError`
naming the key, the kind and the conversion, with torch's error chained; any other failure is left
to the caller to re-raise as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ._keys import NestedKey
from .errors import LeafError

__all__ = ["kind", "odd", "error", "refuse"]

# the errors torch raises for an operation a tensor's kind does not implement (NotImplementedError
# is a RuntimeError; a nested tensor's symbolic sizes raise ValueError); tdtree's own named errors and
# errors of other types stay as they are
_TORCH_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


def kind(value: Any) -> tuple[str, str] | None:
    """``(what value is, how to convert it)`` for a sparse, nested, quantized or mkldnn tensor;
    None for anything else (a strided tensor of any dtype or device, a number, a node)."""
    if not isinstance(value, torch.Tensor):
        return None
    layout = value.layout
    if value.is_nested:
        return f"a nested tensor (layout {layout})", "torch.nested.to_padded_tensor(value, padding)"
    if layout is not torch.strided:
        return f"a {layout} tensor", "value.to_dense()"
    if value.is_quantized:
        return f"a quantized {value.dtype} tensor", "value.dequantize()"
    return None


def odd(values: Iterable[Any]) -> bool:
    """Whether any of ``values`` is of a kind :func:`kind` names."""
    return any(kind(v) is not None for v in values)


def error(op: str, key: NestedKey, value: Any, why: str) -> LeafError | None:
    """The LeafError of ``op`` (named in the message when not empty) for the leaf ``value`` at ``key``,
    which ``op`` cannot take because of ``why`` (torch's words), naming its kind and conversion; None
    when ``value`` is not of a kind :func:`kind` names."""
    found = kind(value)
    if found is None:
        return None
    what, conversion = found
    return LeafError(
        f"{op + ': ' if op else ''}leaf {key!r} is {what}, which this operation cannot take ({why}); a node's "
        f"operations are made for strided tensors: convert it first with {conversion}"
    )


def refuse(op: str, key: NestedKey, row: Iterable[Any], exc: BaseException) -> None:
    """In the ``except`` path of ``op`` failing with ``exc`` on the leaf at ``key``, whose call took the
    values ``row`` (the leaf, the leaves paired with it, other arguments; a list or tuple of tensors
    among them is looked into): raise :func:`error` from ``exc`` for the first value of a kind
    :func:`kind` names. Returns when none is, or ``exc`` is not a torch error: the caller re-raises
    ``exc``."""
    if not isinstance(exc, _TORCH_ERRORS) or type(exc).__module__ == LeafError.__module__:
        return
    said = str(exc).strip().splitlines()
    why = f"torch: {said[0] if said else type(exc).__name__}"
    for value in row:
        for v in value if isinstance(value, (list, tuple)) else (value,):
            found = error(op, key, v, why)
            if found is not None:
                raise found from exc
