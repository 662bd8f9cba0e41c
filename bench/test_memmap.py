"""Memory-mapped nodes and one-file saves, case by case after tensordict's benchmarks/common/memmap_benchmarks_test.py.

Data: ``td_memmap`` is tensordict's, 30 keys of shape (3, 40), batch (3, 40),
memmapped; the weights are those of ``nn.Transformer(d_model=128, nhead=4,
dim_feedforward=256)``: the default Transformer's 184 tensors and nesting, at
8 MB instead of 176 MB so that a round takes milliseconds on two cores.

Rows: tdtree (``memmap`` / ``load_memmap``, ``tdtree.save`` / ``tdtree.load``),
tensordict (``memmap`` / ``load_memmap``, and its ``.tdz`` archive or a pickled
TensorDict for one file), and pytree, the plain floor: a dict of the same
mapped tensors for indexing, and ``torch.save`` / ``torch.load`` of the model's
``state_dict()`` for everything written to disk (``mmap=True`` to map it).
Each case names what it times in its docstring.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import optree
import pytest
import torch
from torch import nn

import tdtree
from tdtree.nn import from_module

from .impls import Impl, tensordict

INDICES = {"int": 0, "slice": slice(1, 3), "tensor": torch.tensor([0, 2])}


@functools.cache
def _model() -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested-tensor advice for batch_first=False
        return nn.Transformer(d_model=128, nhead=4, dim_feedforward=256)


def _weights(impl: Impl, model: nn.Module) -> Any:
    """The model's parameters and buffers as the implementation holds them."""
    if impl.name == "tdtree":
        return from_module(model)
    if impl.name == "tensordict":
        return tensordict.TensorDict.from_module(model)
    return model.state_dict()


def _td_memmap(impl: Impl, path: Path) -> Any:
    """30 keys of shape (3, 40), batch (3, 40), memmapped under ``path`` (pytree: a dict of the mapped leaves)."""
    source = {str(i): torch.zeros(3, 40) + i for i in range(30)}
    if impl.name == "tensordict":
        return tensordict.TensorDict(source, [3, 40]).memmap_(path)
    mapped = tdtree.TensorDict(source, [3, 40]).memmap(path)
    return mapped.to_dict() if impl.name == "pytree" else mapped


# -- indexing a memmapped node ------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
@pytest.mark.parametrize("index", list(INDICES))
def test_memmaptd_index(benchmark, impl: Impl, index: str, tmp_path: Path) -> None:
    """``td[index]`` on a memmapped node (pytree: ``x[index]`` on every mapped leaf)."""
    td = _td_memmap(impl, tmp_path / "mm")
    out = benchmark(impl.getitem(td, INDICES[index]))
    assert out["3"].shape == torch.zeros(3, 40)[INDICES[index]].shape


@pytest.mark.pytree
@pytest.mark.filterwarnings(r"ignore:as_tensor\(\) keeps the MemoryMappedTensor:FutureWarning")
def test_memmaptd_index_astensor(benchmark, impl: Impl, tmp_path: Path) -> None:
    """``td[0]`` as tensors. tensordict: ``td[0].as_tensor()`` (in 0.15 it keeps the
    MemoryMappedTensor leaves and warns, every call); tdtree's and the dicts' leaves
    are plain tensors already, so their rows are ``td[0]``."""
    td = _td_memmap(impl, tmp_path / "mm")
    if impl.name == "tensordict":
        out = benchmark(lambda: td[0].as_tensor())
    else:
        out = benchmark(impl.getitem(td, 0))
        assert type(out["3"]) is torch.Tensor
    assert out["3"].shape == (40,)


@pytest.mark.pytree
@pytest.mark.parametrize("index", list(INDICES))
def test_memmaptd_index_op(benchmark, impl: Impl, index: str, tmp_path: Path) -> None:
    """``td[index]`` then ``+ 1`` on every leaf (tensordict, as in its suite: ``td[0].apply(lambda x: x + 1)``)."""
    td = _td_memmap(impl, tmp_path / "mm")
    idx = INDICES[index]
    if impl.name == "pytree":
        out = benchmark(lambda: optree.tree_map(lambda x: x[idx] + 1, td))
    else:
        out = benchmark(lambda: td[idx].apply(lambda x: x + 1))
    assert torch.equal(out["3"], torch.full_like(torch.zeros(3, 40)[idx], 4.0))


# -- writing weights to disk --------------------------------------------------------------


def _write(impl: Impl, weights: Any, path: Path) -> Any:
    """Write ``weights`` as a memmap directory (pytree: ``torch.save`` of the state dict to one file)."""
    if impl.name == "tdtree":
        return weights.memmap(path, existsok=True)
    if impl.name == "tensordict":
        return weights.memmap(path)
    return torch.save(weights, path.with_suffix(".pt"))


@pytest.mark.pytree
def test_serialize_weights(benchmark, impl: Impl, tmp_path: Path) -> None:
    """Memmap the model's weights (tdtree replaces the directory, written aside and renamed in;
    tensordict overwrites its files in place; pytree: ``torch.save(state_dict)``)."""
    weights = _weights(impl, _model())
    benchmark(_write, impl, weights, tmp_path / "weights")
    assert any(tmp_path.iterdir())


@pytest.mark.pytree
def test_serialize_model(benchmark, impl: Impl, tmp_path: Path) -> None:
    """As ``test_serialize_weights``, taking the weights from the module each round."""
    model = _model()
    benchmark(lambda: _write(impl, _weights(impl, model), tmp_path / "weights"))
    assert any(tmp_path.iterdir())


@pytest.mark.pytree
def test_load_memmap(benchmark, impl: Impl, tmp_path: Path) -> None:
    """Map saved weights back: ``load_memmap(prefix)``; pytree: ``torch.load(mmap=True, weights_only=True)``."""
    weights = _weights(impl, _model())
    path = tmp_path / "weights"
    _write(impl, weights, path)
    if impl.name == "tdtree":
        out = benchmark(tdtree.load_memmap, path)
    elif impl.name == "tensordict":
        out = benchmark(tensordict.TensorDict.load_memmap, path)
    else:
        out = benchmark(torch.load, path.with_suffix(".pt"), mmap=True, weights_only=True)
    leaf = out["encoder.norm.weight"] if impl.name == "pytree" else out["encoder", "norm", "weight"]
    assert torch.equal(leaf, _model().encoder.norm.weight.detach())


# -- one file ---------------------------------------------------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_serialize_weights_pickle(benchmark, impl: Impl, tmp_path: Path) -> None:
    """Save the weights to one file (``Impl.save``: ``tdtree.save``; tensordict: ``torch.save`` of the
    TensorDict; pytree: of the state dict); tdtree's goal: within 1.2x of the pytree row."""
    weights = _weights(impl, _model())
    benchmark(impl.save(weights, tmp_path / "weights.pt"))
    assert (tmp_path / "weights.pt").stat().st_size > 7_900_000


@pytest.mark.pytree
def test_serialize_model_archive(benchmark, impl: Impl, tmp_path: Path) -> None:
    """From the module to one file: ``tdtree.save(from_module(m))``; tensordict: its ``.tdz``
    archive, ``from_module(m).save(path)``; pytree: ``torch.save(m.state_dict())``."""
    model = _model()
    path = tmp_path / "model.tdz"
    if impl.name == "tensordict":
        benchmark(lambda: tensordict.TensorDict.from_module(model).save(path))
    else:
        benchmark(lambda: impl.save(_weights(impl, model), path)())
    assert path.stat().st_size > 7_900_000


@pytest.mark.pytree
@pytest.mark.quick
def test_load_archive(benchmark, impl: Impl, tmp_path: Path) -> None:
    """Load weights from one file: ``tdtree.load`` (safe: tensors and plain data only);
    tensordict: ``load_memmap`` of its ``.tdz`` archive; pytree: ``torch.load(weights_only=True)``.
    tdtree's goal: within 1.2x of the pytree row."""
    weights = _weights(impl, _model())
    if impl.name == "tdtree":
        tdtree.save(weights, tmp_path / "w.pt")
        out = benchmark(tdtree.load, tmp_path / "w.pt")
    elif impl.name == "tensordict":
        weights.save(tmp_path / "w.tdz")
        out = benchmark(tensordict.TensorDict.load_memmap, tmp_path / "w.tdz")
    else:
        torch.save(weights, tmp_path / "w.pt")
        out = benchmark(torch.load, tmp_path / "w.pt", weights_only=True)
    leaf = out["encoder.norm.weight"] if impl.name == "pytree" else out["encoder", "norm", "weight"]
    assert torch.equal(leaf, _model().encoder.norm.weight.detach())
