"""Laws of tdtree.optim and tdtree.nn.TDModule over drawn nodes."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import tdtree as tt
from tdtree.nn import TDModule, from_module, functional_call
from tdtree.optim import adam, adam_init, sgd
from tdtree.testing import assert_close, check_grad, check_vmap, same_structure, tensordicts
from tdtree.testing.laws import assert_pure, assert_tags

from ._snapshot import snapshot

floats = tensordicts(batch_size=(), dtypes=(torch.float32,), noncontiguous=True)
batched = tensordicts(dtypes=(torch.float32,), min_keys=1, noncontiguous=True)


def unchanged(tree: Any, before: list[tuple[torch.Tensor, int, torch.Tensor]]) -> None:
    after = tt.tree.leaves(tree)
    assert len(after) == len(before)
    for t, (orig, version, copy) in zip(after, before):
        assert t is orig and t._version == version and torch.equal(t, copy)


def grads_like(params: tt.TensorDict, seed: int) -> tt.TensorDict:
    gen = torch.Generator().manual_seed(seed)
    return tt.tree.map(lambda p: torch.randn(p.shape, generator=gen), params)


@given(floats, st.integers(0, 2**16), st.sampled_from([0.0, 0.9]))
def test_sgd_is_the_leafwise_update(params: tt.TensorDict, seed: int, momentum: float) -> None:
    grads = grads_like(params, seed)
    new, buf = assert_pure(lambda p, g: sgd(p, g, 0.1, momentum=momentum), params, grads)
    new2, _ = sgd(new, grads, 0.1, momentum=momentum, momentum_state=buf)
    assert tt.tree.structure(new2) == tt.tree.structure(params)
    factor = 1.0 + (1.0 + momentum)
    assert_close(new2, tt.tree.map(lambda p, g: p - 0.1 * factor * g, params, grads))
    # the rule: new storages drop the tags, unless no leaf holds data
    holds_data = any(t.numel() > 0 for t in tt.tree.leaves(params))
    tags = assert_tags(lambda p, g: sgd(p, g, 0.1)[0], params.lock(), grads.lock()).tags
    assert tags == (frozenset() if holds_data else frozenset({tt.Locked}))


@given(floats, st.integers(0, 2**16))
def test_adam_is_the_leafwise_update(params: tt.TensorDict, seed: int) -> None:
    grads = grads_like(params, seed)
    before = snapshot(params) + snapshot(grads)
    state = adam_init(params)
    new, state2 = adam(params, grads, state, lr=0.01)
    unchanged(params, before[: len(before) // 2])
    assert state.step.item() == 0 and state2.step.item() == 1
    # first step: m = 0.1 g, v = 0.001 g^2, so the update is lr * g / (|g| + eps')
    expected = tt.tree.map(lambda p, g: p - 0.01 * g / (g.abs() + 1e-8), params, grads)
    assert_close(new, expected, atol=1e-5, rtol=1e-4)
    assert_close(state2.exp_avg, tt.tree.map(lambda g: 0.1 * g, grads))


@given(batched, st.sampled_from(["new", ("deep", "new")]))
def test_tdmodule_is_set_of_the_output(td: tt.TensorDict, out_key: Any) -> None:
    leaf_keys = list(td.keys(include_nested=True, leaves_only=True))
    assume(leaf_keys)
    in_key = leaf_keys[0]
    before = snapshot(td)
    out = TDModule(nn.Identity(), [in_key], [out_key])(td)
    unchanged(td, before)
    value = td[in_key]
    assert out[out_key] is value
    assert_close(out.exclude(out_key if out_key == "new" else "deep"), td)
    assert out.batch_size == td.batch_size
    locked = TDModule(nn.Identity(), [in_key], [out_key])
    try:
        locked(td.lock())
    except tt.LockedError as err:
        assert "locked node" in str(err)
    else:
        raise AssertionError("a TDModule on a locked node must raise LockedError")


MLP = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
X = torch.linspace(-1, 1, 15, dtype=torch.float64).reshape(5, 3)


def test_functional_call_gradient_matches_finite_differences():
    """The grad law through functional_call, over parameters of the module's structure."""
    check_grad(
        lambda p: functional_call(MLP, p, X), same_structure(from_module(MLP)), settings=settings(max_examples=10)
    )


def test_ensemble_under_tdtree_vmap_is_each_member():
    """The vmap law over stacked parameters: each member's output, stacked."""
    params = from_module(MLP)
    stacked = tt.stack([params, params.apply(torch.sin), params.apply(torch.neg)])
    check_vmap(lambda p: functional_call(MLP, p, X), same_structure(stacked), settings=settings(max_examples=10))
