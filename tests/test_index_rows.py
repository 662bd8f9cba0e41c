"""``buf.at[t].set_(step)`` with an int ``t`` and a node ``step``: the row write of a rollout buffer.

Checked against the same writes into a plain dict of tensors (``leaf[t] = value``): nested buffers,
negative rows, rows read from the buffer itself (every value read before the first write), inside
``tdtree.vmap``; every refusal (a cast, a broadcast, a bad row, a leaf requiring grad) writes nothing.
"""

from __future__ import annotations

from typing import Any

import optree
import pytest
import torch

import tdtree as tt
from tdtree.errors import KeyMismatchError, WriteError, WriteIndexError, WriteShapeError, WriteTypeError

T, B = 6, 3


def _source(seed: int, *lead: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(*lead, 4, generator=g),
        "action": torch.randint(5, lead, generator=g),
        "done": torch.rand(lead, generator=g) < 0.5,
        "next": {"obs": torch.randn(*lead, 4, generator=g), "reward": torch.randn(lead, generator=g)},
    }


def _buffer() -> tt.TensorDict:
    return tt.TensorDict(_source(0, T, B), [T, B])


def _dict_write(tree: dict[str, Any], row: int, step: dict[str, Any]) -> None:
    for leaf, value in zip(optree.tree_leaves(tree), optree.tree_leaves(step)):
        leaf[row] = value


def _assert_matches(node: tt.TensorDict, tree: dict[str, Any]) -> None:
    got, want = tt.tree.leaves(node), optree.tree_leaves(tree)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _snapshot(node: tt.TensorDict) -> list[tuple[torch.Tensor, int]]:
    return [(x.clone(), x._version) for x in tt.tree.leaves(node)]


def _assert_unchanged(node: tt.TensorDict, before: list[tuple[torch.Tensor, int]]) -> None:
    for x, (value, version) in zip(tt.tree.leaves(node), before):
        assert torch.equal(x, value) and x._version == version


@pytest.mark.parametrize("rows", [range(T), [-1, 0, -T, 2]], ids=["forward", "negative"])
def test_row_writes_equal_dict_writes(rows: Any) -> None:
    buf, plain = _buffer(), _source(0, T, B)
    storages = [x.untyped_storage().data_ptr() for x in tt.tree.leaves(buf)]
    for i, t in enumerate(rows):
        step = _source(100 + i, B)
        assert buf.at[t].set_(tt.TensorDict(step, [B])) is buf
        _dict_write(plain, t, step)
    _assert_matches(buf, plain)
    assert [x.untyped_storage().data_ptr() for x in tt.tree.leaves(buf)] == storages


def test_a_row_of_the_buffer_itself_is_read_before_writing() -> None:
    buf, plain = _buffer(), _source(0, T, B)
    buf.at[1].set_(buf[0])
    _dict_write(plain, 1, optree.tree_map(lambda x: x[0].clone(), plain))
    _assert_matches(buf, plain)
    shifted = buf[1:3]  # rows 1, 2 written to rows 2, 3 in one call each; values overlap the targets
    buf.at[2].set_(shifted[0])
    _dict_write(plain, 2, optree.tree_map(lambda x: x[1].clone(), plain))
    _assert_matches(buf, plain)


def test_a_locked_buffer_is_written_and_keeps_its_tags() -> None:
    buf = _buffer().lock()
    step = _source(7, B)
    assert buf.at[0].set_(tt.TensorDict(step, [B])) is buf
    assert buf.tags == frozenset({tt.Locked})
    plain = _source(0, T, B)
    _dict_write(plain, 0, step)
    _assert_matches(buf, plain)


def _bad_steps() -> list[tuple[str, Any, Any]]:
    step = _source(5, B)
    wider = {**step, "next": {**step["next"], "reward": step["next"]["reward"].double()}}
    narrow = {**step, "action": step["action"].to(torch.int32)}
    float_action = {**step, "action": step["action"].float()}
    other_keys = {**step, "extra": torch.zeros(B)}
    return [  # update_'s casting rule: within a dtype kind a value is cast, across kinds refused
        ("a float64 value of a float32 leaf", wider, None),
        ("an int32 value of an int64 leaf", narrow, None),
        ("a float value of an int leaf", float_action, WriteTypeError),
        ("other keys", other_keys, KeyMismatchError),
    ]


@pytest.mark.parametrize("case", _bad_steps(), ids=lambda c: c[0])
def test_values_off_the_fast_path_take_the_checked_path(case: tuple[str, Any, Any]) -> None:
    _, step, error = case
    buf, plain = _buffer(), _source(0, T, B)
    before = _snapshot(buf)
    if error is not None:
        with pytest.raises(error):
            buf.at[2].set_(tt.TensorDict(step, [B]))
        _assert_unchanged(buf, before)
        return
    buf.at[2].set_(tt.TensorDict(step, [B]))
    _dict_write(plain, 2, step)
    _assert_matches(buf, plain)


@pytest.mark.parametrize(
    ("row", "batch", "error"),
    [
        (T, [B], WriteIndexError),
        (-T - 1, [B], WriteIndexError),
        (0, [B + 1], WriteShapeError),
        (0, [], WriteShapeError),
    ],
)
def test_refused_rows_write_nothing(row: int, batch: list[int], error: type[Exception]) -> None:
    buf = _buffer()
    before = _snapshot(buf)
    step = _source(3, *batch) if batch != [B + 1] else _source(3, B + 1)
    with pytest.raises(error):
        buf.at[row].set_(tt.TensorDict(step, batch))
    _assert_unchanged(buf, before)


def test_a_non_contiguous_leaf_is_written() -> None:
    source = _source(0, T, B)
    source["obs"] = source["obs"].transpose(0, 1).contiguous().transpose(0, 1)
    buf, plain = tt.TensorDict(source, [T, B]), optree.tree_map(torch.clone, source)
    step = _source(4, B)
    buf.at[5].set_(tt.TensorDict(step, [B]))
    _dict_write(plain, 5, step)
    _assert_matches(buf, plain)


def test_a_leaf_requiring_grad_is_refused_and_nothing_written() -> None:
    source = _source(0, T, B)
    source["next"]["reward"].requires_grad_(True)  # the last leaf: the others come first
    buf = tt.TensorDict(source, [T, B])
    before = [(x.detach().clone(), x._version) for x in tt.tree.leaves(buf)]
    with pytest.raises(WriteError):
        buf.at[0].set_(tt.TensorDict(_source(1, B), [B]))
    for x, (value, version) in zip(tt.tree.leaves(buf), before):
        assert torch.equal(x.detach(), value) and x._version == version


def test_row_writes_inside_vmap_equal_dict_writes() -> None:
    buf, plain = _buffer(), _source(0, T, B)
    step = _source(9, B)
    tt.vmap(lambda b, s: b.at[4].set_(s), in_dims=(1, 0))(buf, tt.TensorDict(step, [B]))
    _dict_write(plain, 4, step)
    _assert_matches(buf, plain)


def test_row_write_compiles_to_one_graph_and_equals_eager() -> None:
    torch._dynamo.reset()
    buf, plain = _buffer(), _source(0, T, B)
    step = _source(8, B)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def write(b: tt.TensorDict, s: tt.TensorDict) -> tt.TensorDict:
        return b.at[3].set_(s)

    assert write(buf, tt.TensorDict(step, [B])) is buf
    _dict_write(plain, 3, step)
    _assert_matches(buf, plain)
