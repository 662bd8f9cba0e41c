"""torch's private names that tdtree reads (``tdtree._torch_private``) still exist and still mean what
tdtree takes them to mean: a torch release that moves one fails here, by name, before anything else."""

import gc
import inspect
import pickle

import pytest
import torch
from _fresh import fresh_python

import tdtree
from tdtree import _foreach
from tdtree import _torch_private as P
from tdtree.errors import TorchVersionError


def test_transforms_active_tells_each_transform():
    seen = []

    def f(x):
        seen.append(P.transforms_active())
        return x.sum()

    x = torch.randn(3)
    f(x)
    torch.func.vmap(f)(x)
    torch.func.grad(f)(x)
    torch.func.jvp(f, (x,), (x,))
    assert seen == [False, True, True, True]


def test_transforms_active_folds_under_compile():
    def f(x):
        return x * 3 if P.transforms_active() else x * 2

    x = torch.randn(3, 2)
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), x * 2)
    torch.testing.assert_close(
        torch.compile(lambda y: torch.func.vmap(f)(y), fullgraph=True, backend="eager")(x), x * 3
    )


def test_unwrapped_reaches_the_wrapped_storage_at_every_level():
    x = torch.randn(4, 3)
    ptr = x.untyped_storage().data_ptr()
    found = []

    def f(y):
        inner = P.unwrapped(y)
        assert type(inner) is torch.Tensor and not torch._C._functorch.is_functorch_wrapped_tensor(inner)
        found.append((inner.untyped_storage().data_ptr(), next(P.storage_ids([y]))))
        return y.sum()

    torch.func.vmap(f)(x)
    torch.func.grad(f)(x[0])
    torch.func.vmap(torch.func.grad(f))(x)
    torch.func.grad(lambda y: torch.func.vmap(f)(y).sum())(x)
    ident = P.storage_id(x.untyped_storage())
    assert found == [(ptr, ident)] * 4
    assert P.unwrapped(x) is x


def test_storage_ids_tell_views_from_copies():
    x = torch.randn(4)
    a, b, c = P.storage_ids([x, x[1:], x.clone()])
    assert a == b != c


def test_a_set_of_storages_is_a_set_by_identity():
    # storage_set keeps the storages themselves: it tells them apart as storage_id does only while
    # UntypedStorage compares and hashes as object does, never by the bytes it holds
    assert torch.UntypedStorage.__eq__ is object.__eq__
    assert torch.UntypedStorage.__hash__ is object.__hash__
    x, twin = torch.zeros(4), torch.zeros(4)
    found = P.storage_set([x, x[1:], x.view(2, 2), twin])
    assert len(found) == 2
    assert x[2:].untyped_storage() in found and twin.untyped_storage() in found
    assert torch.zeros(4).untyped_storage() not in found
    assert set(map(P.storage_id, found)) == set(P.storage_ids([x, twin]))


def test_a_storage_keeps_its_python_object_while_it_lives():
    # storage_id is id() of the storage's Python object: it holds only while torch hands out one
    # object per storage, the same after every Python reference to it is gone
    x = torch.randn(4)
    first = P.storage_id(x.untyped_storage())
    gc.collect()
    churn = [torch.randn(4).untyped_storage() for _ in range(100)]
    assert P.storage_id(x[2:].untyped_storage()) == first
    assert first not in set(map(P.storage_id, churn))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_answered_while_tracing_runs_on_fake_tensors_and_answers_constants(backend):
    calls = []

    @P.answered_while_tracing
    def shares(a: list[torch.Tensor], b: list[torch.Tensor], extra: list[int]) -> torch.Size:
        calls.append(type(a[0]).__name__)
        return torch.Size([int(next(P.storage_ids(a)) == next(P.storage_ids(b))), *extra])

    def f(x):
        view, seven = shares([x], [x[1:]], [7])
        copy = shares([x], [x + 1], [])[0]
        # Python branches on the answers: fullgraph refuses a branch on a value known only at run time
        return x * (2 if view else 3) * (5 if copy else 7) * seven

    x = torch.randn(4)
    counter = P.compile_counter(backend)
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    torch.testing.assert_close(compiled(x), x * 98)
    assert calls[:2] == ["FakeTensor", "FakeTensor"], calls
    torch.testing.assert_close(compiled(torch.ones(4)), torch.full((4,), 98.0))
    assert counter.frame_count == 1


def test_holds_data_counts_a_data_dependent_size_as_data():
    assert P.holds_data(torch.zeros(3).untyped_storage())
    assert not P.holds_data(torch.zeros(0).untyped_storage())

    @P.answered_while_tracing
    def probe(x: list[torch.Tensor]) -> torch.Size:
        return torch.Size([int(P.holds_data(x[0].untyped_storage()))])

    def f(x, m):
        picked = x[m]  # its size is an unbacked symbol while tracing: bool(nbytes) would not trace
        return x * (2 if probe([picked])[0] else 3)

    x = torch.ones(4)
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, torch.zeros(4, dtype=torch.bool)), x * 2)


def test_storage_ids_see_through_wrappers_of_fake_tensors():
    # how the tag rule runs inside a compiled transform: dynamo hands answered_while_tracing the
    # batched wrappers of its fake tensors, and a view must share the wrapped storage's identity, a
    # new tensor not
    @P.answered_while_tracing
    def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Size:
        return torch.Size([int(next(P.storage_ids(a)) == next(P.storage_ids(b)))])

    def f(x):
        return torch.func.vmap(lambda y: y * (2 if same([y], [y[:1]])[0] else 3) * (5 if same([y], [y + 1])[0] else 7))(
            x
        )

    x = torch.randn(4, 3)
    torch.testing.assert_close(f(x), x * 14)
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(x), x * 14)


# the foreach kernels tdtree calls, with arguments of each kind they take (lists, a number, a tensor, keywords)
_KERNEL_CALLS = [
    (torch._foreach_add, lambda xs, ys: (xs, ys), {"alpha": -0.5}),
    (torch._foreach_add, lambda xs, ys: (xs, 2.0), {}),
    (torch._foreach_sub, lambda xs, ys: (xs, ys), {}),
    (torch._foreach_mul, lambda xs, ys: (xs, torch.tensor(3.0)), {}),
    (torch._foreach_div, lambda xs, ys: (xs, ys), {}),
    (torch._foreach_pow, lambda xs, ys: (xs, 2), {}),
    (torch._foreach_lerp, lambda xs, ys: (xs, ys, 0.1), {}),
    *[
        (k, lambda xs, ys: (xs,), {})
        for k in (
            torch._foreach_neg,
            torch._foreach_abs,
            torch._foreach_exp,
            torch._foreach_log,
            torch._foreach_sqrt,
            torch._foreach_sigmoid,
            torch._foreach_tanh,
            torch._foreach_sign,
        )
    ],
]
_IN_PLACE_CALLS = [
    (torch._foreach_add_, lambda xs, ys: (xs, ys), {}),
    (torch._foreach_add_, lambda xs, ys: (xs, 1e-8), {}),
    (torch._foreach_addcmul_, lambda xs, ys: (xs, ys, ys), {"value": 0.25}),
    (torch._foreach_div_, lambda xs, ys: (xs, torch.tensor(2.0)), {}),
    (torch._foreach_mul_, lambda xs, ys: (xs, torch.tensor(2.0)), {}),
    (torch._foreach_copy_, lambda xs, ys: (xs, ys), {}),
    (torch._foreach_zero_, lambda xs, ys: (xs,), {}),
]


def _lists():
    g = torch.Generator().manual_seed(0)
    return [torch.rand(3, 2, generator=g) + 0.5, torch.rand(4, generator=g) + 0.5], [
        torch.rand(3, 2, generator=g) + 0.5,
        torch.rand(4, generator=g) + 0.5,
    ]


def test_foreach_kernels_have_per_leaf_ops_of_the_same_name():
    """``torch._foreach_NAME`` computes ``torch.NAME`` leaf by leaf (``Tensor.NAME_`` in place): the
    naming that tdtree._foreach reads to run foreach calls inside transforms."""
    for kernel, args, kwargs in _KERNEL_CALLS:
        xs, ys = _lists()
        per_leaf, _ = _foreach._RUNNERS[kernel]
        torch.testing.assert_close(per_leaf(*args(xs, ys), **kwargs), kernel(*args(xs, ys), **kwargs))
    for kernel, args, kwargs in _IN_PLACE_CALLS:
        (xs, ys), (xs2, ys2) = _lists(), _lists()
        per_leaf, fresh = _foreach._RUNNERS[kernel]
        assert per_leaf(*args(xs, ys), **kwargs) is xs and kernel(*args(xs2, ys2), **kwargs) is xs2
        torch.testing.assert_close(xs, xs2)
        if fresh is not None:  # the same values as new tensors, the list given left alone
            (xs3, ys3), before = _lists(), _lists()[0]
            torch.testing.assert_close(fresh(*args(xs3, ys3), **kwargs), xs2)
            torch.testing.assert_close(xs3, before)
    assert _foreach._RUNNERS[torch._foreach_copy_][1] is None  # no torch.copy: never fresh


def test_compile_counter_counts_frames_and_graph_breaks_are_counted():
    counter = P.compile_counter("eager")
    compiled = torch.compile(lambda x: x * 2, backend=counter)
    compiled(torch.ones(2))
    compiled(torch.ones(2))
    assert counter.frame_count == 1
    before = P.graph_breaks()

    def breaks(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    torch.compile(breaks, backend="eager")(torch.ones(2))
    assert P.graph_breaks() == before + 1


def test_torch_pytree_registers_with_the_arguments_tdtree_gives():
    params = inspect.signature(P.torch_pytree.register_pytree_node).parameters
    for name in ("serialized_type_name", "to_dumpable_context", "from_dumpable_context", "flatten_with_keys_fn"):
        assert name in params, name
    node = tdtree.TensorDict({"a": torch.zeros(2)}, [2])
    leaves, spec = P.torch_pytree.tree_flatten(node)
    assert leaves[0] is node["a"] and P.torch_pytree.tree_unflatten(leaves, spec)["a"] is node["a"]
    paths = [path for path, _ in P.torch_pytree.tree_flatten_with_path(node)[0]]
    assert paths == [(P.torch_pytree.MappingKey("a"),)]


def test_module_dicts_hold_the_tensors_a_call_reads():
    # tdtree.nn reads a module's tensors from these dicts and puts a node's there for functional_call
    lin = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    assert list(lin._modules) == ["0", "1"] and list(lin[0]._parameters) == ["weight", "bias"]
    assert set(lin[1]._buffers) == {"running_mean", "running_var", "num_batches_tracked"}
    old = lin[0]._parameters["weight"]
    lin[0]._parameters["weight"] = torch.zeros(2, 2)
    lin[0]._parameters["bias"] = torch.ones(2)
    try:
        assert torch.equal(lin[0](torch.randn(3, 2)), torch.ones(3, 2))
    finally:
        lin[0]._parameters["weight"] = old


def test_default_collate_consults_default_collate_fn_map_first_by_type_then_by_subclass() -> None:
    from torch.utils.data import default_collate

    class Base:
        pass

    class Sub(Base):
        pass

    class Rows(Base):
        def __getitem__(self, index: int) -> Sub:
            return Sub()

    def entry(batch: object, *, collate_fn_map: object) -> tuple[str, object, object]:
        return ("entry", batch, collate_fn_map)

    assert Base not in P.default_collate_fn_map
    P.default_collate_fn_map[Base] = entry
    try:
        batch = [Sub(), Sub()]
        tag, given, table = default_collate(batch)
        assert tag == "entry" and given is batch and table is P.default_collate_fn_map
        # a batch that is not a list (one object read by a dataset's __getitems__) reaches it as is
        rows = Rows()
        assert default_collate(rows)[1] is rows
    finally:
        del P.default_collate_fn_map[Base]


def test_higher_order_operators_are_told_from_other_functions():
    for op in (torch.ops.higher_order.cond, torch.ops.higher_order.invoke_subgraph, torch.ops.higher_order.wrap):
        assert isinstance(op, P.HigherOrderOperator)
    x = torch.randn(3)
    for func in (torch.stack, torch.utils.checkpoint.checkpoint, torch.compiler.nested_compile_region, torch.sin):
        assert not isinstance(func, P.HigherOrderOperator)
        assert P.through_higher_order(func, (x,), None) is NotImplemented


class _Logged(torch.Tensor):
    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_through_higher_order_runs_the_operator_with_overrides_off():
    from torch._higher_order_ops.wrap import wrap

    x = torch.randn(3).as_subclass(_Logged)
    enabled = []

    def body(t):
        enabled.append(torch._C._is_torch_function_enabled())
        return t * 2

    _Logged.calls.clear()
    out = P.through_higher_order(wrap, (body, x), {})
    assert _Logged.calls == [] and enabled == [False]  # nothing asked the subclass: neither wrap nor mul
    torch.testing.assert_close(out.as_subclass(torch.Tensor), x.as_subclass(torch.Tensor) * 2)
    assert torch._C._is_torch_function_enabled()


def test_dynamo_hands_a_node_the_higher_order_operators_it_routes_and_this_list_names_them(monkeypatch):
    # why the node's __torch_function__ needs through_higher_order: dynamo (not eager torch) asks it,
    # handing the operator itself; the list is dynamo's handler registry
    from tdtree import _combine

    seen = []

    def recording(func, args, kwargs):
        seen.append((type(func).__name__, isinstance(func, P.HigherOrderOperator)))
        return P.through_higher_order(func, args, kwargs)

    monkeypatch.setattr(_combine, "through_higher_order", recording)
    td = tdtree.TensorDict({"a": torch.randn(3)}, [3])
    fn = lambda t: torch.utils.checkpoint.checkpoint(lambda u: u * 2, t, use_reentrant=False)  # noqa: E731
    fn(td)
    assert seen == []  # eager: the operator flattens the node and never asks it
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="eager")(td)
    torch.testing.assert_close(out["a"], td["a"] * 2)
    # torch.utils.checkpoint.checkpoint, traced as the operator it becomes
    assert seen == [(type(torch.ops.higher_order.tag_activation_checkpoint).__name__, True)]
    names = P.dynamo_higher_order_operators()
    assert {"invoke_subgraph", "tag_activation_checkpoint", "wrap", "cond", "scan"} <= set(names)
    assert "wrap_with_autocast" not in names  # its handler does not ask: it overrides call_function
    assert names == sorted(set(names))


def test_in_shared_memory_tells_torch_shared_memory_from_mapped_files(tmp_path):
    # UntypedStorage._get_shared_fd: the fd torch's shared memory keeps (file_descriptor strategy), -1 for
    # a mapped file, RuntimeError for a storage with no fd-keeping mapping (managed shared memory included)
    (tmp_path / "f").write_bytes(bytes(16))
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    shared = torch.ones(4).share_memory_()
    assert shared.untyped_storage()._get_shared_fd() >= 0
    assert P.in_shared_memory(shared) and P.in_shared_memory(shared[1:])
    assert not P.in_shared_memory(torch.ones(4))
    for mode in (True, False):  # is_shared() says True for mapped files: the test must not
        mapped = torch.from_file(str(tmp_path / "f"), shared=mode, size=4)
        assert mapped.is_shared() and mapped.untyped_storage()._get_shared_fd() == -1
        assert not P.in_shared_memory(mapped)
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        managed = torch.ones(4).share_memory_()
        assert managed.is_shared() and P.in_shared_memory(managed)
        assert not P.in_shared_memory(shared)  # sending it under this strategy would move it
    finally:
        torch.multiprocessing.set_sharing_strategy("file_descriptor")
    assert not P.in_shared_memory(managed)


def test_control_flow_operators_keep_their_signatures():
    """tdtree.control calls torch's scan, associative_scan and map with these parameters."""
    assert list(inspect.signature(P.scan).parameters) == ["combine_fn", "init", "xs", "dim", "reverse"]
    assert list(inspect.signature(P.associative_scan).parameters) == [
        "combine_fn",
        "xs",
        "dim",
        "reverse",
        "combine_mode",
    ]
    assert list(inspect.signature(P.hop_map).parameters)[:2] == ["f", "xs"]


def test_a_missing_eager_name_raises_torch_version_error_at_import():
    # torch without one of the names the eager paths read: import tdtree names it and torch's version
    run = fresh_python(
        "import torch; del torch._C._functorch.get_unwrapped\n"
        "try:\n    import tdtree\nexcept Exception as e:\n"
        "    print(type(e).__module__, type(e).__name__, repr(e.name), repr(e.version), e)\n"
    )
    assert run.returncode == 0, run.stderr
    module, kind, name, version, *message = run.stdout.split()
    assert (module, kind) == ("tdtree.errors", "TorchVersionError")
    assert name == "'torch._C._functorch.get_unwrapped'" and version == repr(torch.__version__)
    assert "torch._C._functorch.get_unwrapped" in " ".join(message) and torch.__version__ in " ".join(message)


def test_a_missing_compile_name_raises_torch_version_error_at_each_compile():
    # the compile registrations run when dynamo is imported: a torch without them fails torch.compile
    # with the named error, every time (not an AttributeError from a half-imported dynamo the second time)
    run = fresh_python(
        "import sys, torch, tdtree; assert 'torch._dynamo' not in sys.modules\n"
        "import torch.compiler; del torch.compiler.substitute_in_graph\n"
        "for _ in range(2):\n"
        "    try:\n        torch.compile(lambda x: x + 1, backend='eager')(torch.ones(1))\n"
        "    except Exception as e:\n        print(type(e).__name__, e.name)\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["TorchVersionError", "torch.compiler.substitute_in_graph"] * 2


def test_needed_names_the_missing_name_and_the_version(monkeypatch):
    monkeypatch.delattr(torch._C, "_are_functorch_transforms_active")
    with pytest.raises(TorchVersionError, match=r"torch\._C\._are_functorch_transforms_active.*torch 2\.\d+") as err:
        P.needed("torch._C._are_functorch_transforms_active")
    assert pickle.loads(pickle.dumps(err.value)).args == err.value.args
    assert P.needed("torch.utils._pytree.tree_map") is torch.utils._pytree.tree_map  # a module imported on the way


def test_import_tdtree_leaves_dynamo_unimported_and_compile_registers_it():
    run = fresh_python(
        "import sys, torch, tdtree as tt; assert 'torch._dynamo' not in sys.modules\n"
        "td = tt.TensorDict({'a': torch.ones(3)}, [3]).lock()\n"
        "out = torch.compile(lambda t: t + 1, fullgraph=True, backend='eager')(td)\n"
        "print(type(out).__name__, out['a'].tolist(), out.tags == frozenset())\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["TensorDict", "[2.0,", "2.0,", "2.0]", "True"]


def test_the_trace_log_is_quiet_inside_and_as_it_was_after():
    import logging

    log = logging.getLogger("torch.__trace")
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record)

    handler = Catch()
    log.addHandler(handler)
    try:
        with P.quiet_trace_log():
            log.debug("inside")
        log.debug("after")
    finally:
        log.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["after"]


def test_save_skeleton_finds_the_record_of_each_storage(tmp_path):
    """torch.save under skip_data reserves one record per storage, keyed in the order the pickler meets
    them; writing each storage's bytes at the offset given makes the file torch.save writes."""
    a, b = torch.arange(5, dtype=torch.int32), torch.randn(3, 2)
    payload = {"x": a, "y": [b, a, torch.empty(4, device="meta"), torch.ones(7, dtype=torch.float16)]}
    tensors = [a, b, a, payload["y"][2], payload["y"][3]]
    with open(tmp_path / "s.pt", "w+b") as f:
        offsets = P.save_skeleton(payload, f, tensors)
        assert offsets[0] == offsets[2] and offsets[3] == -1 and len(set(offsets)) == 4
        for t, offset in zip(tensors, offsets):
            if offset >= 0:
                f.seek(offset)
                f.write(t.numpy().tobytes())
    back = torch.load(tmp_path / "s.pt", weights_only=True)
    assert torch.equal(back["x"], a) and torch.equal(back["y"][0], b) and torch.equal(back["y"][3], payload["y"][3])
    assert back["y"][1].untyped_storage().data_ptr() == back["x"].untyped_storage().data_ptr()
    assert back["y"][2].is_meta and back["y"][2].shape == (4,)
