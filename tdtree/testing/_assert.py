"""``assert_equal`` and ``assert_close`` for nodes, tensorclasses, tensors and containers of them.

A failure names the key path, both shapes or dtypes, how many elements differ,
and the first differing index with both values, as ``torch.testing.assert_close``
does for one tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import TensorClass, TensorDict

__all__ = ["assert_equal", "assert_close", "default_tolerances", "key_text"]

# torch.testing.assert_close's defaults (its documentation's table); other dtypes compare exactly
_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def default_tolerances(*dtypes: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` torch.testing uses for ``dtypes``: the loosest among them, 0 for exact dtypes."""
    found = [_TOLERANCES.get(d, (0.0, 0.0)) for d in dtypes]
    return max(r for r, _ in found), max(a for _, a in found)


def key_text(path: tuple[Any, ...]) -> str:
    """``path`` as the user spells it: ``'a'``, ``('next', 'reward')``, ``[1]['obs']`` for a container's item."""
    if not path:
        return "the root"
    keys: list[str] = []
    text = ""
    for part in path:
        if isinstance(part, str):
            keys.append(part)
            continue
        if keys:
            text += f"[{_keys(keys)}]"
            keys = []
        text += f"[{part!r}]"
    if keys:
        text += f"[{_keys(keys)}]" if text else _keys(keys)
    return f"key {text}"


def _keys(keys: list[str]) -> str:
    return repr(keys[0]) if len(keys) == 1 else repr(tuple(keys))


class _Options:
    __slots__ = ("rtol", "atol", "equal_nan", "tags", "batch_size", "device", "dtype")

    def __init__(
        self,
        rtol: float | None,
        atol: float | None,
        equal_nan: bool,
        tags: bool,
        batch_size: bool,
        device: bool,
        dtype: bool,
    ) -> None:
        self.rtol, self.atol, self.equal_nan = rtol, atol, equal_nan
        self.tags, self.batch_size, self.device, self.dtype = tags, batch_size, device, dtype


def _fail(path: tuple[Any, ...], what: str) -> AssertionError:
    where = key_text(path)
    return AssertionError(f"at {where}: {what}")


def _compare(a: Any, b: Any, path: tuple[Any, ...], opt: _Options) -> None:
    if isinstance(a, TensorClass) or isinstance(b, TensorClass):
        if type(a) is not type(b):
            raise _fail(path, f"types differ: {type(a).__name__} vs {type(b).__name__}")
        static_a = {f: getattr(a, f) for f in type(a)._fields if f not in a.to_node().keys()}
        static_b = {f: getattr(b, f) for f in type(b)._fields if f not in b.to_node().keys()}
        if static_a != static_b:
            raise _fail(path, f"static fields differ: {static_a} vs {static_b}")
        _compare(a.to_node(), b.to_node(), path, opt)
        return
    if isinstance(a, TensorDict) or isinstance(b, TensorDict):
        _compare_nodes(a, b, path, opt)
        return
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        _compare_tensors(a, b, path, opt)
        return
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise _fail(path, f"keys differ: {sorted(map(str, a))} vs {sorted(map(str, b))}")
        for k in a:
            _compare(a[k], b[k], (*path, k), opt)
        return
    if type(a) in (list, tuple) and type(a) is type(b):
        if len(a) != len(b):
            raise _fail(path, f"lengths differ: {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, (*path, i), opt)
        return
    if type(a) is not type(b) or a != b:
        raise _fail(path, f"{a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})")


def _compare_nodes(a: Any, b: Any, path: tuple[Any, ...], opt: _Options) -> None:
    # a plain dict on either side (expected values built with torch directly) compares keys and leaves only
    for side in (a, b):
        if not isinstance(side, (TensorDict, Mapping)):
            raise _fail(path, f"one side is a node, the other a {type(side).__name__}")
    if isinstance(a, TensorDict) and isinstance(b, TensorDict):
        if opt.tags and a.tags != b.tags:
            raise _fail(path, f"tags differ: {_tags(a)} vs {_tags(b)}")
        if opt.batch_size and a.batch_size != b.batch_size:
            raise _fail(path, f"batch_size differs: {tuple(a.batch_size)} vs {tuple(b.batch_size)}")
        if opt.device and a.device != b.device:
            raise _fail(path, f"device differs: {a.device} vs {b.device}")
    keys_a, keys_b = sorted(a.keys()), sorted(b.keys())
    if keys_a != keys_b:
        raise _fail(path, f"keys differ: {keys_a} vs {keys_b}")
    for k in keys_a:
        _compare(a[k], b[k], (*path, k), opt)


def _tags(node: TensorDict) -> str:
    return "{" + ", ".join(sorted(t.name for t in node.tags)) + "}"


def _compare_tensors(a: torch.Tensor, b: torch.Tensor, path: tuple[Any, ...], opt: _Options) -> None:
    if a.shape != b.shape:
        raise _fail(path, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)} ({a.dtype} vs {b.dtype})")
    if opt.dtype and a.dtype != b.dtype:
        raise _fail(path, f"dtypes differ: {a.dtype} vs {b.dtype} (shape {tuple(a.shape)})")
    if opt.device and a.device != b.device:
        raise _fail(path, f"devices differ: {a.device} vs {b.device} (shape {tuple(a.shape)}, {a.dtype})")
    if a.is_meta or b.is_meta:
        return  # no values to compare, as torch.testing does for meta tensors
    x, y = a.detach().cpu(), b.detach().cpu()
    if x.dtype != y.dtype:
        common = torch.promote_types(x.dtype, y.dtype)
        x, y = x.to(common), y.to(common)
    rtol, atol = default_tolerances(x.dtype)
    rtol = rtol if opt.rtol is None else opt.rtol
    atol = atol if opt.atol is None else opt.atol
    if x.dtype == torch.bool or not (x.is_floating_point() or x.is_complex()):
        close = x == y if (rtol == 0 and atol == 0) or x.dtype == torch.bool else torch.isclose(x, y, rtol, atol)
    else:
        close = torch.isclose(x, y, rtol, atol, equal_nan=opt.equal_nan)
    if bool(close.all()):
        return
    bad = (~close).nonzero()
    first = tuple(int(i) for i in bad[0])
    total = max(x.numel(), 1)
    tolerance = "exact" if rtol == 0 and atol == 0 else f"rtol={rtol:g}, atol={atol:g}"
    raise _fail(
        path,
        f"values differ ({tolerance}, equal_nan={opt.equal_nan}): {len(bad)} of {x.numel()} elements "
        f"({100 * len(bad) / total:.1f}%); first at index {first}: {x[first].item()!r} vs {y[first].item()!r}; "
        f"shape {tuple(a.shape)}, {a.dtype} vs {b.dtype}",
    )


def assert_equal(
    actual: Any,
    expected: Any,
    *,
    equal_nan: bool = True,
    check_tags: bool = True,
    check_batch_size: bool = True,
    check_device: bool = True,
    check_dtype: bool = True,
) -> None:
    """Raise AssertionError naming the first key where ``actual`` and ``expected`` differ; exact values.

    Compares nodes (keys, tags, batch size, device, leaves), tensorclasses
    (class, static fields, then as nodes), tensors, and lists, tuples and dicts
    of them; a plain dict on either side of a node compares keys and leaves
    only. ``equal_nan`` counts NaN equal to NaN (the default here, unlike
    torch.testing, so that a node compares equal to itself). The ``check_*``
    switches turn off one comparison each; with ``check_dtype=False`` values
    are compared after type promotion, with ``check_device=False`` on the CPU.

    Args:
        actual: a node, tensorclass, tensor, or a list, tuple or dict of them.
        expected: the same kind (a plain dict may stand for a node).
        equal_nan: NaN counts equal to NaN.
        check_tags, check_batch_size, check_device, check_dtype: compare each (all on by default).

    Returns:
        None, when they are equal.

    Raises:
        AssertionError: naming the first key where they differ and how.

    Example:
        >>> import torch, tdtree as tt
        >>> from tdtree.testing import assert_equal
        >>> a = tt.TensorDict({"x": {"y": torch.zeros(2)}}, [2])
        >>> assert_equal(a, a.apply(lambda t: t + torch.tensor([0.0, 1.0])))
        Traceback (most recent call last):
        AssertionError: at key ('x', 'y'): values differ (exact, equal_nan=True): 1 of 2 elements (50.0%); first at index (1,): 0.0 vs 1.0; shape (2,), torch.float32 vs torch.float32
    """
    _compare(
        actual, expected, (), _Options(0.0, 0.0, equal_nan, check_tags, check_batch_size, check_device, check_dtype)
    )


def assert_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    check_tags: bool = True,
    check_batch_size: bool = True,
    check_device: bool = True,
    check_dtype: bool = True,
) -> None:
    """Like :func:`assert_equal`, with ``|actual - expected| <= atol + rtol * |expected|`` for each value.

    ``rtol`` / ``atol`` default per dtype to torch.testing.assert_close's
    values (float32: 1.3e-6 / 1e-5; float64: 1e-7 / 1e-7; integers and bool:
    exact); give both to override.

    Args:
        actual: a node, tensorclass, tensor, or a list, tuple or dict of them.
        expected: the same kind (a plain dict may stand for a node).
        equal_nan: NaN counts equal to NaN.
        check_tags, check_batch_size, check_device, check_dtype: compare each (all on by default).
        rtol, atol: the tolerances (both or neither).

    Returns:
        None, when they are close.

    Raises:
        AssertionError: naming the first key where they differ and how.
        ValueError: only one of ``rtol`` / ``atol`` is given.

    >>> import torch, tdtree as tt
    >>> from tdtree.testing import assert_close
    >>> td = tt.TensorDict({"x": torch.ones(2)})
    >>> assert_close(td, td + 1e-7)
    """
    if (rtol is None) != (atol is None):
        raise ValueError("assert_close: give both rtol and atol, or neither (the dtype's defaults)")
    _compare(
        actual, expected, (), _Options(rtol, atol, equal_nan, check_tags, check_batch_size, check_device, check_dtype)
    )
