"""A ``from_module`` node (``nn.Parameter`` leaves) and optimiser state through every path that saves them.

Each path is compared, in the same run, with the same module's tensors as a plain dict of
Parameters and buffers through the same path in plain torch: the loaded leaves have the types,
``requires_grad``, autograd-leaf status, values and tied identities torch gives its dict.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

import tdtree as tt
from tdtree._optstate import rebuild_adam_state
from tdtree.errors import SerializationError
from tdtree.nn import from_module
from tdtree.optim import AdamState, adam, adam_init, sgd
from tdtree.testing import assert_equal


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 4), nn.Linear(4, 4))
    m[3].weight = m[2].weight  # tied: one Parameter at two paths
    m[0].bias.requires_grad_(False)
    m(torch.randn(5, 3))  # the batch norm's running stats move off their initial values
    return m


def _torch_dict(m: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(m.named_parameters(remove_duplicate=False)), **dict(m.named_buffers())}


def _torch_save(obj, weights_only: bool):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=weights_only)


PATHS = {
    "pickle": lambda x: pickle.loads(pickle.dumps(x)),
    "deepcopy": copy.deepcopy,
    "torch.load": lambda x: _torch_save(x, weights_only=False),
    "torch.load(weights_only=True)": lambda x: _torch_save(x, weights_only=True),
}


def _facts(t: torch.Tensor) -> tuple:
    return type(t), t.requires_grad, t.is_leaf, t.grad_fn, t.dtype, tuple(t.shape)


def _check_like_torch(back: tt.TensorDict, ref_back: dict[str, torch.Tensor], source: nn.Module) -> None:
    flat = {".".join(k): v for k, v in back.items(include_nested=True, leaves_only=True)}
    assert sorted(flat) == sorted(ref_back)
    for name, ref in ref_back.items():
        assert _facts(flat[name]) == _facts(ref), name
        torch.testing.assert_close(flat[name].detach(), ref.detach(), rtol=0, atol=0)
        torch.testing.assert_close(flat[name].detach(), _torch_dict(source)[name].detach(), rtol=0, atol=0)
    tied, ref_tied = flat["2.weight"] is flat["3.weight"], ref_back["2.weight"] is ref_back["3.weight"]
    assert tied == ref_tied


@pytest.mark.parametrize("path", sorted(PATHS))
def test_from_module_node_round_trips_as_torch_round_trips_its_dict(path: str) -> None:
    m = _model()
    node, ref = from_module(m), _torch_dict(m)
    assert type(node["0", "weight"]) is nn.Parameter
    back, ref_back = PATHS[path](node), PATHS[path](ref)
    assert type(back) is tt.TensorDict and back.batch_size == node.batch_size
    assert type(ref_back["0.weight"]) is nn.Parameter and not ref_back["0.bias"].requires_grad
    _check_like_torch(back, ref_back, m)
    # what comes back trains: a gradient reaches every Parameter that requires grad, as in torch
    loss = tt.nn.functional_call(m, back, torch.randn(5, 3)).square().sum()
    loss.backward()
    assert back["0", "weight"].grad is not None and back["0", "bias"].grad is None


def test_a_shared_from_module_node_round_trips_with_its_tags() -> None:
    node = from_module(_model()).share_memory()
    back = pickle.loads(pickle.dumps(node))
    assert type(back) is tt.TensorDict[tt.Shared, tt.Locked]
    assert all(
        type(v) is type(w) and v.requires_grad == w.requires_grad
        for v, w in zip(back.values(True, True), node.values(True, True))
    )
    assert all(v.is_shared() for v in back.values(True, True))


def test_tt_save_and_load_keep_parameters_and_requires_grad(tmp_path) -> None:
    m = _model()
    node, ref = from_module(m), _torch_dict(m)
    tt.save(node, tmp_path / "params.pt")
    back = tt.load(tmp_path / "params.pt")
    ref_back = _torch_save(ref, weights_only=True)
    # one difference from torch.save, documented: tt.save keeps values, not sharing between leaves, so
    # a tied weight loads as two equal Parameters (functional_call reads a tied group's first path)
    ref_back["3.weight"] = nn.Parameter(ref_back["3.weight"].detach().clone())
    _check_like_torch(back, ref_back, m)
    on_meta = tt.load(tmp_path / "params.pt", device="meta")
    assert type(on_meta["0", "weight"]) is nn.Parameter and on_meta["0", "weight"].is_meta


def test_tt_load_of_a_file_without_the_parameter_lists_gives_tensors(tmp_path) -> None:
    # files written before the lists existed load as they did: values, as plain tensors
    path = tmp_path / "params.pt"
    node = from_module(_model())
    tt.save(node, path)
    payload = torch.load(path, weights_only=True)
    doc = json.loads(payload["tdtree"])
    del doc["parameters"], doc["grad"]
    payload["tdtree"] = json.dumps(doc)
    torch.save(payload, path)
    back = tt.load(path)
    assert all(type(v) is torch.Tensor and not v.requires_grad for v in back.values(True, True))
    assert_equal(back, node.apply(torch.Tensor.detach))


def test_memmap_keeps_values_as_plain_tensors(tmp_path) -> None:
    node = from_module(_model())
    mapped = node.memmap(tmp_path / "mm")
    again = tt.load_memmap(tmp_path / "mm")
    for back in (mapped, again, pickle.loads(pickle.dumps(mapped))):
        assert all(type(v) is torch.Tensor and not v.requires_grad for v in back.values(True, True))
        assert_equal(back, node.apply(torch.Tensor.detach), check_tags=False)


class _OwnTensor(torch.Tensor):
    pass


def test_a_pickled_leaf_of_another_tensor_subclass_is_refused() -> None:
    node = tt.TensorDict({"w": torch.ones(2).as_subclass(_OwnTensor)})
    with pytest.raises(SerializationError, match=r"value at 'w' is a _OwnTensor, not a tensor, a Parameter or a node"):
        pickle.loads(pickle.dumps(node))


# -- optimiser state ---------------------------------------------------------------------------------


def _step(m: nn.Module):
    m.eval()  # the batch norm reads its running stats instead of writing them (no writes inside grad)
    params, buffers = from_module(m, split=True)
    x = torch.randn(5, 3)
    grads = torch.func.grad(lambda p: tt.nn.functional_call(m, (p, buffers), x).square().sum())(params)
    return params, grads


def test_adam_state_loads_with_weights_only_as_torch_adam_state_does() -> None:
    m = _model()
    params, grads = _step(m)
    _, state = adam(params, grads, adam_init(params), lr=0.1)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    named = list(m.named_parameters())  # torch's state is indexed in this order (a tied weight once)
    for name, p in named:
        p.grad = grads[tuple(name.split("."))].clone() if p.requires_grad else None
    opt.step()
    ref = _torch_save(opt.state_dict(), weights_only=True)
    for weights_only in (True, False):
        back = _torch_save(state, weights_only=weights_only)
        assert type(back) is AdamState
        torch.testing.assert_close(back.step, state.step, rtol=0, atol=0)
        assert_equal(back.exp_avg, state.exp_avg)
        assert_equal(back.exp_avg_sq, state.exp_avg_sq)
        for i, (name, _) in enumerate(named):
            if i in ref["state"]:
                key = tuple(name.split("."))
                torch.testing.assert_close(back.exp_avg[key], ref["state"][i]["exp_avg"])
                torch.testing.assert_close(back.exp_avg_sq[key], ref["state"][i]["exp_avg_sq"])
    assert sorted(ref["state"]) == [i for i, (_, p) in enumerate(named) if p.requires_grad]
    assert type(copy.deepcopy(state)) is AdamState


def test_sgd_momentum_state_loads_with_weights_only() -> None:
    params, grads = _step(_model())
    _, buf = sgd(params, grads, lr=0.1, momentum=0.9)
    assert_equal(_torch_save(buf, weights_only=True), buf)


def test_adam_state_loads_in_a_process_that_imported_only_tdtree(tmp_path) -> None:
    params, _ = _step(_model())
    torch.save({"state": adam_init(params)}, tmp_path / "opt.pt")
    code = (
        "import sys, torch, tdtree\n"
        f"state = torch.load({str(tmp_path / 'opt.pt')!r}, weights_only=True)['state']\n"
        "assert 'tdtree.optim' not in sys.modules, 'tdtree.optim was imported'\n"
        "print(type(state).__name__, float(state.step), type(state.exp_avg).__name__)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["AdamState", "0.0", "TensorDict"]


class _CraftedState:
    def __init__(self, step):
        self.step = step

    def __reduce__(self):
        return rebuild_adam_state, (self.step, {}, {})


@pytest.mark.parametrize("step", ["0", torch.zeros(2), torch.zeros((), dtype=torch.int64)], ids=["str", "shape", "int"])
def test_adam_state_reconstruction_validates_its_step(step) -> None:
    buf = io.BytesIO()
    torch.save(_CraftedState(step), buf)
    buf.seek(0)
    with pytest.raises(
        SerializationError, match="cannot unpickle an AdamState: its step should be a 0-dim float tensor"
    ):
        torch.load(buf, weights_only=True)
