"""torch's private names that tdtree reads (``tdtree._torch_private``) still exist and still mean what
tdtree takes them to mean: a torch release that moves one fails here, by name, before anything else."""

import torch

from tdtree import _torch_private as P


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
    torch.testing.assert_close(torch.compile(lambda y: torch.func.vmap(f)(y), fullgraph=True, backend="eager")(x), x * 3)


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


def test_nonstrict_trace_runs_python_on_fake_tensors():
    calls = []

    @P.nonstrict_trace
    def probe(t: torch.Tensor) -> torch.Tensor:
        calls.append(type(t).__name__)
        return t + 1

    out = torch.compile(lambda t: probe(t) * 2, fullgraph=True, backend="aot_eager")(torch.zeros(2))
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    assert "FakeTensor" in calls


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
