"""Pytree registration (optree and torch), torch.func, tdtree.vmap and torch.compile."""

from __future__ import annotations

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree

import tdtree as tt
from tdtree.errors import BatchSizeError
from tdtree.testing import assert_close, assert_equal


def test_optree_round_trip(corpus_td: tt.TensorDict) -> None:
    """Unflatten rebuilds the values and metadata, untagged (DESIGN 3.1; tags were kept before)."""
    leaves, spec = tt.tree.flatten(corpus_td)
    back = tt.tree.unflatten(spec, leaves)
    assert_equal(back, corpus_td, check_tags=False)
    assert back.tags == frozenset()
    assert all(a is b for a, b in zip(tt.tree.leaves(back), leaves))
    assert optree.tree_structure(corpus_td, namespace="tdtree") == spec


def test_torch_pytree_round_trip(corpus_td: tt.TensorDict) -> None:
    leaves, spec = torch_pytree.tree_flatten(corpus_td)
    back = torch_pytree.tree_unflatten(leaves, spec)
    assert_equal(back, corpus_td, check_tags=False)
    assert back.tags == frozenset()
    keyed, _ = torch_pytree.tree_flatten_with_path(corpus_td)
    paths = [tuple(k.key for k in path) for path, _ in keyed]
    assert paths == [k if isinstance(k, tuple) else (k,) for k in corpus_td.keys(True, True)]


def test_metadata_is_keys_batch_device_tags() -> None:
    td = tt.TensorDict({"b": torch.zeros(2), "a": torch.zeros(2)}, [2]).lock()
    meta = (("a", "b"), torch.Size([2]), torch.device("cpu"), frozenset({tt.Locked}))
    assert torch_pytree.tree_flatten(td)[1].context == meta
    children, optree_meta, entries = optree.tree_flatten_one_level(td, namespace="tdtree")[:3]
    assert optree_meta == meta and list(entries) == ["a", "b"] and children[0] is td["a"]


def test_tags_and_batch_sizes_change_structure() -> None:
    td = tt.TensorDict({"a": torch.zeros(2, 3)}, [2])
    assert tt.tree.structure(td) != tt.tree.structure(td.lock())
    assert torch_pytree.tree_structure(td) != torch_pytree.tree_structure(td.lock())
    assert tt.tree.structure(td) != tt.tree.structure(tt.TensorDict({"a": torch.zeros(2, 3)}, [2, 3]))
    same = tt.TensorDict({"a": torch.ones(2, 3)}, [2])
    assert tt.tree.structure(td) == tt.tree.structure(same)


def test_tree_map_keeps_type_and_metadata() -> None:
    td = tt.TensorDict({"a": torch.ones(2), "n": {"b": torch.ones(2, 1)}}, [2])
    out = tt.tree.map(lambda x: x * 3, td)
    assert type(out) is tt.TensorDict and out.batch_size == td.batch_size
    assert torch.equal(out["n", "b"], torch.full((2, 1), 3.0))
    paths = tt.tree.flatten_with_path(td)[0]
    assert paths == [("a",), ("n", "b")]


def test_torch_export_context_is_dumpable() -> None:
    td = tt.TensorDict({"a": torch.zeros(2)}, [2]).lock()
    spec = torch_pytree.tree_structure(td)
    again = torch_pytree.treespec_loads(torch_pytree.treespec_dumps(spec))
    assert again == spec


def test_functional_grad_returns_a_node() -> None:
    params = tt.TensorDict({"w": torch.randn(3, 2), "n": {"b": torch.randn(2)}})
    x = torch.randn(5, 3)

    def loss(p: tt.TensorDict) -> torch.Tensor:
        return ((x @ p["w"] + p["n", "b"]) ** 2).sum()

    grads = torch.func.grad(loss)(params)
    assert type(grads) is tt.TensorDict and list(grads.keys(True)) == list(params.keys(True))
    w = params["w"].clone().requires_grad_()
    b = params["n", "b"].clone().requires_grad_()
    ((x @ w + b) ** 2).sum().backward()
    assert torch.allclose(grads["w"], w.grad) and torch.allclose(grads["n", "b"], b.grad)


def test_torch_func_vmap_over_empty_batch_size_ensemble() -> None:
    params = tt.TensorDict({"w": torch.randn(4, 3, 2), "b": torch.randn(4, 2)})
    x = torch.randn(5, 3)
    out = torch.func.vmap(lambda p: x @ p["w"] + p["b"])(params)
    expected = torch.stack([x @ params["w"][i] + params["b"][i] for i in range(4)])
    assert torch.allclose(out, expected, atol=1e-5)


def test_torch_func_vmap_over_batch_dims_fails_clearly() -> None:
    td = tt.TensorDict({"a": torch.randn(5, 3)}, [5])
    with pytest.raises(BatchSizeError, match=r"batch_size \(5,\): entry 'a' has shape \(3,\).*tdtree.vmap"):
        torch.func.vmap(lambda t: t["a"])(td)


def test_tdtree_vmap_rewrites_batch_sizes() -> None:
    td = tt.TensorDict({"a": torch.randn(5, 3, 2), "n": {"b": torch.randn(5, 3)}}, [5, 3])
    seen = []

    def f(x: tt.TensorDict) -> tt.TensorDict:
        seen.append((x.batch_size, x["n"].batch_size))
        return x.set("c", x["a"].sum(-1))

    out = tt.vmap(f)(td)
    assert seen[-1] == (torch.Size([3]), torch.Size([3]))
    assert out.batch_size == torch.Size([5, 3]) and out["n"].batch_size == torch.Size([5, 3])
    assert torch.allclose(out["c"], td["a"].sum(-1))
    assert out["a"].shape == td["a"].shape


def test_tdtree_vmap_in_and_out_dims() -> None:
    td = tt.TensorDict({"a": torch.randn(3, 5, 2)}, [3, 5])
    out = tt.vmap(lambda x: x.set("s", x["a"].sum(-1)), in_dims=1, out_dims=0)(td)
    assert out.batch_size == torch.Size([5, 3])
    assert torch.allclose(out["s"], td["a"].sum(-1).transpose(0, 1))
    assert torch.equal(out["a"], td["a"].transpose(0, 1))
    back = tt.vmap(lambda x: x, in_dims=-1, out_dims=-1)(td)
    assert back.batch_size == td.batch_size and torch.equal(back["a"], td["a"])


def test_tdtree_vmap_mixed_args_and_tensor_outputs() -> None:
    td = tt.TensorDict({"a": torch.randn(4, 3)}, [4])
    w = torch.randn(3)
    node, total = tt.vmap(lambda x, v: (x, (x["a"] * v).sum()), in_dims=(0, None))(td, w)
    assert node.batch_size == torch.Size([4]) and torch.allclose(total, (td["a"] * w).sum(-1))
    nested = tt.TensorDict({"s": tt.TensorDict({"c": torch.randn(4, 2, 6)}, [4, 2])}, [4])
    out = tt.vmap(lambda x: x)(nested)
    assert out["s"].batch_size == torch.Size([4, 2])


def _graph_breaks(fn, *args) -> int:
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count


def test_compile_reads_sets_and_returns_a_node() -> None:
    def f(td: tt.TensorDict) -> tt.TensorDict:
        obs = td["obs"]
        out = td.set("act", obs * 2).set(("next", "r"), td["next", "r"] + 1)
        return out.select("act", "next").exclude(("next", "d"))

    td = tt.TensorDict({"obs": torch.randn(4, 3), "next": {"r": torch.zeros(4, 1), "d": torch.ones(4)}}, [4])
    assert _graph_breaks(f, td) == 0
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert_equal(compiled(td), f(td))


def test_compile_takes_node_input_and_no_recompile_for_same_structure() -> None:
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()

    @torch.compile(fullgraph=True, backend=counter)
    def f(td: tt.TensorDict) -> tt.TensorDict:
        return td.set("b", td["a"] + 1).flatten_keys()

    td = tt.TensorDict({"a": torch.randn(4, 3), "n": {"x": torch.zeros(4)}}, [4])
    torch._dynamo.reset()
    first = f(td)
    second = f(tt.TensorDict({"a": torch.randn(4, 3), "n": {"x": torch.ones(4)}}, [4]))
    assert counter.frame_count == 1
    assert list(first.keys()) == ["a", "b", "n.x"] and torch.equal(second["n.x"], torch.ones(4))


def test_compile_aot_eager_grad_through_node() -> None:
    params = tt.TensorDict({"w": torch.randn(3, 2)})
    x = torch.randn(5, 3)

    def step(p: tt.TensorDict) -> tt.TensorDict:
        g = torch.func.grad(lambda q: (x @ q["w"]).pow(2).sum())(p)
        return tt.tree.map(lambda a, b: a - 0.1 * b, p, g)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert_close(compiled(params), step(params))


def test_compile_tag_rule_without_graph_breaks() -> None:
    td = tt.TensorDict({"a": torch.randn(4, 3), "n": {"b": torch.ones(4)}}, [4]).lock()

    def f(x: tt.TensorDict) -> tuple[tt.TensorDict, tt.TensorDict, tt.TensorDict]:
        return x.select("a"), x.clone(), x.exclude("a").clone(recurse=False)

    assert _graph_breaks(f, td) == 0
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        kept, dropped, shallow = torch.compile(f, fullgraph=True, backend=backend)(td)
        assert type(kept) is tt.TensorDict[tt.Locked] and type(shallow) is tt.TensorDict[tt.Locked]
        assert type(dropped) is tt.TensorDict and type(dropped["n"]) is tt.TensorDict
