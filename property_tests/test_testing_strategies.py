"""tdtree.testing's strategies: each option reaches its cases, health checks pass, registration works.

Health checks are on here (the suite's profiles turn ``too_slow`` off): ``HEALTHY``.
"""

from __future__ import annotations

import enum
import math
import os

import pytest
import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

import tdtree as tt
from tdtree import Locked, Memmap, Shared
from tdtree._pickle import reference
from tdtree.testing import (
    ALL_DTYPES,
    TAG_SETS,
    assert_equal,
    available_devices,
    batch_sizes,
    same_structure,
    tensorclasses,
    tensordicts,
)
from tdtree.testing.laws import assert_tags

HEALTHY = settings(max_examples=25, deadline=None, suppress_health_check=(), derandomize=True, database=None)
SEARCH = settings(max_examples=300, phases=[Phase.generate], database=None, derandomize=True)


def reach(strategy: st.SearchStrategy, predicate) -> object:
    """A draw of ``strategy`` satisfying ``predicate`` (fails when none is found)."""
    return find(strategy, predicate, settings=SEARCH)


def one(strategy: st.SearchStrategy) -> object:
    return reach(strategy, lambda _: True)


def storages(td) -> list[int]:
    return [x.untyped_storage().data_ptr() for x in tt.tree.leaves(td) if x.untyped_storage().nbytes()]


def sub_nodes(td):
    return [v for _, v in td.items(include_nested=True) if isinstance(v, tt.TensorDict)]


@HEALTHY
@given(
    tensordicts(
        tags=True, aliasing=True, dtypes=ALL_DTYPES, elements="special", noncontiguous=True, extra_batch_dims=True
    )
)
def test_every_option_at_once_is_healthy_and_tags_hold(td):
    assert td.tags in TAG_SETS
    assert_tags(lambda n: n, td)  # every sub-node carries the root's tags, every claim is true
    for x in tt.tree.leaves(td):
        assert x.dtype in ALL_DTYPES


def test_each_tag_set_is_reached():
    for tags in TAG_SETS:
        assert reach(tensordicts(tags=True, min_keys=1), lambda td, tags=tags: td.tags == tags).tags == tags
    assert {one(tensordicts(tags=[Shared, Locked])).tags} == {frozenset({Shared, Locked})}
    with pytest.raises(ValueError, match="no node carries"):
        tensordicts(tags=[Memmap, Shared])


def test_memmap_directories_are_removed_after_each_example():
    seen: list[str] = []

    @settings(max_examples=5, database=None, derandomize=True)
    @given(tensordicts(tags=[Memmap], min_keys=1, zero_size=False, empty_nodes=False))
    def draw(td):
        prefix = reference(tt.tree.leaves(td)[0])[1]  # the directory the leaf is mapped from
        assert os.path.isdir(prefix)
        seen.append(os.path.dirname(prefix))

    draw()
    assert seen and not any(os.path.exists(d) for d in seen)


def test_aliasing_reaches_shared_and_overlapping_storages():
    def shares(td):
        ptrs = storages(td)
        return len(ptrs) != len(set(ptrs))

    def overlaps(td):
        spans = sorted(
            (x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()) for x in tt.tree.leaves(td) if x.numel()
        )
        return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))

    aliased = tensordicts(aliasing=True, dtypes=(torch.float32,), min_keys=2)
    assert shares(reach(aliased, shares))
    assert overlaps(reach(aliased, overlaps))
    with pytest.raises(NoSuchExample):
        reach(tensordicts(dtypes=(torch.float32,), min_keys=2), shares)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_is_drawn(dtype):
    found = reach(
        tensordicts(dtypes=ALL_DTYPES, min_keys=1), lambda td: any(x.dtype == dtype for x in tt.tree.leaves(td))
    )
    assert any(x.dtype == dtype for x in tt.tree.leaves(found))


SPECIAL = {
    "nan": lambda x: x.is_floating_point() and bool(x.isnan().any()),
    "inf": lambda x: x.is_floating_point() and bool((x == math.inf).any()),
    "-inf": lambda x: x.is_floating_point() and bool((x == -math.inf).any()),
    "-0.0": lambda x: x.is_floating_point() and bool(((x == 0) & x.signbit()).any()),
    "subnormal": lambda x: (
        x.is_floating_point() and bool(((x != 0) & (x.abs() < torch.finfo(x.dtype).smallest_normal)).any())
    ),
    "int64 min": lambda x: x.dtype == torch.int64 and bool((x == torch.iinfo(torch.int64).min).any()),
    "uint8 max": lambda x: x.dtype == torch.uint8 and bool((x == 255).any()),
    "complex nan": lambda x: x.is_complex() and bool(x.isnan().any()),
}


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_elements_are_reached(name):
    test = SPECIAL[name]
    nodes = tensordicts(dtypes=ALL_DTYPES, elements="special", min_keys=1, zero_size=False)
    assert any(test(x) for x in tt.tree.leaves(reach(nodes, lambda td: any(test(x) for x in tt.tree.leaves(td)))))


def test_normal_elements_are_finite():
    with pytest.raises(NoSuchExample):
        reach(
            tensordicts(dtypes=ALL_DTYPES, min_keys=1),
            lambda td: any(SPECIAL["nan"](x) or SPECIAL["inf"](x) for x in tt.tree.leaves(td)),
        )


@HEALTHY
@given(tensordicts(empty_nodes=False, zero_size=False, extra_batch_dims=True), st.data())
def test_empty_and_zero_size_only_on_request(td, data):
    assert all(len(n.keys()) for n in sub_nodes(td))
    assert all(s > 0 for x in tt.tree.leaves(td) for s in x.shape)


def test_empty_sub_nodes_and_zero_size_dims_are_drawn_by_default():
    reach(tensordicts(), lambda td: any(not len(n.keys()) for n in sub_nodes(td)))
    reach(tensordicts(), lambda td: 0 in td.batch_size)


@HEALTHY
@given(st.data())
def test_pinned_keys_and_batch_size(data):
    keys = [("next", "reward"), "obs", ("next", "done")]
    td = data.draw(tensordicts(batch_size=[3], keys=keys, extra_batch_dims=True))
    assert td.batch_size == torch.Size([3])
    assert set(td.keys(include_nested=True, leaves_only=True)) == set(keys)
    with pytest.raises(ValueError, match="both a leaf and a sub-node"):
        tensordicts(keys=["a", ("a", "b")])


def test_devices_draw_each_given_device():
    assert available_devices()[0] == torch.device("cpu")
    for device in available_devices():
        td = one(tensordicts(devices=[device], min_keys=1, empty_nodes=False))
        assert all(x.device == device for x in tt.tree.leaves(td))
    assert one(tensordicts(devices=["meta"], min_keys=1, empty_nodes=False)).device == torch.device("meta")


def layout(value) -> list:
    """Per leaf: dtype, device, shape, strides, offset, and which earlier leaf shares its storage."""
    leaves = tt.tree.leaves(value)
    ptrs = [x.untyped_storage().data_ptr() for x in leaves]
    return [
        (
            x.dtype,
            x.device,
            x.shape,
            x.stride(),
            x.storage_offset(),
            ptrs.index(p) if x.untyped_storage().nbytes() else None,
        )
        for x, p in zip(leaves, ptrs)
    ]


@HEALTHY
@given(tensordicts(tags=True, aliasing=True, noncontiguous=True, extra_batch_dims=True), st.data())
def test_same_structure_keeps_structure_layout_and_aliasing(td, data):
    twin = data.draw(same_structure(td))
    assert tt.tree.structure(twin) == tt.tree.structure(td)
    assert layout(twin) == layout(td)
    assert not set(storages(twin)) & set(storages(td))
    pair = data.draw(same_structure((td, tt.tree.leaves(td))))
    assert tt.tree.structure(pair) == tt.tree.structure((td, tt.tree.leaves(td)))


class Phase_(enum.Enum):
    TRAIN = 1
    EVAL = 2


class Obs(tt.TensorClass):
    pixels: torch.Tensor
    position: torch.Tensor | None = None


class Step(tt.TensorClass):
    obs: Obs
    reward: torch.Tensor
    extras: tt.TensorDict
    phase: Phase_ = Phase_.TRAIN
    episode: int = 0
    note: str | None = None


@HEALTHY
@given(tensorclasses(Step, tags=True, dtypes=ALL_DTYPES, elements="special"))
def test_tensorclasses_follow_the_annotations(step):
    assert type(step) is Step and type(step.obs) is Obs
    assert step.obs.batch_size == step.batch_size == step.extras.batch_size
    assert isinstance(step.phase, Phase_) and isinstance(step.episode, int)
    assert step.note is None or isinstance(step.note, str)
    assert step.tags in TAG_SETS
    assert_tags(lambda s: s, step)


def test_tensorclasses_reach_optional_fields_and_take_overrides():
    reach(tensorclasses(Obs), lambda o: o.position is None)
    reach(tensorclasses(Obs), lambda o: o.position is not None)
    fixed = one(tensorclasses(Obs, fields={"pixels": lambda bs: st.just(torch.ones(*bs, 2))}, batch_size=[3]))
    assert_equal(fixed.pixels, torch.ones(3, 2))


def test_tensorclasses_name_a_field_they_cannot_draw():
    class Odd(tt.TensorClass):
        x: torch.Tensor
        thing: object = None

    with pytest.raises(TypeError, match="cannot draw field 'thing'"):
        one(tensorclasses(Odd))


def test_from_type_draws_nodes_tagged_types_and_user_tensorclasses():
    assert isinstance(one(st.from_type(tt.TensorDict)), tt.TensorDict)
    reach(st.from_type(tt.TensorDict), lambda td: bool(td.tags))
    for tags in TAG_SETS:
        if tags:
            drawn = one(st.from_type(tt.TensorDict[tuple(tags)]))
            assert drawn.tags >= tags and isinstance(drawn, tt.TensorDict[tuple(tags)])

    class Made(tt.TensorClass):  # a class made after the strategies were registered
        x: torch.Tensor

    assert type(one(st.from_type(Made))) is Made
    assert type(one(st.from_type(Step))) is Step


def test_registration_is_what_the_hypothesis_entry_point_runs():
    from _tdtree_plugins.strategies import setup

    setup()  # a second registration changes nothing
    assert type(one(st.from_type(Obs))) is Obs


def test_batch_sizes_and_zero_size_flag():
    assert all(s >= 1 for s in reach(tensordicts(zero_size=False), lambda td: td.ndim == 3).batch_size)
    assert one(batch_sizes(min_dims=2, max_dims=2, min_side=1, max_side=1)) == torch.Size([1, 1])
