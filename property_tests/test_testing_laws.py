"""tdtree.testing's laws: each passes on a correct function and catches a planted bug, naming the key."""

from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, find, settings
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import (
    batch_sizes,
    check_compiles,
    check_grad,
    check_pure,
    check_tags,
    check_vmap,
    tensorclasses,
    tensordicts,
)
from tdtree.testing.laws import LawError, assert_compiles, assert_grad, assert_pure, assert_tags, assert_vmap

FEW = settings(max_examples=8, deadline=None, derandomize=True, database=None)
# a compiling law reports its first failure unshrunk (each example compiles afresh)
UNSHRUNK = settings(FEW, max_examples=3, phases=[Phase.explicit, Phase.generate])
ONE_KEY = dict(keys=["a"], zero_size=False)
floats = tensordicts(dtypes=(torch.float32,), tags=True, noncontiguous=True, aliasing=True)
mapped = tensordicts(
    batch_size=batch_sizes(min_dims=1, min_side=1), dtypes=(torch.float32, torch.int64), min_keys=1, empty_nodes=False
)
doubles = tensordicts(dtypes=(torch.float64, torch.int64), extra_batch_dims=True)


# -- pure ---------------------------------------------------------------------------------------


def test_pure_holds_for_a_pure_function():
    check_pure(lambda td: td.apply(torch.sin).exclude(*list(td.keys())[:1]), floats, settings=FEW)


def test_pure_catches_an_in_place_write():
    with pytest.raises(LawError, match=r"check_pure\(.*\): fn wrote into its input at key 'a': _version 0 -> 1"):
        check_pure(
            lambda td: td.apply(lambda x: x.mul_(2)), tensordicts(dtypes=(torch.float32,), **ONE_KEY), settings=FEW
        )


def test_pure_catches_a_write_the_version_counter_misses():
    def sneaky(td):
        td["a"].data.add_(1)  # .data has its own version counter
        return td

    with pytest.raises(LawError, match=r"fn changed its input at key 'a' without a recorded write: first at index"):
        check_pure(sneaky, tensordicts(dtypes=(torch.float32,), **ONE_KEY), settings=FEW)


def test_pure_shows_the_example_as_drawn():
    with pytest.raises(LawError) as err:
        assert_pure(lambda t: t.add_(1), torch.zeros(2))
    assert "torch.float32 (2,) [0.0, 0.0]" in str(err.value)


# -- tags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        lambda td: td.apply(torch.sin),
        lambda td: td.select(*list(td.keys())[:1]),
        lambda td: td.clone(recurse=False),
        lambda td: td.unsqueeze(0),
        lambda td: tt.stack([td, td]),
        lambda td: td.unlock(),
    ],
    ids=["apply", "select", "shallow-clone", "unsqueeze", "stack", "unlock-loses-Locked-only"],
)
def test_tags_hold_for_library_operations(op):
    rule = op.__code__.co_names[-1:] != ("unlock",)  # unlock makes tags, as lock() does: not the rule's
    check_tags(op, floats, rule=rule, settings=FEW)


def test_tags_catch_a_false_claim():
    def swaps_storage(td):
        shared = td.share_memory()
        shared["a"].set_(torch.zeros_like(shared["a"]))  # outside tdtree's reach: the claim is now false
        return shared

    with pytest.raises(LawError, match=r"it claims Shared but the leaf at key 'a' is not in shared memory"):
        check_tags(swaps_storage, tensordicts(**ONE_KEY), rule=False, settings=FEW)


def test_tags_catch_a_tag_the_rule_does_not_give():
    with pytest.raises(
        LawError, match=r"carries \{Locked\}; the rule gives \{\} \(the leaf at key 'a' is new storage\)"
    ):
        check_tags(lambda td: (td + 1).lock(), tensordicts(tags=[tt.Locked], **ONE_KEY), settings=FEW)


def test_tags_without_the_rule_check_claims_only():
    rebuilt = lambda td: tt.TensorDict(dict(td.items()), td.batch_size)  # noqa: E731 - built from leaves: untagged
    check_tags(rebuilt, tensordicts(tags=True), rule=False, settings=FEW)
    check_tags(lambda td: td.share_memory(), tensordicts(), rule=False, settings=FEW)
    with pytest.raises(LawError, match="the rule gives"):
        assert_tags(rebuilt, tt.TensorDict({"a": torch.ones(2)}, [2]).lock())


# -- compile ------------------------------------------------------------------------------------


def test_compiles_holds_without_graph_breaks():
    check_compiles(
        lambda td: td.apply(torch.sin),
        tensordicts(dtypes=(torch.float32,)),
        backend="eager",
        settings=settings(FEW, max_examples=4),
    )


def test_compiles_catches_a_graph_break():
    def branches(td):
        return td.apply(torch.sin) if bool(td["a"].sum() > 0) else td

    with pytest.raises(LawError, match=r"torch.compile\(fullgraph=True\) failed \(frames compiled: 0"):
        check_compiles(branches, tensordicts(dtypes=(torch.float32,), **ONE_KEY), backend="eager", settings=UNSHRUNK)


def test_compiles_catches_a_recompile():
    calls = [0]

    def counts(td):  # reads a global counter, which changes between the two compiled calls
        calls[0] += 1
        return td.apply(lambda x: x * ((calls[0] + 1) // 2))

    a = tt.TensorDict({"a": torch.ones(2)}, [2])
    with pytest.raises(LawError, match=r"recompiled for a second input of the same structure \(frames compiled: 1"):
        assert_compiles(counts, (a,), (a.apply(torch.neg),), backend="eager")


def test_compiles_catches_a_result_that_differs_from_eager():
    def knows(td):
        return td.apply(lambda x: x + 1 if torch.compiler.is_compiling() else x)

    with pytest.raises(LawError, match=r"compiled and eager results differ .*: at key 'a': values differ"):
        check_compiles(knows, tensordicts(dtypes=(torch.float32,), **ONE_KEY), backend="eager")


def test_compile_vmap_and_grad_laws_run_with_no_deadline():
    # each example compiles or traces afresh: a 1 ms deadline, given or in the loaded profile, would fail
    # every example of a correct function (hypothesis's DeadlineExceeded), so these laws set none
    tight = settings(FEW, max_examples=2, deadline=1)
    floats32 = tensordicts(dtypes=(torch.float32,), min_keys=1)
    check_compiles(lambda td: td.apply(torch.sin), floats32, backend="eager", settings=tight)
    check_vmap(lambda td: td.apply(torch.cos), mapped, settings=tight)
    check_grad(lambda td: td.apply(lambda x: x * x if x.is_floating_point() else x), doubles, settings=tight)
    previous = settings._current_profile
    settings.register_profile("tdtree-tight-deadline", tight)
    settings.load_profile("tdtree-tight-deadline")
    try:
        check_compiles(lambda td: td * 2, floats32, backend="eager")
        check_vmap(lambda td: td * 2, mapped)
    finally:
        settings.load_profile(previous)


# -- vmap ---------------------------------------------------------------------------------------


def test_vmap_holds_for_per_element_functions():
    check_vmap(lambda td: td.apply(lambda x: x * 2 + 1), mapped, settings=FEW)
    check_vmap(
        lambda td, t: (td.apply(torch.sin), t.sum()),
        mapped.map(lambda td: (td, torch.ones(td.batch_size[0], 2))),
        settings=FEW,
    )


def test_vmap_catches_a_function_that_is_not_per_element():
    calls = [0]

    def stateful(td):
        calls[0] += 1
        return td.apply(lambda x: x * calls[0])

    with pytest.raises(LawError, match=r"tdtree.vmap\(fn\) differs from stacking fn over the slices: at key 'a'"):
        check_vmap(stateful, tensordicts(batch_size=[3], **ONE_KEY), settings=FEW)


def test_vmap_refuses_inputs_it_cannot_map():
    with pytest.raises(ValueError, match="batch_sizes\\(min_dims=1, min_side=1\\)"):
        assert_vmap(lambda td: td, tt.TensorDict({"a": torch.ones(0)}, [0]))


def test_vmap_passes_over_draws_with_no_tensor_to_map():
    # tensordicts(min_keys=1) draws nodes whose only entries are empty sub-nodes: tdtree.vmap (as torch.vmap)
    # has nothing to map there, and the law passes over them instead of failing on its own kit's draws
    default = tensordicts(batch_size=(3,), min_keys=1)
    leafless = find(
        default,
        lambda td: not len(td.keys(include_nested=True, leaves_only=True)),
        settings=settings(FEW, max_examples=500),
    )
    seen = []

    def doubled(td):
        seen.append(len(td.keys(include_nested=True, leaves_only=True)))
        return td * 2

    check_vmap(doubled, st.sampled_from([leafless, tt.TensorDict({"x": torch.ones(3)}, [3])]), settings=FEW)
    assert seen and all(seen)  # fn ran on the node with a leaf, never on the leafless one
    check_vmap(lambda td: td * 2, default, settings=settings(FEW, max_examples=30))


# -- grad ---------------------------------------------------------------------------------------


def test_grad_holds_for_a_smooth_function():
    check_grad(lambda td: td.apply(lambda x: torch.sin(x) * x if x.is_floating_point() else x), doubles, settings=FEW)


def test_grad_catches_a_wrong_gradient():
    def detached(td):
        return td.apply(lambda x: x * x.detach())  # the gradient misses a factor 2

    with pytest.raises(LawError, match=r"check_grad\(.*\): d/dkey 'a' along a random direction: torch.func.grad gives"):
        check_grad(detached, tensordicts(dtypes=(torch.float64,), **ONE_KEY), settings=FEW)


def test_grad_asks_for_float64():
    with pytest.raises(ValueError, match="float64"):
        assert_grad(lambda td: td, tt.TensorDict({"a": torch.ones(2)}, [2]))


class Particle(tt.TensorClass):
    position: torch.Tensor
    velocity: torch.Tensor
    mass: float = 1.0


def test_laws_take_tensorclasses():
    particles = tensorclasses(
        Particle,
        dtypes=(torch.float64,),
        batch_size=batch_sizes(min_dims=1, min_side=1),
        fields={"mass": st.floats(0.1, 10.0)},
    )
    step = lambda p: p.replace(position=p.position * 2 + p.mass, velocity=torch.sin(p.velocity))  # noqa: E731
    check_pure(step, particles, settings=FEW)
    check_tags(lambda p: p.apply(torch.sin), tensorclasses(Particle, tags=True, dtypes=(torch.float32,)), settings=FEW)
    check_grad(step, particles, settings=FEW)
