"""Where a node meets torch's own module functions (issue 27): load_state_dict with a node (a Mapping),
to_module, the flat dict for torch.func.functional_call, and a self-attention TDModule reading one
key three times, each against torch's or tensordict's own path in the same run."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from _tensordict_side import needs_tensordict, tensordict
from torch import nn

import tdtree as tt
from tdtree.errors import KeyMismatchError, KeyNotFoundError, WriteShapeError
from tdtree.nn import TDModule, TDSequential, from_module, state_dict, to_module


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_a_node_is_a_mapping_and_loads_into_a_module_as_its_state_dict_does() -> None:
    source, by_node, by_torch = model(0), model(1), model(1)
    source.train()(torch.randn(8, 3))  # moves the batch-norm buffers off their initial values
    params = from_module(source)
    assert isinstance(params, Mapping) and isinstance(params.lock(), Mapping)
    result = by_node.load_state_dict(params.flatten_keys("."))
    assert not result.missing_keys and not result.unexpected_keys
    by_torch.load_state_dict(source.state_dict())
    for (k, a), (j, b) in zip(by_node.state_dict().items(), by_torch.state_dict().items(), strict=True):
        assert k == j and torch.equal(a, b)


def test_to_module_writes_in_place_like_load_state_dict() -> None:
    source, target, reference = model(0), model(1), model(1)
    source.train()(torch.randn(8, 3))
    objects = [t for t in target.state_dict(keep_vars=True).values()]
    out = to_module(from_module(source), target)
    reference.load_state_dict(source.state_dict())
    assert out is target
    for (k, a), (j, b) in zip(target.state_dict().items(), reference.state_dict().items(), strict=True):
        assert k == j and torch.equal(a, b)
    assert [t for t in target.state_dict(keep_vars=True).values()] == objects  # the module's own tensors
    assert all(p.requires_grad and p.grad_fn is None for p in target.parameters())
    to_module(from_module(model(2)).flatten_keys("."), target)  # a flat node of dotted names too
    assert torch.equal(target[0].weight, model(2)[0].weight)


def test_to_module_refuses_before_writing_anything() -> None:
    target = model(1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    params = from_module(model(0))
    bad_shape = params.set(("2", "bias"), torch.zeros(3))
    with pytest.raises(WriteShapeError, match=r"'2.bias' has shape \(3,\) in the node and \(2,\)"):
        to_module(bad_shape, target)
    with pytest.raises(KeyNotFoundError, match=r"key '2.bais' not found.*Did you mean '2.bias'"):
        to_module(params.rename({("2", "bias"): ("2", "bais")}), target)
    with pytest.raises(KeyMismatchError, match=r"only in the second: .*1.running_mean"):
        to_module(params.exclude(("1", "running_mean")), target)
    for k, v in target.state_dict().items():
        assert torch.equal(v, before[k])
    to_module(params.exclude(("1", "running_mean")), target, strict=False)
    assert torch.equal(target[0].weight, params["0", "weight"])
    assert torch.equal(target[1].running_mean, before["1.running_mean"])


def test_state_dict_is_what_torch_func_functional_call_takes() -> None:
    m = model(0).eval()
    params = from_module(model(3))
    flat = state_dict(params)
    assert type(flat) is dict and sorted(flat) == sorted(m.state_dict())
    assert all(flat[k] is params[tuple(k.split("."))] for k in flat)
    x = torch.randn(5, 3)
    expected = torch.func.functional_call(m, dict(model(3).state_dict()), (x,))
    torch.testing.assert_close(torch.func.functional_call(m, flat, (x,)), expected, rtol=0, atol=0)
    torch.testing.assert_close(tt.nn.functional_call(m, params, x), expected, rtol=0, atol=0)


class SelfAttention(nn.Module):
    """One head of attention with query, key and value read from the same entry."""

    def __init__(self, d: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        scores = self.q(query) @ self.k(key).transpose(-1, -2) / key.shape[-1] ** 0.5
        return scores.softmax(-1) @ self.v(value)


@needs_tensordict
def test_self_attention_reads_one_key_three_times_as_tensordict_does() -> None:
    from tensordict.nn import TensorDictModule, TensorDictSequential

    attention = SelfAttention(8)
    ours = TDModule(attention, in_keys=["X", "X", "X"], out_keys=["Y"])
    theirs = TensorDictModule(attention, in_keys=["X", "X", "X"], out_keys=["Y"])
    assert ours.in_keys == theirs.in_keys == ["X", "X", "X"]
    x = torch.randn(2, 5, 8)
    out = ours(tt.TensorDict({"X": x}, batch_size=[2]))
    expected = theirs(tensordict.TensorDict({"X": x}, batch_size=[2]))["Y"]
    torch.testing.assert_close(out["Y"], expected, rtol=0, atol=0)
    torch.testing.assert_close(out["Y"], attention(x, x, x), rtol=0, atol=0)
    norm = nn.LayerNorm(8)
    chain = TDSequential(ours, TDModule(norm, "Y", "Z"))
    their_chain = TensorDictSequential(theirs, TensorDictModule(norm, ["Y"], ["Z"]))
    assert chain.in_keys == their_chain.in_keys == ["X"]
    torch.testing.assert_close(
        chain(tt.TensorDict({"X": x}, [2]))["Z"], their_chain(tensordict.TensorDict({"X": x}, [2]))["Z"], rtol=0, atol=0
    )
    with pytest.raises(ValueError, match=r"out_keys \['Y', 'Y'\] name a key twice"):
        TDModule(attention, ["X", "X", "X"], ["Y", "Y"])
