"""Leaves a node holds but an operation cannot take, and sources that are no mapping.

A node's operations are made for strided tensors; the constructor does not check a leaf's
kind (construction stays cheap). The operations that cannot take a kind name it: ``memmap()``
of a meta leaf is a ``MemmapError`` naming the key and ``memmap_like``; ``share_memory()``
keeps meta leaves as they are and refuses, before touching any leaf, a leaf whose subclass
runs torch's operations itself (a DTensor, whose own ``share_memory_()`` crashes the
process). ``TensorDict(source)`` of a non-mapping is a ``TypeError`` naming what it takes.
The in-place writers (``update_``, ``at[idx].set_``) and ``at[idx].set`` refuse a sparse,
nested, quantized or mkldnn value with ``WriteTypeError`` naming the kind, writing nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

import tdtree as tt
from tdtree.errors import MemmapError, WriteTypeError

# the constructors of nested, sparse compressed and quantized tensors warn that their API is not stable
pytestmark = pytest.mark.filterwarnings(
    "ignore:The PyTorch API of nested tensors:UserWarning",
    "ignore:Sparse (CSR|CSC):UserWarning",
    "ignore:torch.quantize_per_tensor:UserWarning",
)


def _dense(*shape: int) -> torch.Tensor:
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape)


# name -> (a tensor of the kind with a leading dim of 2, words its message must hold)
KINDS: dict[str, tuple[Callable[[], torch.Tensor], tuple[str, ...]]] = {
    "sparse_coo": (lambda: _dense(2, 3).to_sparse(), ("sparse_coo", "to_dense()")),
    "sparse_csr": (lambda: _dense(2, 3).to_sparse_csr(), ("sparse_csr", "to_dense()")),
    "sparse_csc": (lambda: _dense(2, 3).to_sparse_csc(), ("sparse_csc", "to_dense()")),
    "nested_strided": (
        lambda: torch.nested.nested_tensor([_dense(2, 3), _dense(2, 4)]),
        ("nested tensor", "torch.strided", "to_padded_tensor"),
    ),
    "nested_jagged": (
        lambda: torch.nested.nested_tensor([_dense(2, 3), _dense(4, 3)], layout=torch.jagged),
        ("nested tensor", "torch.jagged", "to_padded_tensor"),
    ),
    "quantized": (
        lambda: torch.quantize_per_tensor(_dense(2, 3), 0.5, 0, torch.quint8),
        ("quantized", "quint8", "dequantize()"),
    ),
}
if torch.backends.mkldnn.is_available():
    KINDS["mkldnn"] = (lambda: _dense(2, 3).to_mkldnn(), ("_mkldnn", "to_dense()"))


def _node() -> tt.TensorDict:
    return tt.TensorDict({"a": _dense(2, 3), "n": {"x": _dense(2)}}, [2])


def _versions(td: tt.TensorDict) -> list[tuple[int, torch.Tensor]]:
    return [(t._version, t.clone()) for t in td.values(include_nested=True, leaves_only=True)]


def _assert_unchanged(td: tt.TensorDict, before: list[tuple[int, torch.Tensor]]) -> None:
    for t, (version, value) in zip(td.values(include_nested=True, leaves_only=True), before):
        assert t._version == version
        assert torch.equal(t, value)


def _assert_names(err: pytest.ExceptionInfo[BaseException], key: str, words: tuple[str, ...]) -> None:
    msg = str(err.value)
    assert key in msg, msg
    for word in words:
        assert word in msg, (word, msg)


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> tuple[Callable[[], torch.Tensor], tuple[str, ...]]:
    return KINDS[request.param]


def test_at_set_refuses(kind) -> None:
    make, words = kind
    td = _node()
    before = _versions(td)
    for write in (td.at[0:2].set, td.at[0:2].set_, td.at[torch.tensor([1, 0])].set_):
        with pytest.raises(WriteTypeError) as err:
            write(make())  # of shape (2, 3): does not broadcast to the leaf ('n', 'x')
        _assert_names(err, "the value is", words)
    _assert_unchanged(td, before)


@pytest.mark.parametrize(
    "make", [lambda: _dense(2).to_sparse(), lambda: torch.quantize_per_tensor(_dense(2), 0.5, 0, torch.quint8)]
)
def test_at_set_refuses_a_value_of_the_batch_shape(make: Callable[[], torch.Tensor]) -> None:
    # a value that broadcasts to every leaf: refused where torch fails to read it, before any write
    td = _node()
    before = _versions(td)
    for write in (td.at[0:2].set, td.at[0:2].set_, td.at[torch.tensor([1, 0])].set_):
        with pytest.raises(WriteTypeError, match="the value is a (torch.sparse_coo|quantized)"):
            write(make())
    _assert_unchanged(td, before)


@pytest.mark.parametrize("locked", [True, False])
def test_update_in_place_refuses_and_writes_nothing(kind, locked: bool) -> None:
    make, words = kind
    td = _node().lock() if locked else _node()
    before = _versions(td)
    # "a" comes first and fits: it must not be written when "n.x"'s value is refused
    with pytest.raises(WriteTypeError) as err:
        td.update_({"a": torch.ones(2, 3), "n": {"x": make()}})
    _assert_names(err, "('n', 'x')", words)
    with pytest.raises(WriteTypeError) as err:  # of the leaf's dtype and shape: update_'s inline test
        td.update_({"n": {"x": torch.ones(2)}, "a": make()})
    _assert_names(err, "'a'", words)
    _assert_unchanged(td, before)


def test_refused_kinds_are_what_torch_cannot_write_into_a_strided_tensor(kind) -> None:
    """The kinds refused are the ones torch's own in-place writes refuse into a plain tensor too:
    the foreach copy update_ runs over leaves refuses each of them."""
    make, _ = kind
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch._foreach_copy_([_dense(2, 3), _dense(2, 3)], [_dense(2, 3), make()])


def test_memmap_of_a_meta_leaf_is_refused_and_memmap_like_makes_zeros(tmp_path) -> None:
    spec = tt.TensorDict({"img": torch.empty(4, 3, 2, device="meta", dtype=torch.uint8), "y": torch.zeros(4)}, [4])
    with pytest.raises(MemmapError) as err:
        spec.memmap(tmp_path / "values")
    msg = str(err.value)
    assert "'img'" in msg and "meta tensor" in msg and "memmap_like" in msg, msg
    assert [p.name for p in tmp_path.iterdir()] == []  # neither the directory nor a temporary one is left
    like = spec.memmap_like(tmp_path / "like")
    assert like["img"].shape == (4, 3, 2) and like["img"].dtype == torch.uint8
    assert torch.equal(like["img"], torch.zeros(4, 3, 2, dtype=torch.uint8))


@pytest.mark.parametrize(
    "source", [[("a", _dense(2))], (("a", _dense(2)),), [], "ab", 0, _dense(2), iter([("a", _dense(2))])]
)
def test_a_source_that_is_not_a_mapping_is_a_type_error(source) -> None:
    with pytest.raises(TypeError, match=r"source is a \w+; it is a mapping .* dict\(pairs\)"):
        tt.TensorDict(source, [2])


def test_a_source_that_is_not_a_mapping_is_refused_as_tensordict_refuses_it() -> None:
    import tensordict  # a test dependency, imported here as the other tests that compare with it do

    pairs = [("a", _dense(2))]
    with pytest.raises(ValueError, match="Mapping"):
        tensordict.TensorDict(pairs, [2])
    assert torch.equal(tt.TensorDict(dict(pairs), [2])["a"], tensordict.TensorDict(dict(pairs), [2])["a"])


def test_mapping_sources_keep_their_errors() -> None:
    # a mapping's own failures are not reported as "not a mapping"
    with pytest.raises(tt.errors.BatchSizeError):
        tt.TensorDict({"a": _dense(3)}, [2])
    with pytest.raises(TypeError) as err:
        tt.TensorDict({1: _dense(2)}, [2])
    assert "not a mapping" not in str(err.value) and "source is a" not in str(err.value)


def test_share_memory_keeps_meta_leaves() -> None:
    meta = torch.empty(2, 3, device="meta")
    x = _dense(2)
    shared = tt.TensorDict({"m": meta, "x": x}, [2]).share_memory()
    assert shared["m"].is_meta and shared["m"].shape == meta.shape and shared["m"].dtype == meta.dtype
    assert shared["x"].is_shared() and torch.equal(shared["x"], x) and not x.is_shared()
    only_meta = tt.TensorDict({"m": meta}, [2]).share_memory()
    assert only_meta["m"] is meta  # nothing to copy: the leaf itself
    assert {t.name for t in only_meta.tags} == {"Shared", "Locked"}


_DTENSOR_SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    import tdtree as tt
    from tdtree.errors import LeafError

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        w = distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [Replicate()])
        plain = torch.zeros(4)
        td = tt.TensorDict({"b": plain, "layer": {"w": w}}, [4])
        try:
            td.share_memory()
        except LeafError as err:
            print("refused:", err)
        else:
            print("shared")
        print("untouched:", not plain.is_shared(), torch.equal(w.to_local(), torch.arange(12.0).reshape(4, 3)))
        # the local shard, a plain tensor, is shared as any leaf
        local = td.set(("layer", "w"), w.to_local()).share_memory()
        print("local shared:", local["layer", "w"].is_shared())
    finally:
        dist.destroy_process_group()
    """
)


def test_share_memory_refuses_a_dtensor_leaf_before_touching_any() -> None:
    # in a subprocess: torch's own DTensor.share_memory_() ends the process with a segfault, which here
    # fails the test instead of killing pytest
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _DTENSOR_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused: share_memory: leaf ('layer', 'w') is a DTensor"), proc.stdout
    assert "to_local()" in lines[0]
    assert lines[1] == "untouched: True True"
    assert lines[2] == "local shared: True"


def test_share_memory_takes_subclasses_that_leave_operations_to_torch() -> None:
    class Tagged(torch.Tensor):  # a plain subclass: its storage is its data
        pass

    leaf = _dense(2, 3).as_subclass(Tagged)
    param = torch.nn.Parameter(_dense(2, 3))
    shared = tt.TensorDict({"t": leaf, "p": param}, [2]).share_memory()
    assert type(shared["t"]) is Tagged and shared["t"].is_shared()
    assert type(shared["p"]) is torch.nn.Parameter and shared["p"].is_shared()
    assert torch.equal(shared["t"], leaf) and torch.equal(shared["p"], param)
