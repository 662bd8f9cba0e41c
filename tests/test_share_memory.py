"""``share_memory()`` of weights: a copy is a leaf of autograd that keeps ``requires_grad`` and
``nn.Parameter``, and leaves already in torch's shared memory are kept, not copied.

Compared, in the same run, with plain torch: ``tensor.clone().share_memory_()`` (the old copy, which
autograd records), ``module.share_memory()`` (in place: Parameters stay Parameters and leaves), and
``Tensor.share_memory_()`` (a no-op on a shared tensor)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch import nn

import tdtree as tt
from tdtree.nn import from_module
from tdtree.testing import assert_equal


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    m[0].bias.requires_grad_(False)
    return m


def _leaves(td: tt.TensorDict) -> dict:
    return dict(td.items(include_nested=True, leaves_only=True))


def test_a_shared_copy_of_parameters_is_a_leaf_that_workers_can_receive() -> None:
    m = _model()
    node = from_module(m)
    # plain torch: the copy autograd records cannot be sent to another process
    recorded = m[0].weight.clone().share_memory_()
    assert recorded.grad_fn is not None
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor which requires_grad"):
        ForkingPickler.dumps(recorded)
    shared = node.share_memory()
    assert type(shared) is tt.TensorDict[tt.Shared, tt.Locked]
    torch_shared = {k: v for k, v in _model().share_memory().state_dict(keep_vars=True).items()}
    for key, leaf in _leaves(shared).items():
        given, ref = node[key], torch_shared[".".join(key)]
        assert type(leaf) is type(given) is type(ref), key
        assert leaf.requires_grad == given.requires_grad == ref.requires_grad, key
        assert leaf.is_leaf and leaf.grad_fn is None and leaf.is_shared(), key
        assert leaf.untyped_storage().data_ptr() != given.untyped_storage().data_ptr()
    assert_equal(shared.apply(torch.Tensor.detach), node.apply(torch.Tensor.detach), check_tags=False)
    ForkingPickler.dumps(shared)  # what a queue does: no refusal


def test_a_non_leaf_input_gives_a_leaf_that_requires_grad() -> None:
    x = torch.ones(3, requires_grad=True)
    shared = tt.TensorDict({"y": x * 2}).share_memory()
    assert shared["y"].is_leaf and shared["y"].requires_grad and type(shared["y"]) is torch.Tensor
    torch.testing.assert_close(shared["y"].detach(), torch.full((3,), 2.0))


def test_leaves_already_in_shared_memory_are_kept() -> None:
    m = _model().share_memory()  # torch moves the module's tensors in place
    node = from_module(m)
    shared = node.share_memory()
    assert type(shared) is tt.TensorDict[tt.Shared, tt.Locked]
    assert all(shared[k] is v for k, v in _leaves(node).items())
    assert shared.share_memory() is shared  # as Tensor.share_memory_() on a shared tensor
    again = shared.unlock().share_memory()
    assert all(again[k] is v for k, v in _leaves(node).items())
    # a node received from another process holds shared storage: pickling through torch's reductions
    # moves the storages into shared memory, and the node that arrives is kept as it is
    received = pickle.loads(ForkingPickler.dumps(from_module(_model())))
    assert all(received.share_memory()[k] is v for k, v in _leaves(received).items())


def test_one_leaf_outside_shared_memory_copies_all() -> None:
    a = torch.ones(3).share_memory_()
    node = tt.TensorDict({"a": a, "b": torch.zeros(3)})
    shared = node.share_memory()
    assert shared["a"] is not a and shared["a"].untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    assert all(v.is_shared() for v in _leaves(shared).values())


def test_a_view_with_autograd_history_is_copied() -> None:
    w = nn.Parameter(torch.ones(2, 3)).share_memory_()
    view = w.view(3, 2)  # in shared memory, but not a leaf: it cannot be sent
    shared = tt.TensorDict({"v": view}).share_memory()
    assert shared["v"] is not view and shared["v"].is_leaf and shared["v"].requires_grad


def test_leaves_mapped_from_files_are_copied(tmp_path) -> None:
    # is_shared() is True for a mapped file, but a file mapping cannot be sent, and a private one's
    # writes are not seen: the Shared claim is made true by a copy
    (tmp_path / "f").write_bytes(bytes(16))
    mapped = torch.from_file(str(tmp_path / "f"), shared=False, size=4)
    assert mapped.is_shared()
    shared = tt.TensorDict({"m": mapped}).share_memory()
    assert shared["m"].untyped_storage().data_ptr() != mapped.untyped_storage().data_ptr()
    memmapped = tt.TensorDict({"m": torch.ones(4)}).memmap(tmp_path / "mm")
    for node in (memmapped, tt.load_memmap(tmp_path / "mm", mode="c")):
        out = node.share_memory()
        assert type(out) is tt.TensorDict[tt.Shared, tt.Locked]
        assert out["m"].untyped_storage().data_ptr() != node["m"].untyped_storage().data_ptr()
        ForkingPickler.dumps(out)


def test_shared_weights_are_written_in_place_under_no_grad_as_torch_writes_them() -> None:
    shared = from_module(_model()).share_memory()
    ref = _model().share_memory()
    halves = shared.apply(lambda t: torch.full_like(t, 0.5))
    with pytest.raises(RuntimeError, match="requires grad"):
        ref[0].weight.copy_(halves["0", "weight"])
    with pytest.raises(tt.WriteError, match="requires grad"):
        shared.update_(halves)
    with torch.no_grad():
        assert shared.update_(halves) is shared
        for t in ref.state_dict(keep_vars=True).values():
            t.copy_(torch.full_like(t, 0.5))
    for key, leaf in _leaves(shared).items():
        ref_leaf = ref.state_dict(keep_vars=True)[".".join(key)]
        assert type(leaf) is type(ref_leaf) and leaf.requires_grad == ref_leaf.requires_grad and leaf.is_leaf
        torch.testing.assert_close(leaf.detach(), ref_leaf.detach(), rtol=0, atol=0)


def test_running_out_of_file_descriptors_names_the_strategy_and_the_fix() -> None:
    """Under the file_descriptor strategy each shared leaf holds an open file: with the limit lowered,
    share_memory() of 400 leaves fails with SharedMemoryError, the descriptors it opened are closed
    again, and with the file_system strategy the same node shares (torch's own share_memory_ of the
    same tensors fails the same way)."""
    code = textwrap.dedent(
        """
        import errno, os, resource, torch, tdtree as tt
        from tdtree.errors import SharedMemoryError
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        torch.multiprocessing.set_sharing_strategy("file_descriptor")
        td = tt.TensorDict({f"k{i}": torch.zeros(2) for i in range(400)}, [2])
        try:
            [torch.zeros(2).share_memory_() for _ in range(400)]
        except RuntimeError as err:
            print("torch:", "Too many open files" in str(err))
        before = len(os.listdir("/proc/self/fd"))
        try:
            td.share_memory()
        except SharedMemoryError as err:
            print("error:", err.errno == errno.EMFILE, isinstance(err, OSError), err)
        print("fds back:", len(os.listdir("/proc/self/fd")) == before)
        torch.multiprocessing.set_sharing_strategy("file_system")
        shared = td.share_memory()
        print("file_system:", all(v.is_shared() for v in shared.values()), sorted(t.name for t in shared.tags))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "torch: True"
    assert lines[1].startswith(
        "error: True True [Errno 24] share_memory() of a node of 400 leaves ran out of file descriptors"
    )
    assert "'file_descriptor' sharing strategy" in lines[1] and "may open 256" in lines[1]
    assert 'set_sharing_strategy("file_system")' in lines[1] and "RLIMIT_NOFILE" in lines[1]
    assert lines[2:] == ["fds back: True", "file_system: True ['Locked', 'Shared']"]
