"""The in-place writers: update_, copy_, zero_, fill_, and share_memory()."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tdtree as tt
from tdtree._tags import retag
from tdtree.errors import (
    BatchDimError,
    BatchSizeError,
    KeyMismatchError,
    KeyNotFoundError,
    WriteError,
    WriteIndexError,
    WriteShapeError,
    WriteTypeError,
)
from tdtree.testing import assert_equal


def _node() -> tt.TensorDict:
    return tt.TensorDict(
        {
            "x": torch.arange(6.0).reshape(2, 3),
            "i": torch.tensor([1, 2]),
            "n": {"y": torch.zeros(2, 1), "m": torch.tensor([True, False])},
        },
        batch_size=[2],
    )


def _snapshot(td: tt.TensorDict) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    return [(t, t._version, t.clone()) for _, t in td.items(include_nested=True, leaves_only=True)]


def _assert_untouched(snap: list[tuple[torch.Tensor, int, torch.Tensor]]) -> None:
    for t, version, values in snap:
        assert t._version == version
        assert torch.equal(t, values)


# -- update_ -------------------------------------------------------------------------


def test_update_writes_into_the_existing_storage_and_returns_the_node() -> None:
    td = _node()
    x, ptr = td["x"], td["x"].data_ptr()
    out = td.update_({"x": torch.ones(2, 3), ("n", "y"): torch.full((2, 1), 4.0)})
    assert out is td
    assert td["x"] is x and td["x"].data_ptr() == ptr
    assert torch.equal(x, torch.ones(2, 3))
    assert torch.equal(td["n", "y"], torch.full((2, 1), 4.0))
    assert torch.equal(td["i"], torch.tensor([1, 2]))


def test_update_broadcasts_values() -> None:
    td = _node().update_({"x": torch.tensor([1.0, 2.0, 3.0]), "i": 7})
    assert torch.equal(td["x"], torch.tensor([[1.0, 2.0, 3.0]] * 2))
    assert torch.equal(td["i"], torch.tensor([7, 7]))


def test_update_nested_mapping_and_node_sources() -> None:
    td = _node()
    td.update_({"n": {"y": torch.ones(2, 1)}})
    assert torch.equal(td["n", "y"], torch.ones(2, 1))
    source = tt.TensorDict({"n": {"m": torch.tensor([False, True])}}, batch_size=[2])
    td.update_(source)
    assert torch.equal(td["n", "m"], torch.tensor([False, True]))


def test_update_works_on_locked_and_shared_nodes() -> None:
    td = _node().lock()
    assert td.update_({"i": torch.tensor([5, 6])}) is td
    assert torch.equal(td["i"], torch.tensor([5, 6]))
    shared = _node().share_memory()
    assert shared.update_({"i": torch.tensor([8, 9])}) is shared
    assert torch.equal(shared["i"], torch.tensor([8, 9]))
    assert type(shared) is tt.TensorDict[tt.Locked, tt.Shared]


def test_update_reads_all_values_before_writing() -> None:
    td = tt.TensorDict({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 4.0])}, batch_size=[2])
    td.update_({"a": td["b"], "b": td["a"]})
    assert torch.equal(td["a"], torch.tensor([3.0, 4.0]))
    assert torch.equal(td["b"], torch.tensor([1.0, 2.0]))
    td.update_({"a": td["a"].flip(0)})
    assert torch.equal(td["a"], torch.tensor([4.0, 3.0]))


def test_update_reads_first_a_value_sharing_a_leaf_storage_through_another_tensor() -> None:
    # the alias test goes by storage, whatever tensor object views it: a detached one, one made by set_()
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    td = tt.TensorDict({"a": a, "b": b}, batch_size=[2])
    on_b = torch.empty(0).set_(b.untyped_storage(), 0, (2,), (1,))
    td.update_({"a": on_b, "b": a.detach()})
    assert torch.equal(a, torch.tensor([3.0, 4.0])) and torch.equal(b, torch.tensor([1.0, 2.0]))
    td.copy_(tt.TensorDict({"a": b.detach(), "b": torch.empty(0).set_(a.untyped_storage(), 0, (2,), (1,))}, [2]))
    assert torch.equal(a, torch.tensor([1.0, 2.0])) and torch.equal(b, torch.tensor([3.0, 4.0]))


def test_update_from_a_mapping_checks_each_value_device() -> None:
    # a node's device is every leaf's: on the CPU a mapping's values are told by is_cpu
    td = tt.TensorDict({"a": torch.zeros(2), "sub": {"c": torch.zeros(2)}}, batch_size=[2])
    with pytest.raises(WriteError, match=r"\('sub', 'c'\) is on cpu and the value is on meta"):
        td.update_({"a": torch.ones(2), "sub": {"c": torch.ones(2, device="meta")}})
    assert torch.equal(td["a"], torch.zeros(2))


def test_update_reads_a_value_before_a_number_overwrites_its_leaf() -> None:
    td = tt.TensorDict({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 4.0])}, batch_size=[2])
    td.update_({"a": 0.0, "b": td["a"]})
    assert torch.equal(td["a"], torch.zeros(2)) and torch.equal(td["b"], torch.tensor([1.0, 2.0]))


def test_update_and_copy_into_non_contiguous_leaves() -> None:
    base = torch.zeros(3, 2)
    td = tt.TensorDict({"t": base.t(), "s": torch.zeros(4)[::2]}, batch_size=[2])
    td.update_({"t": torch.arange(6.0).reshape(2, 3), "s": torch.ones(2)})
    assert torch.equal(base, torch.arange(6.0).reshape(2, 3).t()) and torch.equal(td["s"], torch.ones(2))
    td.copy_(tt.TensorDict({"t": torch.ones(2, 3), "s": torch.zeros(2)}, batch_size=[2]))
    assert torch.equal(base, torch.ones(3, 2)) and torch.equal(td["s"], torch.zeros(2))


def test_update_partial_overlap_of_a_leaf_with_itself() -> None:
    base = torch.arange(4.0)
    td = tt.TensorDict({"a": base[1:], "b": base[:3]}, batch_size=[3])
    td.update_({"a": td["b"]})
    assert torch.equal(base, torch.tensor([0.0, 0.0, 1.0, 2.0]))


def test_update_missing_key_raises_before_writing() -> None:
    td = _node()
    snap = _snapshot(td)
    with pytest.raises(KeyNotFoundError, match=r"key \('n', 'z'\) not found.*\('n', 'm'\), \('n', 'y'\)"):
        td.update_({"x": torch.ones(2, 3), ("n", "z"): torch.ones(2)})
    _assert_untouched(snap)


def test_update_wrong_dtype_raises_before_writing() -> None:
    td = _node()
    snap = _snapshot(td)
    with pytest.raises(
        WriteError, match=r"update_: 'i' holds torch.int64 and the value is torch.float32, which does not cast.*\.to\("
    ):
        td.update_({"x": torch.ones(2, 3), "i": torch.ones(2)})
    _assert_untouched(snap)


def test_update_wrong_shape_raises_before_writing() -> None:
    td = _node()
    snap = _snapshot(td)
    with pytest.raises(WriteError, match=r"update_: \('n', 'y'\) has shape \(2, 1\) and the value's shape \(3,\)"):
        td.update_({"x": torch.ones(2, 3), "n": {"y": torch.ones(3)}})
    _assert_untouched(snap)


def test_update_value_that_would_grow_the_leaf_is_refused() -> None:
    with pytest.raises(WriteError, match=r"'i' has shape \(2,\) and the value's shape \(3, 2\)"):
        _node().update_({"i": torch.ones(3, 2, dtype=torch.int64)})


def test_update_wrong_device_raises_on_meta() -> None:
    with pytest.raises(WriteError, match=r"'x' is on cpu and the value is on meta.*\.to\('cpu'\)"):
        _node().update_({"x": torch.ones(2, 3, device="meta")})


def test_update_and_copy_from_a_node_on_another_device_raise_before_writing() -> None:
    td = _node()
    snap = _snapshot(td)
    other = tt.TensorDict({"x": torch.ones(2, 3)}, batch_size=[2], device="meta")
    with pytest.raises(WriteError, match=r"update_: 'x' is on cpu and the value is on meta"):
        td.update_(other)
    with pytest.raises(WriteError, match=r"copy_: 'i' is on cpu and the value is on meta"):
        td.copy_(_node().to("meta"))
    _assert_untouched(snap)


def test_update_casts_only_without_truncation() -> None:
    td = _node()
    td.update_({"x": torch.full((2, 3), 0.5, dtype=torch.float64), "i": torch.tensor([True, False])})
    assert td["x"].dtype == torch.float32 and torch.equal(td["x"], torch.full((2, 3), 0.5))
    assert torch.equal(td["i"], torch.tensor([1, 0]))
    with pytest.raises(WriteError, match=r"\('n', 'm'\) holds torch.bool and the value is torch.int64"):
        td.update_({("n", "m"): torch.tensor([1, 0])})


def test_update_scalar_kinds() -> None:
    td = _node()
    td.update_({"x": 2, "i": True})
    assert torch.equal(td["x"], torch.full((2, 3), 2.0))
    with pytest.raises(WriteError, match=r"'i' holds torch.int64 and the value 1.5 is a float.*do not truncate"):
        td.update_({"i": 1.5})
    with pytest.raises(WriteError, match=r"\('n', 'm'\) holds torch.bool and the value 1 is a int"):
        td.update_({("n", "m"): 1})
    with pytest.raises(TypeError, match=r"update_: 'x': a value is a tensor or a Python number, got str"):
        td.update_({"x": "one"})


def test_update_structure_changes_are_refused() -> None:
    td = _node()
    with pytest.raises(WriteError, match=r"update_: 'n' is a node; give it a mapping or a node, not a Tensor"):
        td.update_({"n": torch.ones(2)})
    with pytest.raises(WriteError, match=r"update_: 'x' is a tensor and the value is a dict.*update\(\)"):
        td.update_({"x": {"a": torch.ones(2)}})


def test_update_into_an_expanded_leaf_is_refused_before_writing() -> None:
    td = tt.TensorDict({"a": torch.zeros(2), "e": torch.zeros(3).expand(2, 3)}, batch_size=[2])
    snap = _snapshot(td)
    with pytest.raises(WriteError, match=r"'e' is an expanded tensor \(stride 0 in shape \(2, 3\)\)"):
        td.update_({"a": torch.ones(2), "e": torch.ones(2, 3)})
    _assert_untouched(snap)


@pytest.mark.parametrize(
    "value",
    [torch.ones(1, 0, 2), torch.ones(1, 0, 2, dtype=torch.float64), torch.ones(0, 2)],
    ids=["same", "cast", "broadcast"],
)
def test_an_empty_expanded_leaf_is_written_as_empty(value: torch.Tensor) -> None:
    # stride 0 on a dim of 2 but no elements, so no memory cell is shared: every path accepts it
    empty = torch.zeros(1, 0, 1).expand(1, 0, 2)
    td = tt.TensorDict({"a": torch.zeros(1), "e": empty}, batch_size=[1])
    assert td.update_({"a": torch.ones(1), "e": value}) is td
    assert td["a"].tolist() == [1.0] and td["e"] is empty


# -- copy_ ---------------------------------------------------------------------------


def test_copy_writes_every_leaf() -> None:
    td = _node().lock()
    src = _node().update_({"x": torch.full((2, 3), 5.0), "i": torch.tensor([3, 4])})
    leaves = [t for _, t in td.items(include_nested=True, leaves_only=True)]
    assert td.copy_(src) is td
    assert_equal(td.unlock(), src)
    assert leaves == [t for _, t in td.items(include_nested=True, leaves_only=True)]


def test_copy_key_mismatch_raises_before_writing() -> None:
    td = _node()
    snap = _snapshot(td)
    with pytest.raises(
        KeyMismatchError, match=r"copy_ at 'n': .*only in the first: \('n', 'y'\); only in the second: none\.$"
    ):
        td.copy_(_node().exclude(("n", "y")))
    with pytest.raises(KeyMismatchError, match=r"copy_: .*only in the first: none; only in the second: 'z'\.$"):
        td.copy_(_node().set("z", torch.ones(2)))
    _assert_untouched(snap)


def test_copy_needs_equal_shapes() -> None:
    td = _node()
    src = _node().set("x", torch.ones(2, 1))
    with pytest.raises(WriteError, match=r"copy_: 'x' has shape \(2, 3\) and the value has shape \(2, 1\)"):
        td.copy_(src)


def test_copy_dtype_and_kind_mismatch() -> None:
    with pytest.raises(WriteError, match=r"copy_: 'i' holds torch.int64 and the value is torch.float32"):
        _node().copy_(_node().set("i", torch.ones(2)))
    with pytest.raises(WriteError, match=r"copy_: 'n' is a node here and a tensor in the source"):
        _node().copy_(_node().exclude("n").set("n", torch.ones(2)))
    with pytest.raises(WriteError, match=r"copy_: 'x' is a tensor here and a node in the source"):
        _node().copy_(_node().exclude("x").set("x", {"q": torch.ones(2)}))
    with pytest.raises(TypeError, match=r"copy_ takes a node, got dict; use update_ for a mapping"):
        _node().copy_({"x": torch.ones(2, 3)})


# -- zero_ and fill_ -------------------------------------------------------------------


def test_zero_sets_every_leaf_in_place() -> None:
    td = _node().share_memory()
    leaves = [t for _, t in td.items(include_nested=True, leaves_only=True)]
    assert td.zero_() is td
    for t in leaves:
        assert not t.any()
    empty = tt.TensorDict({}, batch_size=[3])
    assert empty.zero_() is empty


def test_fill_a_leaf_and_a_sub_node() -> None:
    td = _node().lock()
    assert td.fill_("x", 1.5) is td
    assert torch.equal(td["x"], torch.full((2, 3), 1.5))
    td.fill_("n", True)
    assert torch.equal(td["n", "y"], torch.ones(2, 1))
    assert torch.equal(td["n", "m"], torch.tensor([True, True]))
    td.fill_(("i",), torch.tensor(4))
    assert torch.equal(td["i"], torch.tensor([4, 4]))


def test_fill_errors_raise_before_writing() -> None:
    td = _node()
    snap = _snapshot(td)
    with pytest.raises(KeyNotFoundError, match=r"key 'q' not found"):
        td.fill_("q", 1)
    with pytest.raises(WriteError, match=r"fill_: \('n', 'm'\) holds torch.bool and the value 2.0 is a float"):
        td.fill_("n", 2.0)
    with pytest.raises(WriteError, match=r"fill_: 'x': the value has shape \(3,\); fill_ takes a number or a 0-dim"):
        td.fill_("x", torch.ones(3))
    with pytest.raises(WriteError, match=r"fill_: 'i' holds torch.int64 and the value is torch.float32"):
        td.fill_("i", torch.tensor(1.0))
    _assert_untouched(snap)


# -- share_memory ----------------------------------------------------------------------


def test_share_memory_copies_into_shared_memory_and_tags() -> None:
    td = _node()
    snap = _snapshot(td)
    shared = td.share_memory()
    _assert_untouched(snap)
    assert type(shared) is tt.TensorDict[tt.Shared, tt.Locked]
    assert type(shared["n"]) is tt.TensorDict[tt.Shared, tt.Locked]
    assert shared.is_shared and shared.is_locked and not shared.is_memmap
    for (_, a), (_, b) in zip(
        td.items(include_nested=True, leaves_only=True), shared.items(include_nested=True, leaves_only=True)
    ):
        assert b.is_shared() and not a.is_shared()
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert_equal(shared, td.share_memory(), check_tags=True)
    assert_equal(shared, td, check_tags=False)
    assert type(td) is tt.TensorDict


def test_share_memory_of_a_shared_node_keeps_its_leaves() -> None:
    # its leaves are in torch's shared memory already: nothing to copy, as Tensor.share_memory_()
    shared = _node().share_memory()
    again = shared.share_memory()
    assert again["x"] is shared["x"] and again["x"].is_shared()
    assert type(again) is type(shared)


def test_share_memory_of_a_memmap_tagged_node_gives_shared_locked() -> None:
    # A Memmap-tagged node made by retag stands in for memmap(), which lives elsewhere.
    memmapped = retag(_node(), frozenset({tt.Memmap, tt.Locked}))
    assert isinstance(memmapped, tt.TensorDict[tt.Memmap])
    shared = memmapped.share_memory()
    assert type(shared) is tt.TensorDict[tt.Shared, tt.Locked]


def test_share_memory_zero_size_and_noncontiguous_leaves() -> None:
    td = tt.TensorDict({"e": torch.zeros(3, 0), "t": torch.arange(6.0).reshape(2, 3).t()}, batch_size=[3])
    shared = td.share_memory()
    assert shared["e"].shape == (3, 0)
    assert shared["t"].is_shared()
    assert torch.equal(shared["t"], td["t"])
    assert type(shared) is tt.TensorDict[tt.Shared, tt.Locked]


# -- under torch.compile ------------------------------------------------------------------


def _writes(td: tt.TensorDict, other: tt.TensorDict, x: torch.Tensor) -> torch.Tensor:
    td.update_({"a": td["b"], "b": td["a"]})  # a swap: the aliasing check must hold when traced
    td.fill_("c", 2.0)
    td.update_({"c": x + td["c"]})
    other.copy_(td)
    other.zero_()
    return td["a"] + td["b"] + td["c"].sum()


def test_writers_trace_without_graph_breaks() -> None:
    def fresh() -> tuple[tt.TensorDict, tt.TensorDict]:
        td = tt.TensorDict(
            {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 4.0]), "c": torch.zeros(2, 2)}, batch_size=[2]
        ).share_memory()
        return td, td.clone().lock()

    eager_td, eager_other = fresh()
    expected = _writes(eager_td, eager_other, torch.ones(2))
    td, other = fresh()
    got = torch.compile(_writes, fullgraph=True, backend="eager")(td, other, torch.ones(2))
    torch.testing.assert_close(got, expected)
    assert_equal(td, eager_td)
    assert_equal(other, eager_other)
    assert torch.equal(td["a"], torch.tensor([3.0, 4.0])) and torch.equal(td["b"], torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_writers_read_every_value_before_writing(backend: str) -> None:
    # Compiled code copies every value before the write: a swap and a value overlapping the leaf it
    # is written to give eager's result, through dynamo alone and through aot_autograd's functional graph.
    torch._dynamo.reset()
    td = tt.TensorDict({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 4.0])}, batch_size=[2])
    torch.compile(lambda t: t.update_({"a": t["b"], "b": t["a"]}), fullgraph=True, backend=backend)(td)
    assert torch.equal(td["a"], torch.tensor([3.0, 4.0])) and torch.equal(td["b"], torch.tensor([1.0, 2.0]))
    base = torch.arange(4.0)
    td = tt.TensorDict({"a": base[1:], "b": base[:3]}, batch_size=[3])
    torch.compile(lambda t: t.update_({"a": t["b"]}), fullgraph=True, backend=backend)(td)
    assert torch.equal(base, torch.tensor([0.0, 0.0, 1.0, 2.0]))
    # both values read first ([0, 0, 1] and [0, 1, 2]), then "a" (base[1:]) and "b" (base[:3]) written
    other = tt.TensorDict({"a": base[:3], "b": base[1:]}, batch_size=[3])
    torch.compile(lambda t, o: t.copy_(o), fullgraph=True, backend=backend)(td, other)
    assert torch.equal(base, torch.tensor([0.0, 1.0, 2.0, 1.0]))
    torch._dynamo.reset()


# -- issue 19: a refused write leaves every leaf as it was, bit for bit ---------------------------


def _two() -> tt.TensorDict:
    return tt.TensorDict({"a": torch.zeros(3), "b": torch.zeros(3, dtype=torch.uint8)}, [3])


def _refused_untouched(td: tt.TensorDict, write: Any, error: type[Exception], match: str) -> None:
    before = {k: v.clone() for k, v in td.items(include_nested=True, leaves_only=True)}
    with pytest.raises(error, match=match):
        write(td)
    for k, v in td.items(include_nested=True, leaves_only=True):
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize(
    ("write", "error", "match"),
    [
        (lambda td: td.at[0].set_(300), WriteError, r"'b' holds torch.uint8 and the value 300 is out of its range"),
        (lambda td: td.at[torch.tensor([0, 5])].set_(1), WriteIndexError, r"index 5 is out of range for batch dim 0"),
        (lambda td: td.update_({"a": torch.ones(3), "b": 300}), WriteError, r"'b' holds torch.uint8 and the value 300"),
        (
            lambda td: td.update_({"b": torch.ones(3, dtype=torch.uint8), "a": 1e300}),
            WriteError,
            r"'a' .* 1e\+300 is out",
        ),
        (lambda td: td.update_({"a": torch.ones(3), "b": -1}), WriteError, r"'b' holds torch.uint8 and the value -1"),
        (lambda td: td.at[0].set_(1.5), WriteTypeError, r"'b' holds torch.uint8 and the value 1.5 is a float"),
        (lambda td: td.at[:].set_("x"), WriteTypeError, r"must be a node, a tensor or a number, got str"),
        (lambda td: td.at[0].set_(torch.zeros(2)), WriteShapeError, r"does not broadcast"),
        (lambda td: td.at[7].set_(1), WriteIndexError, r"index 7 is out of range"),
        (lambda td: td.fill_("b", 256), WriteError, r"'b' holds torch.uint8 and the value 256"),
    ],
)
def test_refused_writes_write_nothing(write: Any, error: type[Exception], match: str) -> None:
    _refused_untouched(_two(), write, error, match)


def test_at_set_inplace_follows_update_casting_rule() -> None:
    td = tt.TensorDict({"i": torch.zeros(2, dtype=torch.int64), "m": torch.zeros(2, dtype=torch.bool)}, [2])
    _refused_untouched(td, lambda t: t.at[0].set_(1.5), WriteTypeError, r"'i' holds torch.int64 and the value 1.5")
    _refused_untouched(
        td.select("m"), lambda t: t.at[0].set_(7), WriteTypeError, r"'m' holds torch.bool and the value 7"
    )
    assert isinstance(WriteTypeError("x"), TypeError) and isinstance(WriteShapeError("x"), BatchSizeError)
    assert isinstance(WriteIndexError("x"), IndexError) and isinstance(WriteIndexError("x"), BatchDimError)


def _unwritable_leaves() -> dict[str, torch.Tensor]:
    with torch.inference_mode():
        inference = torch.zeros(3)
    return {
        "expanded": torch.zeros(1).expand(3),
        "parameter": torch.nn.Parameter(torch.zeros(3)),
        "parameter_view": torch.nn.Parameter(torch.zeros(6))[:3],
        "inference": inference,
    }


@pytest.mark.parametrize("kind", sorted(_unwritable_leaves()))
@pytest.mark.parametrize("op", ["update_", "copy_", "at_set_", "at_set_number", "zero_", "update_number"])
def test_unwritable_leaf_refused_before_any_write(kind: str, op: str) -> None:
    if kind == "expanded" and op == "zero_":
        return  # zero_ writes one value everywhere: an expanded leaf takes it (tested below)
    td = tt.TensorDict({"a": torch.ones(3), "z": _unwritable_leaves()[kind]}, [3])
    twos = tt.TensorDict({"a": torch.full((3,), 2.0), "z": torch.full((3,), 2.0)}, [3])
    write = {
        "update_": lambda t: t.update_(twos),
        "copy_": lambda t: t.copy_(twos),
        "at_set_": lambda t: t.at[:].set_(twos),
        "at_set_number": lambda t: t.at[:1].set_(2.0),
        "zero_": lambda t: t.zero_(),
        "update_number": lambda t: t.update_({"a": 2.0, "z": 2.0}),
    }[op]
    with pytest.raises(WriteError, match=r"'z' is "):
        write(td)
    assert torch.equal(td["a"], torch.ones(3))


def test_zero_of_expanded_leaf_writes_its_one_cell() -> None:
    td = tt.TensorDict({"e": torch.ones(1).expand(3)}, [3])
    assert torch.equal(td.zero_()["e"], torch.zeros(3))


def test_unwritable_leaves_written_where_torch_allows() -> None:
    leaves = _unwritable_leaves()
    with torch.no_grad():
        td = tt.TensorDict({"p": leaves["parameter"]}, [3])
        td.update_({"p": torch.ones(3)})
    assert torch.equal(leaves["parameter"].detach(), torch.ones(3))
    with torch.inference_mode():
        td = tt.TensorDict({"i": leaves["inference"]}, [3])
        td.update_({"i": 2.0})
    assert torch.equal(leaves["inference"], torch.full((3,), 2.0))


def test_at_set_inplace_reads_every_value_first() -> None:
    td = tt.TensorDict({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 4.0])}, [2])
    td.at[0].set_(tt.TensorDict({"a": td["b"][0], "b": td["a"][0]}, []))  # a swap
    assert td["a"].tolist() == [3.0, 2.0] and td["b"].tolist() == [1.0, 4.0]
    shifted = tt.TensorDict({"a": torch.arange(4.0), "b": torch.arange(4.0)}, [4])
    shifted.at[1:].set_(shifted[:-1])  # each value overlaps its own leaf
    assert shifted["a"].tolist() == [0.0, 0.0, 1.0, 2.0] and shifted["b"].tolist() == [0.0, 0.0, 1.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_at_set_inplace_index_tensor_into_unsigned(dtype: torch.dtype) -> None:
    td = tt.TensorDict({"u": torch.zeros(3, dtype=dtype)}, [3])
    td.at[torch.tensor([2])].set_(7)
    assert td["u"].tolist() == [0, 0, 7]


@pytest.mark.parametrize(
    ("dtype", "value", "fits"),
    [
        (torch.uint8, 255, True),
        (torch.uint8, 256, False),
        (torch.uint8, -1, False),
        (torch.int64, 2**63 - 1, True),
        (torch.int64, 2**63, False),
        (torch.int8, True, True),
        (torch.float16, 65504.0, True),
        (torch.float16, 65520.0, False),
        (torch.float32, 1e300, False),
        (torch.float32, float("inf"), True),
        (torch.float32, float("nan"), True),
        (torch.float32, 2**200, False),
        (torch.complex64, 1e300j, False),
        (torch.complex64, 1 + 1j, True),
        (torch.bfloat16, 3.38e38, True),
        (torch.bfloat16, 3.4e38, False),
    ],
)
def test_number_range(dtype: torch.dtype, value: Any, fits: bool) -> None:
    td = tt.TensorDict({"x": torch.zeros(2, dtype=dtype)}, [2])
    if fits:
        td.update_({"x": value})
        expected = torch.full((2,), value, dtype=dtype)
        assert torch.equal(td["x"], expected) if value == value else bool(td["x"].isnan().all())
    else:
        _refused_untouched(td, lambda t: t.update_({"x": value}), WriteError, r"is out of its range")


# -- issue 29: every index kind casts as a basic index does; quantized values and lazy views ------


_INDEX_KINDS = {
    "int": 1,
    "slice": slice(0, 2),
    "list": [0, 2],
    "tensor": torch.tensor([2, 0]),
    "mask": torch.tensor([True, False, True]),
    "tuple": (torch.tensor([0, 1]), slice(None)),
}


def _mixed_dtypes() -> tt.TensorDict:
    return tt.TensorDict(
        {
            "f32": torch.zeros(3, 2),
            "f64": torch.zeros(3, 2, dtype=torch.float64),
            "i64": torch.zeros(3, 2, dtype=torch.int64),
            "c64": torch.zeros(3, 2, dtype=torch.complex64),
        },
        [3, 2],
    )


# the dtype each leaf of _mixed_dtypes() is given a value of, one that torch.can_cast's to it
_SOURCE_DTYPES = {"f32": torch.float16, "f64": torch.float32, "i64": torch.int32, "c64": torch.float64}


@pytest.mark.parametrize("kind", sorted(_INDEX_KINDS))
@pytest.mark.parametrize("functional", [False, True])
def test_every_index_kind_casts_the_value_as_torch_copy_does(kind: str, functional: bool) -> None:
    index = _INDEX_KINDS[kind]
    torch_index = torch.tensor(index) if isinstance(index, list) else index
    td = _mixed_dtypes()
    entry = torch.zeros(3, 2)[torch_index].shape
    value = torch.arange(entry.numel(), dtype=torch.int32).reshape(entry) + 1  # one tensor for every leaf
    node_value = tt.TensorDict(
        {k: torch.full(entry, 3 - i, dtype=d) for i, (k, d) in enumerate(_SOURCE_DTYPES.items())}, entry
    )
    expected = {}
    for k, leaf in _mixed_dtypes().items():
        expected[k] = leaf.clone()
        expected[k][torch_index] = torch.zeros_like(expected[k][torch_index]).copy_(value)  # copy_ casts
    out = td.at[index].set(value) if functional else td.at[index].set_(value)
    assert out is not td if functional else out is td
    for k, leaf in expected.items():
        assert_equal(out[k], leaf)
    for k, leaf in expected.items():
        leaf[torch_index] = torch.zeros_like(leaf[torch_index]).copy_(node_value[k])
    out = out.at[index].set(node_value) if functional else out.at[index].set_(node_value)
    for k, leaf in expected.items():
        assert_equal(out[k], leaf)
    if functional:
        assert all(bool((v == 0).all()) for v in td.values())


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")  # torch deprecates quantized creation
def test_a_quantized_value_is_refused_naming_the_key_before_any_write() -> None:
    torch_refuses = torch.zeros(3)
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8)
    with pytest.raises(RuntimeError, match="quantized"):
        torch_refuses.copy_(q)  # what torch does; can_cast says yes
    assert torch.can_cast(q.dtype, torch.float32)
    full = tt.TensorDict({"a": torch.zeros(3), "b": torch.zeros(3)}, [3])
    for write in (
        lambda t: t.update_({"a": torch.ones(3), "b": q}),
        lambda t: t.copy_(tt.TensorDict({"a": torch.ones(3), "b": q}, [3])),
        lambda t: t.at[[0, 1, 2]].set_(tt.TensorDict({"a": torch.ones(3), "b": q}, [3])),
        lambda t: t.at[:].set_(q),
        lambda t: t.at[torch.tensor([0, 1, 2])].set(q),
    ):
        _refused_untouched(full, write, WriteTypeError, r"'[ab]' holds torch.float32 and the value is a quantized")


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")  # torch deprecates quantized creation
def test_quantized_leaves_take_float_values_as_torch_does() -> None:
    q = torch.quantize_per_tensor(torch.zeros(3), 0.5, 0, torch.quint8)
    td = tt.TensorDict({"q": q.clone()}, [3])
    td.update_({"q": torch.tensor([1.0, 2.0, 3.0])})
    expected = q.clone().copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(td["q"].dequantize(), expected.dequantize())


def _lazy_views() -> dict[str, torch.Tensor]:
    base = torch.tensor([1 + 2j, 3 - 4j, 5 + 6j])
    return {"conj": torch.conj(base.clone()), "neg": torch.conj(base.clone()).imag, "plain": torch.ones(3)}


@pytest.mark.parametrize("op", ["update_", "copy_", "zero_", "at_set_"])
def test_lazy_conj_and_neg_views_are_written_as_tensor_methods_write_them(op: str) -> None:
    views = _lazy_views()
    assert views["conj"].is_conj() and views["neg"].is_neg()
    td = tt.TensorDict(views, [3])
    src = {"conj": torch.tensor([7j, 8.0, 9.0]), "neg": torch.tensor([1.0, 2.0, 3.0]), "plain": torch.zeros(3)}
    expected = _lazy_views()
    if op == "zero_":
        td.zero_()
        for v in expected.values():
            v.zero_()
    elif op == "at_set_":
        td.at[torch.tensor([0, 2])].set_(tt.TensorDict({k: v[[0, 2]] for k, v in src.items()}, [2]))
        for k, v in expected.items():
            v[torch.tensor([0, 2])] = src[k][[0, 2]]
    else:
        td.update_(src) if op == "update_" else td.copy_(tt.TensorDict(src, [3]))
        for k, v in expected.items():
            v.copy_(src[k])
    for k, v in expected.items():
        assert td[k] is views[k]
        assert torch.equal(td[k].resolve_conj().resolve_neg(), v.resolve_conj().resolve_neg()), k


def test_lazy_views_keep_every_other_refusal() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    td = tt.TensorDict({"conj": _lazy_views()["conj"], "p": param}, [3])
    before = td["conj"].resolve_conj().clone()
    with pytest.raises(WriteError, match=r"'p' is a leaf that requires grad"):
        td.zero_()
    assert torch.equal(td["conj"].resolve_conj(), before)
