"""Every accepted leaf kind through every operation of ``_optable.ROWS``, against the dict of tensors.

The kinds a node holds (strided tensors of any dtype, on any device): meta, complex, bool,
float16, float8, non-contiguous leaves and lazy conj / neg views. For each row, the same computation over the equivalent
plain dict (``row.plain``, torch and optree only) is the oracle: where it runs, the node's
operation runs and gives the same leaves (meta leaves: the same shapes and dtypes), or
refuses with a named tdtree error (``copy_`` of an int64 value into a bool leaf: the
in-place writers never truncate); where torch refuses it for the dtype or device
(``x - 0.5`` of bool, ``x > 0`` of complex), the node's operation raises too. The input is
unchanged either way. Then the operations outside the table that read a
leaf's storage: ``nbytes``, ``repr``, ``memmap`` / ``memmap_like``, ``save`` / ``load``
and ``share_memory``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch

import tdtree as tt
from tdtree import errors
from tdtree.testing import assert_close, assert_equal

from ._optable import ROWS, Row, tmap
from .test_matrix import FIXED_SPEC, _assert_unchanged, _data, _snapshot, plain


def _spread(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a non-contiguous view (every other element of a buffer twice its size)."""
    return torch.stack([t, torch.zeros_like(t)], -1)[..., 0]


CONVERT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "meta": lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"),
    "complex": lambda t: torch.complex(t, -t),
    "bool": lambda t: t > 0,
    "float16": lambda t: t.half(),
    "non_contiguous": _spread,
    "conj_view": lambda t: torch.complex(t, -t).conj(),  # a lazy conjugate view (conj bit set)
    "neg_view": lambda t: torch.complex(t, -t).conj().imag,  # a lazy negative view (neg bit set)
}
if hasattr(torch, "float8_e4m3fn"):
    CONVERT["float8"] = lambda t: t.to(torch.float8_e4m3fn)
BATCH = FIXED_SPEC[:3]


# rows whose dict side in the table is written for float32 leaves, spelled here for any dtype
PLAIN = {
    "to_same": tmap(lambda t: t.to(torch.float32)),
    "all_scalar": lambda d, bs: torch.stack([(t > -9).all() for t in optree.tree_leaves(d)]).all(),
}
# the optimiser steps on bool leaves: no parameter is bool, and torch's kernels for them differ
# in what they refuse (SGD's foreach add runs, a subtraction refuses)
NOT_FOR = {"bool": {"sgd", "adam"}}
CASES = [(kind, row) for kind in sorted(CONVERT) for row in ROWS if row.name not in NOT_FOR.get(kind, ())]


def _input(kind: str) -> tuple[dict[str, Any], tt.TensorDict]:
    d = optree.tree_map(CONVERT[kind], _data(FIXED_SPEC))
    return d, tt.TensorDict(d, BATCH)


def _named(err: BaseException) -> bool:
    return type(err).__module__ == errors.__name__


def _outcome(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except Exception as err:  # the oracle's own refusal, compared below
        return None, err


# torch warns once per process when a complex value is cast to a real dtype (to_float64)
@pytest.mark.filterwarnings("ignore:Casting complex values to real:UserWarning")
@pytest.mark.parametrize(("kind", "row"), CASES, ids=[f"{k}-{r.name}" for k, r in CASES])
def test_row_matches_the_dict_computation(kind: str, row: Row) -> None:
    d, x = _input(kind)
    before = _snapshot(x)
    expected, refused = _outcome(lambda: PLAIN.get(row.name, row.plain)(d, torch.Size(BATCH)))
    got, err = _outcome(lambda: row.node(x))
    if refused is not None:
        assert err is not None, f"{row.name} on {kind} leaves: the dict computation raised {refused!r}, the node ran"
    elif err is not None:
        assert _named(err), f"{row.name} on {kind} leaves: the dict computation ran, the node raised {err!r}"
    else:
        # the optimiser rows' dict side takes other (equally rounded) steps than the foreach kernels
        tol = {"rtol": 1e-2, "atol": 1e-3} if kind == "float16" else {}
        assert_close(plain(got), plain(expected), check_tags=False, check_device=kind != "meta", **tol)
    _assert_unchanged(x, before)


@pytest.mark.parametrize("kind", sorted(CONVERT))
def test_storage_operations(kind: str, tmp_path) -> None:
    d, x = _input(kind)
    before = _snapshot(x)
    leaves = optree.tree_leaves(d)
    # every leaf here has a storage of its own; a meta leaf counts the bytes of its shape
    assert x.nbytes == sum(t.numel() * t.element_size() if t.is_meta else t.untyped_storage().nbytes() for t in leaves)
    assert "TensorDict(" in repr(x)
    like = x.memmap_like(tmp_path / "like")
    assert_equal(plain(like), optree.tree_map(lambda t: torch.zeros(t.shape, dtype=t.dtype), d), check_tags=False)
    tt.save(x, tmp_path / "saved.td")
    assert_equal(tt.load(tmp_path / "saved.td"), x)
    if kind == "meta":
        with pytest.raises(errors.MemmapError, match="meta tensor"):
            x.memmap(tmp_path / "values")
        shared = x.share_memory()  # nothing to share: meta leaves hold no data
        assert_equal(shared, x, check_tags=False)
        assert shared.tags == {tt.Shared, tt.Locked}
    else:
        assert_equal(x.memmap(tmp_path / "values"), x, check_tags=False)
        shared = x.share_memory()
        assert all(t.is_shared() for t in shared.values(include_nested=True, leaves_only=True) if t.numel())
        assert_equal(shared, x, check_tags=False)
    _assert_unchanged(x, before)
