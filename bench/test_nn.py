"""Modules over nodes and functional calls, after tensordict's benchmarks/nn/functional_benchmarks_test.py
and benchmarks/compile/tensordict_nn_test.py, eager and compiled.

Rows: tdtree (``TDModule``, ``TDSequential``, ``from_module``,
``functional_call``), tensordict (``TensorDictModule``,
``TensorDictSequential``, ``from_module`` / ``to_module``), and pytree, the
floor: plain functions over dicts and ``torch.func.functional_call`` with a
dict of tensors; where tdtree and tensordict time a module (``test_mod_*``,
``test_seq_*``), the dict function is an ``nn.Module`` too (:class:`DictModule`),
because ``torch.compile`` of a module adds a wrapper call that a function skips. tensordict's modules write into their input; its rows time
that, as its suite does (cheaper than a copy), while tdtree and the dicts
return new ones. ``mode="compile"`` wraps the same callable in
``torch.compile(fullgraph=True)`` (see the ``compiler`` fixture in
``conftest.py``: inductor when timing, dynamo alone under ``make test``), calls it
twice, then times it; the tdtree and pytree rows assert nothing recompiles
while timed. tensordict's ``compile-overhead`` mode (CUDA graphs) is left out:
the suite runs on the CPU.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch
from torch import nn

import tdtree
from tdtree import optim
from tdtree.nn import TDModule, TDSequential, from_module, functional_call

from .impls import Impl, tensordict
from .modes import MODES, run_mode

if tensordict is not None:
    from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential


class AddOne(nn.Module):
    """``x + 1``: tensordict's suite wraps a lambda; tdtree's TDModule takes modules."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class DictModule(nn.Module):
    """An ``nn.Module`` whose forward is ``fn`` over dicts: the pytree row of a module case.

    Compiling a module goes through torch's ``OptimizedModule`` wrapper (5-10 us per call on the
    dev machine); compiling a bare function does not. The floor for a compiled ``TDModule`` is a
    compiled module over dicts, not a compiled function.
    """

    def __init__(self, fn: Callable[[dict[str, Any]], dict[str, Any]], *children: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.children_ = nn.ModuleList(children)

    def forward(self, d: dict[str, Any]) -> dict[str, Any]:
        return self.fn(d)


@functools.cache
def mlp(depth: int = 2, num_cells: int = 32, feature_dim: int = 3) -> nn.Sequential:
    """tensordict's compile-suite MLP: Linear, ReLU, ``depth`` x (Linear, ReLU), Linear to 4.

    One per shape for the whole module (initialising the 1024-wide one costs a
    third of a second); the backward cases accumulate into its gradients.
    """
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(feature_dim, num_cells),
        nn.ReLU(),
        *[nn.Sequential(nn.Linear(num_cells, num_cells), nn.ReLU()) for _ in range(depth)],
        nn.Linear(num_cells, 4),
    )


def make_net() -> nn.Sequential:
    """tensordict's functional-suite net: nested ``Linear(2, 2)`` layers."""
    torch.manual_seed(0)
    lin = functools.partial(nn.Linear, 2, 2)
    return nn.Sequential(lin(), lin(), lin(), nn.Sequential(lin(), lin(), lin()))


def _node(impl: Impl, source: dict[str, Any]) -> Any:
    return impl.node(source, ())


def _params(impl: Impl, module: nn.Module) -> Any:
    """The module's parameters and buffers: a node, a TensorDict, or ``state_dict()``."""
    if impl.name == "tdtree":
        return from_module(module)
    if impl.name == "tensordict":
        return tensordict.TensorDict.from_module(module)
    return module.state_dict()


# -- one module, one key (functional_benchmarks_test) ---------------------------------------


@pytest.mark.pytree
@pytest.mark.quick
def test_tdmodule(benchmark, impl: Impl) -> None:
    """An identity module reading "x" and writing "y" (pytree: ``{**d, "y": f(d["x"])}``)."""
    td = _node(impl, {"x": torch.zeros(())})
    ident = nn.Identity()
    if impl.name == "tdtree":
        module: Callable[[Any], Any] = TDModule(ident, "x", "y")
    elif impl.name == "tensordict":
        module = TensorDictModule(ident, in_keys=["x"], out_keys=["y"])
    else:
        module = lambda d: {**d, "y": ident(d["x"])}  # noqa: E731
    out = benchmark(module, td)
    assert out["y"] is td["x"]


@pytest.mark.pytree
def test_tdseq(benchmark, impl: Impl) -> None:
    """A sequence of one module setting "y" to "x". tensordict: its suite's
    ``TensorDictModuleBase`` that calls ``set`` directly; pytree: a loop over functions."""
    td = _node(impl, {"x": torch.zeros(())})
    if impl.name == "tdtree":
        seq: Callable[[Any], Any] = TDSequential(TDModule(nn.Identity(), "x", "y"))
    elif impl.name == "tensordict":

        class SetY(TensorDictModuleBase):
            in_keys = ["x"]
            out_keys = ["y"]

            def forward(self, tensordict: Any) -> Any:
                return tensordict.set("y", tensordict.get("x"))

        seq = TensorDictSequential(SetY())
    else:
        steps = [lambda d: {**d, "y": d["x"]}]

        def seq(d: dict[str, Any]) -> dict[str, Any]:
            for step in steps:
                d = step(d)
            return d

    out = benchmark(seq, td)
    assert out["y"] is td["x"]


# -- parameters as nodes ---------------------------------------------------------------------


@pytest.mark.pytree
def test_instantiation_from_module(benchmark, impl: Impl) -> None:
    """The net's parameters as a node (tensordict: ``TensorDict.from_module``; pytree:
    ``dict(named_parameters())``). tensordict's suite times functorch's ``make_functional``."""
    net = make_net()
    if impl.name == "pytree":
        out = benchmark(lambda: dict(net.named_parameters()))
        assert len(out) == 12
    else:
        out = benchmark(_params, impl, net)
        assert len(list(out.keys(True, True))) == 12


@pytest.mark.pytree
def test_exec_functional_call(benchmark, impl: Impl) -> None:
    """Run the net with given parameters: ``functional_call(net, params, x)``; tensordict:
    ``with params.to_module(net): net(x)``; pytree: ``torch.func.functional_call(net, state_dict, x)``."""
    net = make_net()
    x = torch.randn(2, 2)
    params = _params(impl, net)
    if impl.name == "tdtree":
        out = benchmark(functional_call, net, params, x)
    elif impl.name == "tensordict":

        def run() -> torch.Tensor:
            with params.to_module(net):
                return net(x)

        out = benchmark(run)
    else:
        out = benchmark(torch.func.functional_call, net, params, (x,))
    torch.testing.assert_close(out, net(x))


def _ensemble(impl: Impl, params: Any, stack: bool) -> Any:
    """Two copies of ``params`` along a new dim 0 of every leaf: stacked clones, or expanded views."""
    if impl.name == "tdtree":
        # tdtree's ensembles keep batch (): the member dim is the leaves' own, for torch.func.vmap
        if stack:
            return tdtree.tree.map(lambda *xs: torch.stack(xs), params, params.clone())
        return tdtree.tree.map(lambda x: x.expand(2, *x.shape), params)
    if impl.name == "tensordict":
        return torch.stack([params, params.clone()], 0).lock_() if stack else params.expand(2).to_tensordict().lock_()
    if stack:
        return {k: torch.stack([v, v.clone()]) for k, v in params.items()}
    return {k: v.expand(2, *v.shape) for k, v in params.items()}


@torch.no_grad()
@pytest.mark.pytree
@pytest.mark.parametrize("stack", [True, False])
@pytest.mark.parametrize("tdmodule", [True, False])
def test_vmap_mlp_speed_decorator(benchmark, impl: Impl, stack: bool, tdmodule: bool) -> None:
    """``torch.func.vmap`` of a 4-layer MLP (64 wide) over an ensemble of 2 parameter sets.

    tdtree: ``functional_call`` of the MLP (or of a ``TDModule`` on ``{"x": x}``) over a
    parameter node of batch size () whose leaves lead with the member dim;
    tensordict: ``params.to_module`` inside the vmapped function, as in its suite;
    pytree: ``torch.func.functional_call`` with a dict (the module step as a function of a dict).
    """
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    torch.manual_seed(0)
    net = nn.Sequential(*layers).eval()
    x = torch.randn(1, 1, 64)
    if tdmodule and impl.name == "tdtree":
        net = TDModule(net, "x", "y")
    elif tdmodule and impl.name == "tensordict":
        net = TensorDictModule(net, in_keys=["x"], out_keys=["y"])
    params = _ensemble(impl, _params(impl, net), stack)
    data = _node(impl, {"x": x}) if tdmodule and impl.name != "pytree" else x

    if impl.name == "tdtree":

        def fun(data: Any, p: Any) -> Any:
            return functional_call(net, p, data)

    elif impl.name == "tensordict":

        def fun(data: Any, p: Any) -> Any:
            with p.to_module(net):
                return net(data)

    elif tdmodule:

        def fun(data: Any, p: Any) -> Any:
            return {"x": data, "y": torch.func.functional_call(net, p, (data,))}

    else:

        def fun(data: Any, p: Any) -> Any:
            return torch.func.functional_call(net, p, (data,))

    vfun = torch.func.vmap(fun, (None, 0))
    vfun(data, params)
    out = benchmark(vfun, data, params)
    y = out["y"] if tdmodule else out
    assert y.shape == (2, 1, 1, 64)


class IdleTransformer(nn.Transformer):
    """A Transformer's parameters with a forward that does nothing: calling it with
    other parameters times their swap in and out alone. ``d_model=128,
    dim_feedforward=256``: the default's 184 tensors at 1/22 of its bytes."""

    def forward(self) -> None:  # type: ignore[override]
        return None


@functools.cache
def _idle_transformer() -> IdleTransformer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested-tensor advice for batch_first=False
        return IdleTransformer(d_model=128, nhead=4, dim_feedforward=256)


@pytest.mark.pytree
def test_to_module_speed(benchmark, impl: Impl) -> None:
    """Swap a Transformer's 184 parameters in and back out. tensordict:
    ``with params.to_module(m): pass``; tdtree: ``functional_call(m, params)`` of a
    forward that does nothing; pytree: ``torch.func.functional_call`` likewise."""
    module = _idle_transformer()
    own = module.encoder.layers[0].linear1.weight
    params = _params(impl, module)
    params = (
        params.apply(lambda x: x.detach().clone())
        if impl.name != "pytree"
        else {k: v.clone() for k, v in params.items()}
    )
    if impl.name == "tdtree":
        benchmark(functional_call, module, params)
    elif impl.name == "tensordict":

        def swap() -> None:
            with params.to_module(module):
                pass

        benchmark(swap)
    else:
        benchmark(torch.func.functional_call, module, params, ())
    assert module.encoder.layers[0].linear1.weight is own


# -- modules over keys, eager and compiled (compile/tensordict_nn_test) ----------------------


def _mod(impl: Impl, module: nn.Module, in_key: str, out_key: Any) -> Callable[[Any], Any]:
    """``module`` reading ``in_key`` and writing ``out_key`` (a str or a 2-tuple)."""
    if impl.name == "tdtree":
        return TDModule(module, in_key, out_key)
    if impl.name == "tensordict":
        return TensorDictModule(module, in_keys=[in_key], out_keys=[out_key])

    def write(d: dict[str, Any]) -> dict[str, Any]:
        value = module(d[in_key])
        if isinstance(out_key, tuple):
            return {**d, out_key[0]: {**d.get(out_key[0], {}), out_key[1]: value}}
        return {**d, out_key: value}

    return DictModule(write, module)


def _seq(impl: Impl, layers: list[nn.Module]) -> Callable[[Any], Any]:
    """``layers`` chained from "a" through "hidden" to ("c", "d"); "hidden" is dropped from the output.

    tensordict: its suite's ``Seq(copy, *mods, delhidden)``; tdtree: a
    ``TDSequential`` keeping only ("c", "d") of the keys it writes.
    """
    last = len(layers) - 1
    mods = [
        _mod(impl, layer, "a" if i == 0 else "hidden", ("c", "d") if i == last else "hidden")
        for i, layer in enumerate(layers)
    ]
    if impl.name == "tdtree":
        return TDSequential(*mods, selected_out_keys=[("c", "d")])
    if impl.name == "tensordict":

        def delhidden(td: Any) -> Any:
            del td["hidden"]
            return td

        return TensorDictSequential(lambda td: td.copy(), *mods, delhidden)

    def seq(d: dict[str, Any]) -> dict[str, Any]:
        for mod in mods:
            d = mod(d)
        del d["hidden"]  # d is the last step's new dict
        return d

    return DictModule(seq, *mods)


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_mod_add(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """``x + 1`` from "a" into ("c", "d") on a node of one scalar."""
    td = _node(impl, {"a": torch.zeros(())})
    out = run_mode(benchmark, impl, mode, compiler, _mod(impl, AddOne(), "a", ("c", "d")), td)
    assert out["c"]["d"] == 1


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_mod_wrap(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """The MLP (32 wide) from "a" (32 x 3) into ("c", "d")."""
    net = mlp()
    td = _node(impl, {"a": torch.zeros(32, 3)})
    out = run_mode(benchmark, impl, mode, compiler, _mod(impl, net, "a", ("c", "d")), td)
    torch.testing.assert_close(out["c"]["d"], net(torch.zeros(32, 3)))


def _run_with_backward(
    benchmark: Any, impl: Impl, mode: str, compiler: Any, module: Any, net: nn.Module, td: Any
) -> None:
    """Time ``module(td)["c"]["d"]`` (the module compiled when ``mode`` says so) followed by
    ``mean().backward()`` outside it, and check the gradient reached ``net``."""
    if mode == "compile":
        module = compiler(module)

    def step(td: Any) -> torch.Tensor:
        out = module(td)["c"]["d"]
        out.mean().backward()
        return out

    out = run_mode(benchmark, impl, "eager", compiler, step, td)
    assert out.shape == (32, 4) and net[0].weight.grad is not None


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_mod_wrap_and_backward(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """The MLP (1024 wide, depth 5) from "a" into ("c", "d"), then ``mean().backward()``
    outside the compiled module, as in tensordict's suite."""
    net = mlp(num_cells=1024, depth=5)
    td = _node(impl, {"a": torch.zeros(32, 3)})
    module = _mod(impl, net, "a", ("c", "d"))
    _run_with_backward(benchmark, impl, mode, compiler, module, net, td)


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_seq_add(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """Two ``x + 1`` modules through "hidden", which the output drops."""
    td = _node(impl, {"a": torch.zeros(())})
    out = run_mode(benchmark, impl, mode, compiler, _seq(impl, [AddOne(), AddOne()]), td)
    assert out["c"]["d"] == 2 and "hidden" not in out.keys()


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_seq_wrap(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """Each layer of the MLP (32 wide) as its own module, through "hidden"."""
    net = mlp()
    td = _node(impl, {"a": torch.zeros(32, 3)})
    out = run_mode(benchmark, impl, mode, compiler, _seq(impl, list(net)), td)
    torch.testing.assert_close(out["c"]["d"], net(torch.zeros(32, 3)))
    assert "hidden" not in out.keys()


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_seq_wrap_and_backward(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """As ``test_seq_wrap`` with the MLP 1024 wide and depth 5, then ``mean().backward()``."""
    net = mlp(num_cells=1024, depth=5)
    td = _node(impl, {"a": torch.zeros(32, 3)})
    module = _seq(impl, list(net))
    _run_with_backward(benchmark, impl, mode, compiler, module, net, td)


def _func_call(impl: Impl, module: nn.Module) -> tuple[Callable[..., torch.Tensor], Any]:
    """A function ``(x, params) -> module(x)`` computed with ``params``, and the params
    (detached copies of the module's, requiring grad)."""
    if impl.name == "tensordict":
        params = tensordict.TensorDictParams(tensordict.TensorDict.from_module(module).clone())

        def call(x: torch.Tensor, td: Any) -> torch.Tensor:
            swapped = td.to_module(module, return_swap=True)
            result = module(x)
            swapped.to_module(module, return_swap=False)
            return result

        return call, params
    fresh = {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}
    if impl.name == "tdtree":
        node = tdtree.TensorDict(fresh, []).unflatten_keys(".")
        return (lambda x, p: functional_call(module, p, x)), node
    return (lambda x, p: torch.func.functional_call(module, p, (x,))), fresh


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_func_call_runtime(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """An MLP (16 wide, depth 10) run with parameters other than its own (tensordict's
    ``functional=True`` rows: ``to_module`` with ``return_swap`` and back)."""
    module = mlp(depth=10, num_cells=16, feature_dim=16)
    call, params = _func_call(impl, module)
    x = torch.randn(2, 2, 16)
    out = run_mode(benchmark, impl, mode, compiler, call, x, params)
    torch.testing.assert_close(out, module(x))


@pytest.mark.pytree
@pytest.mark.parametrize("mode", MODES)
def test_func_call_runtime_and_backward(benchmark, impl: Impl, mode: str, compiler: Any) -> None:
    """As ``test_func_call_runtime``, then ``mean().backward()`` outside the compiled call
    (tensordict's suite calls it inside, which ``fullgraph=True`` refuses on torch 2.13)."""
    module = mlp(depth=10, num_cells=16, feature_dim=16)
    call, params = _func_call(impl, module)
    if mode == "compile":
        call = compiler(call)
    x = torch.randn(2, 2, 16)

    def step(x: torch.Tensor, params: Any) -> torch.Tensor:
        result = call(x, params)
        result.mean().backward()
        return result.detach()

    out = run_mode(benchmark, impl, "eager", compiler, step, x, params)
    torch.testing.assert_close(out, module(x))


# -- optimiser steps: eager, and one step per member of an ensemble inside vmap ----------------


def _dict_adam(params: Any, grads: Any, state: dict[str, Any], lr: float = 1e-3) -> tuple[Any, dict[str, Any]]:
    """``tdtree.optim.adam``'s step over dicts, written as a dict user writes it: ``optree.tree_map`` of
    torch ops (no foreach kernel, so it runs inside ``torch.func.vmap`` too)."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    step = state["step"] + 1
    m = optree.tree_map(lambda m, g: m.lerp(g, 1 - beta1), state["exp_avg"], grads)
    v = optree.tree_map(lambda v, g: (v * beta2).addcmul(g, g, value=1 - beta2), state["exp_avg_sq"], grads)
    step_size, root = lr / (1 - beta1**step), (1 - beta2**step).sqrt()
    new = optree.tree_map(lambda p, m, v: p - m / (v.sqrt() / root + eps) * step_size, params, m, v)
    return new, {"step": step, "exp_avg": m, "exp_avg_sq": v}


def _dict_adam_init(params: Any) -> dict[str, Any]:
    zeros = optree.tree_map(torch.zeros_like, params)
    return {"step": torch.zeros(()), "exp_avg": zeros, "exp_avg_sq": optree.tree_map(torch.zeros_like, params)}


def _mlp_params(impl: Impl, members: int | None = None) -> tuple[Any, Any]:
    """The parameters of the 3-layer MLP (32 wide) and gradients like them, as nested dicts or nodes;
    ``members`` stacks that many copies along a new dim 0 (a node's batch dim)."""
    net = mlp()
    params = {k: v.detach() for k, v in net.named_parameters()}
    grads = {k: torch.full_like(v, 0.5) for k, v in params.items()}
    if members is not None:
        params = {k: torch.stack([v + i for i in range(members)]) for k, v in params.items()}
        grads = {k: torch.stack([v * (i + 1) for i in range(members)]) for k, v in grads.items()}
    if impl.name == "tdtree":
        batch = [] if members is None else [members]
        nodes = [tdtree.TensorDict(d, batch).unflatten_keys(".") for d in (params, grads)]
        return nodes[0], nodes[1]
    return params, grads


@torch.no_grad()
@pytest.mark.pytree
@pytest.mark.no_tensordict  # it has no functional optimiser
def test_adam_step(benchmark, impl: Impl) -> None:
    """One Adam step over the MLP's 8 parameters, eager. tdtree: ``tdtree.optim.adam`` (foreach
    kernels over the flat leaves); pytree: the same step as ``optree.tree_map`` of torch ops."""
    params, grads = _mlp_params(impl)
    if impl.name == "tdtree":
        state = optim.adam_init(params)
        new, _ = benchmark(optim.adam, params, grads, state)
    else:
        new, _ = benchmark(_dict_adam, params, grads, _dict_adam_init(params))
    leaf = new["0.weight"] if impl.name == "pytree" else new["0", "weight"]
    assert leaf.shape == (32, 3)


@torch.no_grad()
@pytest.mark.pytree
@pytest.mark.no_tensordict  # it has no functional optimiser
def test_vmap_ensemble_adam_step(benchmark, impl: Impl) -> None:
    """One Adam step per member of an ensemble of 5 MLPs, inside vmap. tdtree: ``tdtree.vmap`` of
    ``tdtree.optim.adam`` over nodes of batch size [5] (per-leaf ops replace its foreach kernels
    inside the transform); pytree: ``torch.func.vmap`` of the same step over dicts of stacked leaves."""
    params, grads = _mlp_params(impl, members=5)
    if impl.name == "tdtree":
        state = tdtree.vmap(optim.adam_init)(params)
        step = tdtree.vmap(lambda p, g, s: optim.adam(p, g, s))
    else:
        state = torch.func.vmap(_dict_adam_init)(params)
        step = torch.func.vmap(_dict_adam)
    new, new_state = benchmark(step, params, grads, state)
    leaf = new["0.weight"] if impl.name == "pytree" else new["0", "weight"]
    assert leaf.shape == (5, 32, 3) and new_state["step" if impl.name == "pytree" else 0].shape == (5,)
