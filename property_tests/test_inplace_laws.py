"""Laws of the in-place writers: every value is read before any leaf is written.

The leaves are disjoint slices of one storage and the values are slices of
that same storage (or numbers, or fresh tensors), so values overlap the leaves
in every way: the same tensor, the same memory in another view, a partial
overlap, a strided view. The result must be the one of reading every value
first (cloning it), then writing.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import tdtree as tt

_LEN = 3  # elements per leaf
_KEYS = 4  # leaves, at base[i * _LEN : (i + 1) * _LEN]


@st.composite
def _values(draw: st.DrawFn, base: torch.Tensor, numbers: bool) -> object:
    """A value for one leaf: a view of ``base`` somewhere (contiguous or strided), a fresh tensor, a number."""
    kinds = ["view", "strided", "fresh", "number"] if numbers else ["view", "strided", "fresh"]
    kind = draw(st.sampled_from(kinds))
    if kind == "view":
        start = draw(st.integers(0, base.numel() - _LEN))
        return base[start : start + _LEN]
    if kind == "strided":
        start = draw(st.integers(0, base.numel() - 2 * _LEN + 1))
        return base[start : start + 2 * _LEN - 1 : 2]
    if kind == "fresh":
        return torch.full((_LEN,), float(draw(st.integers(-9, 9))))
    return draw(st.integers(-9, 9))


def _node(base: torch.Tensor) -> tt.TensorDict:
    return tt.TensorDict({f"k{i}": base[i * _LEN : (i + 1) * _LEN] for i in range(_KEYS)}, batch_size=[_LEN])


def _expected(base: torch.Tensor, values: dict[str, object]) -> torch.Tensor:
    read = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    out = base.clone()
    for k, v in read.items():
        i = int(k[1:])
        out[i * _LEN : (i + 1) * _LEN] = v
    return out


@given(st.data(), st.lists(st.sampled_from([f"k{i}" for i in range(_KEYS)]), unique=True, max_size=_KEYS))
def test_update_reads_every_value_before_writing(data: st.DataObject, keys: list[str]) -> None:
    base = torch.arange(float(_KEYS * _LEN + 2))  # two spare elements outside every leaf
    td = _node(base)
    values = {k: data.draw(_values(base, numbers=True)) for k in keys}
    expected = _expected(base, values)
    leaves = list(td.values())
    assert td.update_(values) is td
    assert torch.equal(base, expected)
    assert all(a is b for a, b in zip(td.values(), leaves, strict=True))


@given(st.data())
def test_copy_reads_every_value_before_writing(data: st.DataObject) -> None:
    base = torch.arange(float(_KEYS * _LEN + 2))
    td = _node(base)
    values = {f"k{i}": data.draw(_values(base, numbers=False)) for i in range(_KEYS)}
    expected = _expected(base, values)
    assert td.copy_(tt.TensorDict(values, batch_size=[_LEN])) is td
    assert torch.equal(base, expected)


# -- a refused call writes nothing ---------------------------------------------------------------

_DTYPES = [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool]
_BAD = {  # per leaf dtype: values every writer must refuse
    torch.float32: [1e300, torch.zeros(_LEN, dtype=torch.complex64), torch.zeros(5)],
    torch.float16: [70000.0, -1e300, torch.zeros(3, 1)],
    torch.int64: [1.5, 2**63, torch.zeros(_LEN)],
    torch.uint8: [300, -1, 1.0, torch.zeros(_LEN, dtype=torch.float16)],  # (int8 casts: same kind)
    torch.bool: [7, 0.5, torch.zeros(_LEN, dtype=torch.uint8)],
}


def _good(draw: st.DrawFn, dtype: torch.dtype) -> object:
    if draw(st.booleans()):
        return draw(st.booleans()) if dtype is torch.bool else draw(st.integers(0, 100))
    return torch.full((_LEN,), 1, dtype=dtype)


def _unwritable(kind: str, dtype: torch.dtype) -> torch.Tensor:
    """A leaf of ``dtype`` holding arange(_LEN) that torch refuses to write (as the writer must, first)."""
    values = torch.arange(_LEN).to(dtype)
    if kind == "expanded":
        return values[:1].expand(_LEN)
    if kind == "inference":
        with torch.inference_mode():
            return values.clone()
    return torch.nn.Parameter(values.float())  # "grad": a leaf requiring grad, grad mode on


@given(
    st.data(),
    st.lists(st.sampled_from(_DTYPES), min_size=1, max_size=6),
    st.sampled_from(["update_", "at_set_", "copy_"]),
    st.sampled_from(["value", "expanded", "inference", "grad"]),
)
def test_a_refused_write_writes_nothing(data: st.DataObject, dtypes: list[torch.dtype], op: str, bad_kind: str) -> None:
    """One bad value or one unwritable leaf anywhere in a write: the writer refuses it with WriteError
    and every leaf keeps its bits."""
    bad = data.draw(st.integers(0, len(dtypes) - 1))
    if bad_kind == "grad":
        dtypes[bad] = torch.float32
    leaves = {f"k{i}": torch.arange(_LEN).to(d) for i, d in enumerate(dtypes)}
    if bad_kind != "value":
        leaves[f"k{bad}"] = _unwritable(bad_kind, dtypes[bad])
    td = tt.TensorDict(leaves, batch_size=[_LEN])
    before = {k: v.detach().clone() for k, v in leaves.items()}

    def value(i: int, d: torch.dtype) -> object:
        if i != bad or bad_kind != "value":
            return torch.full((_LEN,), 1, dtype=d) if op == "copy_" else _good(data.draw, d)
        choices = [v for v in _BAD[d] if isinstance(v, torch.Tensor)] if op == "copy_" else _BAD[d]
        return data.draw(st.sampled_from(choices))

    values = {k: value(i, d) for i, (k, d) in enumerate(zip(leaves, dtypes))}
    with pytest.raises(tt.WriteError):
        if op == "at_set_":  # one value for every leaf at index 0: the bad value (its leaf refuses it), or True
            td.at[0].set_(values[f"k{bad}"] if bad_kind == "value" else True)
        elif op == "copy_":  # (batch_size []: a value of a wrong shape must reach copy_'s own check)
            td.copy_(tt.TensorDict(values, batch_size=[]))
        else:
            td.update_(values)
    for k, v in td.items():
        assert torch.equal(v.detach().contiguous().view(torch.uint8), before[k].view(torch.uint8)), k


_NUMBER_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]
_NUMBERS = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([255, 256, -1, 2**63 - 1, 2**63, 65504, 65520, 448]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([3.4e38, 3.5e38, 65504.0, 65519.0, 1e300, -1e300]),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
)


@given(st.sampled_from(_NUMBER_DTYPES), _NUMBERS)
@example(torch.bfloat16, -(2**63) - 1)  # below the int64 torch reads an int in: fill_ overflows
@example(torch.float32, 2**64)
def test_a_number_update_takes_is_one_torch_writes_exactly(dtype: torch.dtype, value: object) -> None:
    """update_ writes a number only where torch's fill_ writes it without overflow (so no write it
    lets through can fail halfway), and then writes what fill_ writes; a refused number leaves the leaf."""
    leaf = torch.zeros(2, dtype=dtype)
    td = tt.TensorDict({"x": leaf}, [2])
    try:
        td.update_({"x": value})
    except tt.WriteError:
        assert torch.equal(leaf, torch.zeros(2, dtype=dtype))
        return
    expected = torch.empty(2, dtype=dtype).fill_(value)  # raises if torch would refuse it
    assert torch.equal(leaf.view(torch.uint8), expected.view(torch.uint8))
