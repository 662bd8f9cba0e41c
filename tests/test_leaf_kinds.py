"""Leaves a node holds but an operation cannot take, and sources that are no mapping.

A node's operations are made for strided tensors; the constructor does not check a leaf's
kind (construction stays cheap). The operations that cannot take a kind name it: ``memmap()``
of a meta leaf is a ``MemmapError`` naming the key and ``memmap_like``; ``share_memory()``
keeps meta leaves as they are and refuses, before touching any leaf, a leaf whose subclass
runs torch's operations itself (a DTensor, whose own ``share_memory_()`` crashes the
process). ``TensorDict(source)`` of a non-mapping is a ``TypeError`` naming what it takes.
The in-place writers (``update_``, ``at[idx].set_``) and ``at[idx].set`` refuse a sparse,
nested, quantized or mkldnn value with ``WriteTypeError`` naming the kind, writing nothing, and
a write that would reach a leaf of such a kind (but a quantized leaf that ``update_``, ``copy_``
or ``fill_`` writes, as torch does).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

import tdtree as tt
from tdtree.errors import LeafError, MemmapError, WriteTypeError

# the constructors of nested, sparse compressed and quantized tensors warn that their API is not stable
pytestmark = pytest.mark.filterwarnings(
    "ignore:The PyTorch API of nested tensors:UserWarning",
    "ignore:Sparse (CSR|CSC):UserWarning",
    "ignore:torch.quantize_per_tensor:UserWarning",
    # torch's pickle of a quantized tensor reads its TypedStorage
    "ignore:TypedStorage is deprecated:UserWarning",
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


# Every operation on a node holding a leaf of each kind, against the same operation on a plain dict of
# the same tensors: where torch computes it for the dict, the node gives the same leaves (of the same
# kind); where torch fails, the node raises LeafError naming the key, the kind and the conversion, with
# torch's error chained. save and memmap write strided tensors only: they refuse every such kind by
# name (SerializationError / MemmapError), before writing anything.


def _to_strided(t: torch.Tensor) -> torch.Tensor:
    if t.is_nested:
        return torch.nested.to_padded_tensor(t, 0.0)
    if t.is_quantized:
        return t.dequantize()
    return t.to_dense() if t.layout != torch.strided else t


def _assert_same_leaf(got: object, want: object) -> None:
    assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor), (got, want)
    assert (got.layout, got.is_nested, got.is_quantized, got.dtype) == (
        want.layout,
        want.is_nested,
        want.is_quantized,
        want.dtype,
    )
    assert torch.equal(_to_strided(got), _to_strided(want))


def _assert_same_tree(got: object, want: object) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            _assert_same_tree(g, w)
    elif isinstance(want, dict):
        assert isinstance(got, tt.TensorDict), got
        assert sorted(got.keys()) == sorted(want), (list(got.keys()), list(want))
        for k, w in want.items():
            _assert_same_tree(got[k], w)
    else:
        _assert_same_leaf(got, want)


def _dict_map(fn: Callable[[torch.Tensor], torch.Tensor], d: dict) -> dict:
    return {k: _dict_map(fn, v) if isinstance(v, dict) else fn(v) for k, v in d.items()}


def _storages_nbytes(d: dict) -> int:
    # the leaves of these dicts hold storages of their own: nbytes is their sum
    return sum(_storages_nbytes(v) if isinstance(v, dict) else v.untyped_storage().nbytes() for v in d.values())


def _dict_leaves(d: dict) -> list[torch.Tensor]:
    return [x for v in d.values() for x in (_dict_leaves(v) if isinstance(v, dict) else [v])]


def _dict_unzip(fn: Callable[[torch.Tensor], tuple], d: dict, count: int) -> tuple:
    """The tuple of ``count`` dicts whose i-th holds ``fn(leaf)[i]`` at each leaf's key."""
    mapped = _dict_map(lambda v: tuple(fn(v)), d)

    def part(m: dict, i: int) -> dict:
        return {k: part(v, i) if isinstance(v, dict) else v[i] for k, v in m.items()}

    return tuple(part(mapped, i) for i in range(count))


def _pickled(x: object) -> object:
    import pickle

    return pickle.loads(pickle.dumps(x))


# name -> (the operation on a node, the same operation on the plain dict {"a": ..., "n": {"k": ...}})
OPS: dict[str, tuple[Callable[[tt.TensorDict], object], Callable[[dict], object]]] = {
    "nbytes": (lambda td: td.nbytes, _storages_nbytes),
    "td[0]": (lambda td: td[0], lambda d: _dict_map(lambda v: v[0], d)),
    "td[0:1]": (lambda td: td[0:1], lambda d: _dict_map(lambda v: v[0:1], d)),
    "td + 1": (lambda td: td + 1, lambda d: _dict_map(lambda v: v + 1, d)),
    "td * 2": (lambda td: td * 2, lambda d: _dict_map(lambda v: v * 2, d)),
    "-td": (lambda td: -td, lambda d: _dict_map(torch.neg, d)),
    "apply(neg)": (lambda td: td.apply(torch.neg), lambda d: _dict_map(torch.neg, d)),
    "clone": (lambda td: td.clone(), lambda d: _dict_map(torch.clone, d)),
    "to(float64)": (lambda td: td.to(torch.float64), lambda d: _dict_map(lambda v: v.to(torch.float64), d)),
    "to(cpu)": (lambda td: td.to("cpu"), lambda d: _dict_map(lambda v: v.to("cpu"), d)),
    "reshape": (lambda td: td.reshape(2, 1), lambda d: _dict_map(lambda v: v.reshape(2, 1, *v.shape[1:]), d)),
    "unsqueeze": (lambda td: td.unsqueeze(0), lambda d: _dict_map(lambda v: v.unsqueeze(0), d)),
    "stack": (lambda td: tt.stack([td, td]), lambda d: _dict_map(lambda v: torch.stack([v, v]), d)),
    "cat": (lambda td: tt.cat([td, td]), lambda d: _dict_map(lambda v: torch.cat([v, v]), d)),
    "update": (lambda td: td.update({"b": torch.ones(2)}), lambda d: {**d, "b": torch.ones(2)}),
    "select": (lambda td: td.select("n"), lambda d: {"n": d["n"]}),
    "exclude": (lambda td: td.exclude("a"), lambda d: {"n": d["n"]}),
    "flatten_keys": (lambda td: td.flatten_keys(), lambda d: {"a": d["a"], "n.k": d["n"]["k"]}),
    "share_memory": (lambda td: td.share_memory(), lambda d: _dict_map(lambda v: v.clone().share_memory_(), d)),
    "pickle": (_pickled, _pickled),
    "deepcopy": (copy.deepcopy, copy.deepcopy),
    "detach": (lambda td: td.detach(), lambda d: _dict_map(torch.Tensor.detach, d)),
    "contiguous": (lambda td: td.contiguous(), lambda d: _dict_map(torch.Tensor.contiguous, d)),
    "td - td": (lambda td: td - td, lambda d: _dict_map(lambda v: v - v, d)),
    "1 - td": (lambda td: 1 - td, lambda d: _dict_map(lambda v: 1 - v, d)),
    "td * td": (lambda td: td * td, lambda d: _dict_map(lambda v: v * v, d)),
    "td / 2": (lambda td: td / 2, lambda d: _dict_map(lambda v: v / 2, d)),
    "td == td": (lambda td: td == td, lambda d: _dict_map(lambda v: v == v, d)),
    "td < 1": (lambda td: td < 1, lambda d: _dict_map(lambda v: v < 1, d)),
    "exp": (lambda td: td.exp(), lambda d: _dict_map(torch.exp, d)),
    "abs": (lambda td: td.abs(), lambda d: _dict_map(torch.abs, d)),
    "clamp": (lambda td: td.clamp(0, 1), lambda d: _dict_map(lambda v: torch.clamp(v, 0, 1), d)),
    "where": (
        lambda td: tt.where(torch.tensor([True, False]), td, td),
        lambda d: _dict_map(
            lambda v: torch.where(torch.tensor([True, False]).reshape(2, *[1] * (v.dim() - 1)), v, v), d
        ),
    ),
    "sum(0)": (lambda td: td.sum(0), lambda d: _dict_map(lambda v: torch.sum(v, dim=(0,)), d)),
    "mean(0)": (lambda td: td.mean(0), lambda d: _dict_map(lambda v: torch.mean(v, dim=(0,)), d)),
    "amax(0)": (lambda td: td.amax(0), lambda d: _dict_map(lambda v: torch.amax(v, dim=(0,)), d)),
    "max(0)": (lambda td: tuple(td.max(0)), lambda d: _dict_unzip(lambda v: torch.max(v, 0), d, 2)),
    "all()": (lambda td: td.all(), lambda d: torch.all(torch.stack([torch.all(v) for v in _dict_leaves(d)]))),
    "any()": (lambda td: td.any(), lambda d: torch.any(torch.stack([torch.any(v) for v in _dict_leaves(d)]))),
    "norm": (lambda td: td.norm(), lambda d: _dict_map(lambda v: torch.norm(v, 2), d)),
    "unbind": (lambda td: td.unbind(0), lambda d: _dict_unzip(lambda v: v.unbind(0), d, 2)),
    "split": (lambda td: td.split(1, 0), lambda d: _dict_unzip(lambda v: v.split(1, 0), d, 2)),
    "td[mask]": (
        lambda td: td[torch.tensor([True, False])],
        lambda d: _dict_map(lambda v: v[torch.tensor([True, False])], d),
    ),
    "td[[1, 0]]": (lambda td: td[[1, 0]], lambda d: _dict_map(lambda v: v[[1, 0]], d)),
    "td[tensor]": (lambda td: td[torch.tensor([1, 0])], lambda d: _dict_map(lambda v: v[torch.tensor([1, 0])], d)),
    "view": (lambda td: td.view(2, 1), lambda d: _dict_map(lambda v: v.view(2, 1, *v.shape[1:]), d)),
    "permute": (
        lambda td: td.unsqueeze(1).permute(1, 0),
        lambda d: _dict_map(lambda v: v.unsqueeze(1).permute(1, 0, *range(2, v.dim() + 1)), d),
    ),
    "expand": (
        lambda td: td.unsqueeze(0).expand(3, 2),
        lambda d: _dict_map(lambda v: v.unsqueeze(0).expand(3, *v.shape), d),
    ),
    "flatten": (
        lambda td: td.unsqueeze(1).flatten(0, 1),
        lambda d: _dict_map(lambda v: v.unsqueeze(1).flatten(0, 1), d),
    ),
    "named_apply": (lambda td: td.named_apply(lambda k, x: x.clone()), lambda d: _dict_map(torch.clone, d)),
    "apply(·, td)": (lambda td: td.apply(torch.mul, td), lambda d: _dict_map(lambda v: torch.mul(v, v), d)),
    "zeros_like": (lambda td: torch.zeros_like(td), lambda d: _dict_map(torch.zeros_like, d)),
}
# the kinds an operation refuses although torch would compute it for the plain tensor, by design: a
# nested tensor's pickle (or deep copy) would not rebuild, and share_memory refuses a tensor subclass
# that runs torch's operations itself (a jagged nested tensor is one)
REFUSED = {("pickle", "nested_jagged"), ("deepcopy", "nested_jagged"), ("share_memory", "nested_jagged")}
# norm takes floating point and complex leaves (a TypeError for others): a quantized one is named
REFUSED.add(("norm", "quantized"))
# the operations that refuse a kind before torch runs (nothing of torch's to chain)
UPFRONT = {"pickle", "deepcopy", "norm"}
# made by the node constructor's check, tested on its own below
BUILDABLE = sorted(k for k in KINDS if k != "nested_strided")


def _kind_node(make: Callable[[], torch.Tensor]) -> tuple[tt.TensorDict, dict]:
    value = make()
    plain = {"a": _dense(2, 3), "n": {"k": value}}
    return tt.TensorDict(plain, [2]), plain


@pytest.mark.parametrize("name", BUILDABLE)
@pytest.mark.parametrize("op", sorted(OPS))
def test_each_operation_works_as_torch_or_names_the_leaf(name: str, op: str) -> None:
    make, words = KINDS[name]
    td, plain = _kind_node(make)
    on_node, on_dict = OPS[op]
    try:
        want = on_dict(plain)
    except Exception:  # noqa: BLE001 - torch's own failure on the plain tensor, whatever it is
        with pytest.raises(LeafError) as err:
            on_node(td)
        _assert_names(err, "('n', 'k')", words)
        if op not in UPFRONT:
            assert isinstance(err.value.__cause__, (RuntimeError, TypeError, ValueError, IndexError)), err.value
        return
    if (op, name) in REFUSED:
        with pytest.raises(LeafError) as err:
            on_node(td)
        _assert_names(err, "('n', 'k')", words)
        return
    got = on_node(td)
    if op == "nbytes":
        assert got == want
    elif op == "pickle":
        _assert_same_tree(got, plain)
    else:
        _assert_same_tree(got, want)
    assert "'k'" in repr(td) or "k:" in repr(td), repr(td)


@pytest.mark.parametrize("name", BUILDABLE)
def test_save_and_memmap_refuse_each_kind_by_name_and_write_nothing(name: str, tmp_path) -> None:
    make, words = KINDS[name]
    td, _ = _kind_node(make)
    with pytest.raises(tt.errors.SerializationError) as err:
        tt.save(td, tmp_path / "td.pt")
    _assert_names(err, "('n', 'k')", words)
    with pytest.raises(MemmapError) as err:
        td.memmap(tmp_path / "mm")
    _assert_names(err, "('n', 'k')", words)
    with pytest.raises(MemmapError) as err:
        td.memmap_like(tmp_path / "like")
    _assert_names(err, "('n', 'k')", words)
    assert list(tmp_path.iterdir()) == []


def test_a_nested_tensor_of_strided_layout_is_refused_at_the_constructor() -> None:
    make, words = KINDS["nested_strided"]
    value = make()
    with pytest.raises(RuntimeError) as torch_err:  # torch's own: it has no sizes to compare with a batch
        _ = value.shape
    with pytest.raises(LeafError) as err:
        tt.TensorDict({"a": _dense(2, 3), "n": {"k": value}}, [2])
    _assert_names(err, "('n', 'k')", words)
    assert type(err.value.__cause__) is type(torch_err.value)


def test_a_failure_on_a_strided_leaf_stays_as_it_was() -> None:
    # the failing leaf is the one named: a node that also holds a sparse leaf does not make another
    # leaf's failure a LeafError, before or after it in leaf order
    sparse = _dense(2, 3).to_sparse()

    def fails_on_strided(x: torch.Tensor) -> torch.Tensor:
        if x.layout == torch.strided:
            raise RuntimeError("fn refuses a strided leaf")
        return x.clone()

    for data in ({"a": _dense(2), "s": sparse}, {"a": sparse, "b": _dense(2)}):
        td = tt.TensorDict(data, [2])
        with pytest.raises(RuntimeError, match="fn refuses a strided leaf") as err:
            td.apply(fails_on_strided)
        assert not isinstance(err.value, LeafError)
    # a node of strided leaves fails as torch fails: a dtype torch refuses is not a kind
    with pytest.raises(RuntimeError) as err:
        tt.TensorDict({"a": torch.ones(2, dtype=torch.bool)}, [2]) - True
    assert not isinstance(err.value, LeafError)
    # a user's error of another type on a sparse leaf stays the user's
    with pytest.raises(KeyError):
        tt.TensorDict({"s": sparse}, [2]).apply(lambda x: {}["missing"])


def test_what_works_per_leaf_works_where_a_foreach_kernel_refuses_the_kind() -> None:
    # torch._foreach_add has no jagged nested kernel, while torch.add takes a jagged nested tensor
    make, _ = KINDS["nested_jagged"]
    value = make()
    with pytest.raises(NotImplementedError):
        torch._foreach_add([value], 1)
    td = tt.TensorDict({"a": _dense(2, 3), "j": value}, [2])
    _assert_same_tree(td + 1, {"a": _dense(2, 3) + 1, "j": value + 1})
    _assert_same_tree(1 + td, {"a": 1 + _dense(2, 3), "j": 1 + value})
    _assert_same_tree(td.neg(), {"a": -_dense(2, 3), "j": -value})


def test_a_nested_tensor_of_strided_layout_in_a_node_of_batch_size_0_dims() -> None:
    # no batch dim to compare: the constructor takes it; operations then work as torch does or name it
    make, words = KINDS["nested_strided"]
    value = make()
    td = tt.TensorDict({"a": _dense(3), "n": {"k": value}})
    assert "nested tensor (layout torch.strided)" in repr(td)
    _assert_same_tree(td + 1, {"a": _dense(3) + 1, "n": {"k": value + 1}})
    _assert_same_tree(td.clone(), {"a": _dense(3), "n": {"k": value.clone()}})
    with pytest.raises(RuntimeError):
        value.unsqueeze(0)
    with pytest.raises(LeafError) as err:
        td.unsqueeze(0)
    _assert_names(err, "('n', 'k')", words)


# Writes into a node that holds such a leaf: torch writes some kinds in place and refuses others, and
# a call over several leaves that meets a refusal has written the leaves before it. The writers refuse
# a write that would reach such a leaf, naming it, before anything is written; a write that reaches
# only strided leaves of the same node is done.


def _holding(name: str) -> tt.TensorDict:
    # a nested tensor of strided layout has no sizes to check a batch size against: batch size ()
    batch = [] if name == "nested_strided" else [2]
    return tt.TensorDict({"a": _dense(2, 3), "n": {"x": _dense(2)}, "z": KINDS[name][0]()}, batch)


def _writes(td: tt.TensorDict, name: str) -> dict[str, Callable[[], object]]:
    writes: dict[str, Callable[[], object]] = {
        "zero_": td.zero_,
        "copy_": lambda: td.copy_(td.clone()),
        "fill_ of the leaf": lambda: td.fill_("z", 1.0),
        "update_": lambda: td.update_({"a": torch.ones(2, 3), "z": KINDS[name][0]()}),
    }
    if td.batch_size:
        writes["at[0].set_ of a number"] = lambda: td.at[0].set_(1.0)
        writes["at[0].set_ of a row"] = lambda: td.at[0].set_(td.exclude("z")[1].set("z", _dense(3)))
        writes["at[0].set of a number"] = lambda: td.at[0].set(1.0)
    return writes


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_write_reaching_such_a_leaf_is_refused_and_writes_nothing(name: str) -> None:
    words = KINDS[name][1]
    td = _holding(name)
    writes = _writes(td, name)
    if name == "quantized":  # written by update_, copy_ and fill_, as Tensor.copy_ / fill_ write it
        writes = {k: v for k, v in writes.items() if not k.startswith(("update_", "copy_", "fill_"))}
    for what, write in writes.items():
        before = _versions(td.exclude("z"))
        with pytest.raises(WriteTypeError) as err:
            write()
        _assert_names(err, "'z'", words)
        assert "does not write" in str(err.value), what
        _assert_unchanged(td.exclude("z"), before)


def test_a_quantized_leaf_is_written_as_torch_writes_it() -> None:
    td = _holding("quantized")
    want = {k: v.clone() for k, v in td.items(include_nested=True, leaves_only=True)}
    td.copy_(td.apply(lambda t: t.clone()))
    td.update_({"a": torch.ones(2, 3), "z": _dense(2, 3) + 1})
    want["a"] = torch.ones(2, 3)
    want["z"].copy_(_dense(2, 3) + 1)
    td.fill_("z", 3)
    want["z"].fill_(3)
    for key, value in want.items():
        got = td[key]
        assert got.is_quantized == value.is_quantized, key
        if value.is_quantized:
            got, value = got.dequantize(), value.dequantize()
        assert torch.equal(got, value), key


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_write_reaching_strided_leaves_only_is_done(name: str) -> None:
    td = _holding(name)
    for _ in range(2):  # the second write finds the node's leaf kinds known
        td.update_({"a": torch.ones(2, 3)})
        td.fill_("n", 5.0)
        want = {"a": torch.ones(2, 3), "x": torch.full((2,), 5.0)}
        assert torch.equal(td["a"], want["a"]) and torch.equal(td["n", "x"], want["x"])
        td.update_({"a": torch.zeros(2, 3), "n": {"x": torch.zeros(2)}})
        assert not td["a"].any() and not td["n", "x"].any()
