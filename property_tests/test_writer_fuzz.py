"""A fuzz of the in-place writers ``update_`` / ``copy_`` / ``at[idx].set_`` and the functional ``at[idx].set``.

Random nodes (leaves of bool, integer, float and complex dtypes, some of them lazy
conjugate or negative views or strided), random indices (int, slice, list, long
tensor, bool mask, None, ``...`` and tuples of them, in range or not) and random
values (tensors of every such dtype and of quantized dtypes, fitting shapes and
not, Python numbers in and out of range, nodes). Each call either writes fully,
and then equals the same writes done leaf by leaf with plain torch on clones
(a value cast to the leaf's dtype, as ``copy_`` and a basic index cast), or
raises a tdtree named error with the node unchanged: values and version counters.
Any other exception fails the test. ``COUNTS`` tallies the outcomes (read by a
local run with many examples).
"""

from __future__ import annotations

import collections
import warnings
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree.errors import KeyMismatchError, KeyNotFoundError, WriteError

from ._snapshot import assert_unchanged, snapshot

NAMED = (WriteError, KeyNotFoundError, KeyMismatchError)
LEAF_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64)
VALUE_DTYPES = (*LEAF_DTYPES, torch.complex64, torch.complex128)
QUANTIZED = (torch.quint8, torch.qint8, torch.qint32)
KEYS = ("a", "b", ("sub", "c"))
COUNTS: collections.Counter[str] = collections.Counter()


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype in QUANTIZED:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch deprecates the quantized creation functions
            return torch.quantize_per_tensor(torch.rand(shape, generator=gen) * 5, 0.1, 0, dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)).to(dtype)
    return (torch.rand(shape, generator=gen) * 100).to(dtype)


@st.composite
def leaves(draw: st.DrawFn, batch: tuple[int, ...]) -> torch.Tensor:
    """A leaf over ``batch``: plain, strided, a lazy conjugate view or a lazy negative view."""
    feature = draw(st.sampled_from([(), (2,)]))
    shape = (*batch, *feature)
    kind = draw(st.sampled_from(["plain", "plain", "strided", "conj", "neg"]))
    seed = draw(st.integers(0, 2**16))
    if kind == "conj":
        return torch.conj(_tensor(shape, torch.complex64, seed))
    if kind == "neg":
        return torch.conj(_tensor(shape, torch.complex64, seed)).imag  # a float32 view with the neg bit
    dtype = draw(st.sampled_from(LEAF_DTYPES))
    if kind == "strided":
        return _tensor((*shape, 2), dtype, seed)[..., 0]
    return _tensor(shape, dtype, seed)


@st.composite
def nodes(draw: st.DrawFn) -> tt.TensorDict:
    batch = (draw(st.integers(1, 4)), draw(st.integers(1, 3)))
    return tt.TensorDict(
        {"a": draw(leaves(batch)), "b": draw(leaves(batch)), "sub": {"c": draw(leaves(batch))}}, batch_size=batch
    )


@st.composite
def shapes_near(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape``, a shape broadcasting to it (dims set to 1, leading dims dropped), or one that does not fit."""
    kind = draw(st.sampled_from(["same", "same", "broadcast", "wrong"]))
    if kind == "same":
        return shape
    if kind == "broadcast":
        out = [1 if draw(st.booleans()) else s for s in shape]
        return tuple(out[draw(st.integers(0, len(out))) :])
    return (*shape[:-1], shape[-1] + 1) if shape and draw(st.booleans()) else (*shape, 3)


@st.composite
def tensor_values(draw: st.DrawFn, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = draw(st.sampled_from(VALUE_DTYPES + QUANTIZED))
    return _tensor(draw(shapes_near(shape)), dtype, draw(st.integers(0, 2**16)))


NUMBERS = st.one_of(
    st.booleans(),
    st.integers(-300, 300),
    st.sampled_from([2**40, -(2**70), 1e300, float("inf"), float("nan")]),
    st.floats(-1e3, 1e3, allow_nan=False),
    st.complex_numbers(max_magnitude=1e3, allow_nan=False, allow_infinity=False),
)


@st.composite
def values(draw: st.DrawFn, shape: tuple[int, ...]) -> Any:
    return draw(tensor_values(shape)) if draw(st.integers(0, 3)) else draw(NUMBERS)


def _int_index(size: int) -> st.SearchStrategy[int]:
    return st.integers(-size - 1, size)  # one out of range on each side


@st.composite
def index_items(draw: st.DrawFn, size: int) -> Any:
    """One index over a batch dim of ``size``."""
    kind = draw(st.sampled_from(["int", "slice", "list", "tensor", "mask", "none", "ellipsis"]))
    if kind == "int":
        return draw(_int_index(size))
    if kind == "slice":
        return slice(
            draw(st.none() | st.integers(-size, size)),
            draw(st.none() | st.integers(-size, size)),
            draw(st.none() | st.integers(1, 2)),
        )
    if kind in ("list", "tensor"):
        items = draw(st.lists(_int_index(size), max_size=3))
        return items if kind == "list" else torch.tensor(items, dtype=torch.long)
    if kind == "mask":
        return torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size)))
    return None if kind == "none" else Ellipsis


@st.composite
def indices(draw: st.DrawFn, batch: tuple[int, ...]) -> Any:
    if draw(st.booleans()):
        return draw(index_items(batch[0]))
    return tuple(draw(index_items(s)) for s in batch[: draw(st.integers(1, len(batch)))])


def _leaf_items(td: tt.TensorDict) -> list[tuple[Any, torch.Tensor]]:
    return [(k, td[k]) for k in KEYS]


def _cast(value: Any, leaf: torch.Tensor) -> Any:
    return value.to(leaf.dtype) if isinstance(value, torch.Tensor) else value


def _outcome(call: Any, td: tt.TensorDict) -> Any:
    """``call()``'s result, or None after a named refusal that left ``td`` unchanged (counted)."""
    before = snapshot(td)
    try:
        out = call()
    except NAMED as err:
        assert_unchanged(td, before)
        COUNTS["refused"] += 1
        COUNTS[f"refused {type(err).__name__}"] += 1
        return None
    COUNTS["written"] += 1
    return out


def _check(td: tt.TensorDict, expected: dict[Any, torch.Tensor]) -> None:
    for k, want in expected.items():
        got = td[k]
        torch.testing.assert_close(
            got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg(), rtol=0, atol=0, equal_nan=True
        )


def _clones(td: tt.TensorDict) -> dict[Any, torch.Tensor]:
    return {k: leaf.clone() for k, leaf in _leaf_items(td)}


@given(st.data(), nodes())
def test_update_writes_fully_or_refuses_untouched(data: st.DataObject, td: tt.TensorDict) -> None:
    COUNTS["update_ calls"] += 1
    keys = data.draw(st.lists(st.sampled_from([*KEYS, "missing"]), unique=True, min_size=1))
    given_values = {k: data.draw(values(tuple(td[k].shape) if k != "missing" else (1,))) for k in keys}
    expected = _clones(td)
    if _outcome(lambda: td.update_(given_values), td) is None:
        return
    for k, v in given_values.items():
        leaf = expected[k]
        if isinstance(v, torch.Tensor):
            leaf.copy_(v)
        else:
            leaf.fill_(v)
    _check(td, expected)


@given(st.data(), nodes())
def test_copy_writes_fully_or_refuses_untouched(data: st.DataObject, td: tt.TensorDict) -> None:
    COUNTS["copy_ calls"] += 1
    keys = list(KEYS) if data.draw(st.integers(0, 5)) else ["a", "b"]  # now and then other keys
    shape_rule = st.sampled_from(["same", "same", "same", "wrong"])
    source = {}
    for k in keys:
        shape = tuple(td[k].shape) if data.draw(shape_rule) == "same" else (*td[k].shape, 2)
        source[k] = _tensor(shape, data.draw(st.sampled_from(VALUE_DTYPES + QUANTIZED)), data.draw(st.integers(0, 99)))
    other = tt.TensorDict({"a": source["a"], "b": source["b"]}, batch_size=td.batch_size)
    if ("sub", "c") in source:
        other = other.set(("sub", "c"), source[("sub", "c")])
    expected = _clones(td)
    if _outcome(lambda: td.copy_(other), td) is None:
        return
    for k, leaf in expected.items():
        leaf.copy_(source[k])
    _check(td, expected)


@st.composite
def at_values(draw: st.DrawFn, td: tt.TensorDict, index: Any) -> Any:
    """A value for ``td.at[index]``: a node shaped like ``td[index]``, a tensor aligned with its batch
    dims, or a number."""
    try:
        new = tuple(td[index].batch_size)
    except (IndexError, TypeError, ValueError, RuntimeError):
        new = (1,)
    kind = draw(st.sampled_from(["node", "tensor", "number"]))
    if kind == "number":
        return draw(NUMBERS)
    if kind == "tensor":
        return draw(tensor_values(new))
    batch = draw(st.sampled_from([new, new, new, (*new, 1)]))  # now and then another batch size

    def leaf(k: Any) -> torch.Tensor:
        feature = tuple(td[k].shape[2:]) if draw(st.integers(0, 4)) else (3,)
        dtype = draw(st.sampled_from(VALUE_DTYPES + QUANTIZED))
        return _tensor((*batch, *feature), dtype, draw(st.integers(0, 2**16)))

    return tt.TensorDict({"a": leaf("a"), "b": leaf("b"), "sub": {"c": leaf(("sub", "c"))}}, batch_size=batch)


def _as_tuple(index: Any) -> tuple[Any, ...]:
    return index if type(index) is tuple else (index,)


def _at_expected(td: tt.TensorDict, index: Any, value: Any) -> dict[Any, torch.Tensor]:
    """The writes of ``td.at[index].set_(value)`` done with plain torch on clones of the leaves."""
    expected = _clones(td)
    items = [torch.tensor(i, dtype=torch.long) if isinstance(i, list) else i for i in _as_tuple(index)]
    taken = sum(
        i.dim() if isinstance(i, torch.Tensor) and i.dtype == torch.bool else i is not None and i is not Ellipsis
        for i in items
    )
    # the node's ``...`` spans its two batch dims only, a leaf's would reach its feature dims too
    spread = [x for i in items for x in ([slice(None)] * (2 - taken) if i is Ellipsis else [i])]
    torch_index = (*spread, ...)
    for k, leaf in expected.items():
        v = value[k] if isinstance(value, tt.TensorDict) else value
        if isinstance(v, torch.Tensor) and not isinstance(value, tt.TensorDict):
            v = v[(..., *(None,) * (leaf.dim() - 2))]  # a tensor value is aligned with the batch dims
        leaf[torch_index] = _cast(v, leaf)
    return expected


def _at_case(data: st.DataObject, td: tt.TensorDict, name: str) -> tuple[Any, Any, Any]:
    """An index, a value, and torch's writes of them (None where torch refuses one)."""
    COUNTS[f"{name} calls"] += 1
    index = data.draw(indices(tuple(td.batch_size)))
    value = data.draw(at_values(td, index))
    return index, value, _torch_writes(td, index, value)


@given(st.data(), nodes())
def test_at_set__writes_fully_or_refuses_untouched(data: st.DataObject, td: tt.TensorDict) -> None:
    index, value, expected = _at_case(data, td, "at[].set_")
    if _outcome(lambda: td.at[index].set_(value), td) is None:
        return
    assert expected is not None
    _check(td, expected)


@given(st.data(), nodes())
def test_at_set_gives_the_writes_or_refuses(data: st.DataObject, td: tt.TensorDict) -> None:
    index, value, expected = _at_case(data, td, "at[].set")
    out = _outcome(lambda: td.at[index].set(value), td)
    if out is None:
        return
    assert expected is not None
    _check(out, expected)


def _torch_writes(td: tt.TensorDict, index: Any, value: Any) -> dict[Any, torch.Tensor] | None:
    """:func:`_at_expected`, or None when plain torch refuses one of the writes (tdtree must then refuse)."""
    try:
        return _at_expected(td, index, value)
    except Exception:
        return None
