"""The laws over torch's transforms: ``torch.compile``, ``tdtree.vmap`` and ``torch.func.grad``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis
import torch
from hypothesis import strategies as st

from .. import TensorClass, TensorDict, stack, tree, vmap
from .._torch_private import compile_counter, graph_breaks, quiet_trace_log
from ._assert import assert_close, key_text
from ._laws import Settings, law_error, paths, run_law
from ._strategies import same_structure
from ._values import values

__all__ = ["assert_compiles", "assert_vmap", "assert_grad", "check_compiles", "check_vmap", "check_grad"]

# each example compiles afresh, so the compile law draws fewer examples unless settings= says otherwise
COMPILE_EXAMPLES = 20


def _first_lines(err: BaseException, n: int = 6) -> str:
    return "\n".join(f"{type(err).__name__}: {err}".splitlines()[:n])


def _close(
    law: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    got: Any,
    expected: Any,
    what: str,
    rtol: float | None,
    atol: float | None,
    check_tags: bool = True,
) -> None:
    try:
        assert_close(got, expected, rtol=rtol, atol=atol, check_tags=check_tags)
    except AssertionError as err:
        raise law_error(law, fn, args, f"{what}: {err}") from None


# -- compile ------------------------------------------------------------------------------------


def assert_compiles(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    again: tuple[Any, ...],
    *,
    backend: str = "inductor",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """``torch.compile(fn, fullgraph=True)`` gives ``fn``'s eager result (tags included) on ``args``, then on
    ``again`` (arguments of the same structure: see :func:`~tdtree.testing.same_structure`) without compiling again.

    Dynamo's caches are reset first (``torch.compiler.reset()``), so that each
    call starts from nothing. A failure reports the frames compiled and graph breaks counted.

    Args:
        fn: the function under test.
        args: a tuple of arguments.
        again: a second tuple of arguments of the same structure.
        backend: the ``torch.compile`` backend (``"aot_eager"`` / ``"eager"`` check tracing only).
        rtol, atol: tolerances of the comparison (None: per dtype, as :func:`~tdtree.testing.assert_close`).

    Raises:
        LawError: compiling failed, the results differ from eager, or ``again`` recompiled.
    """
    with quiet_trace_log():  # keeps a failure's report to the law's message (see quiet_trace_log)
        _compiles(fn, args, again, backend, rtol, atol)


def _compiles(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    again: tuple[Any, ...],
    backend: str,
    rtol: float | None,
    atol: float | None,
) -> None:
    torch.compiler.reset()
    counter = compile_counter(backend)
    breaks = graph_breaks()
    compiled = torch.compile(fn, fullgraph=True, backend=counter)

    def counts() -> str:
        return f"frames compiled: {counter.frame_count}, graph breaks: {graph_breaks() - breaks}"

    expected = fn(*args)
    try:
        got = compiled(*args)
    except Exception as err:
        raise law_error(
            "check_compiles", fn, args, f"torch.compile(fullgraph=True) failed ({counts()}):\n{_first_lines(err)}"
        ) from None
    _close("check_compiles", fn, args, got, expected, f"compiled and eager results differ ({counts()})", rtol, atol)
    expected = fn(*again)
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            got = compiled(*again)
    except Exception as err:
        raise law_error(
            "check_compiles",
            fn,
            again,
            f"recompiled for a second input of the same structure ({counts()}):\n{_first_lines(err)}",
        ) from None
    _close("check_compiles", fn, again, got, expected, f"compiled and eager results differ ({counts()})", rtol, atol)
    if counter.frame_count > 1:  # none when fn runs no tensor op (dynamo makes no graph)
        raise law_error("check_compiles", fn, args, f"expected at most one compiled frame ({counts()})")


def check_compiles(
    fn: Callable[..., Any],
    strategy: st.SearchStrategy[Any],
    *,
    backend: str = "inductor",
    rtol: float | None = None,
    atol: float | None = None,
    settings: Settings = None,
) -> None:
    """Over ``strategy``'s draws, ``fn`` compiles with ``fullgraph=True`` to its eager result and does not
    recompile for a second draw of the same structure (see :func:`~tdtree.testing.laws.assert_compiles`).

    ``backend="aot_eager"`` or ``"eager"`` checks tracing only, much faster than inductor's code
    generation. Each example compiles afresh (a second or more), so the law runs with no deadline,
    and without ``settings`` it draws at most ``COMPILE_EXAMPLES`` (20) examples and reports the
    first failure unshrunk (shrinking would compile hundreds of times); pass ``settings=`` to
    choose (``deadline`` stays None).

    Args:
        fn: the function under test.
        strategy: a strategy of the argument, or of a tuple of arguments (``st.tuples(...)``).
        backend: the ``torch.compile`` backend.
        rtol, atol: tolerances of the comparison (None: per dtype, as :func:`~tdtree.testing.assert_close`).
        settings: ``hypothesis.settings`` for this run (None: the current profile's, at most
            ``COMPILE_EXAMPLES`` examples, no shrinking); the deadline is None either way.

    Raises:
        LawError: for the first example where the law fails.
    """
    if settings is None:
        default = hypothesis.settings()  # the current profile's
        settings = hypothesis.settings(
            max_examples=min(default.max_examples, COMPILE_EXAMPLES),
            phases=[p for p in default.phases if p is not hypothesis.Phase.shrink],
        )

    def check(data: Any, args: tuple[Any, ...]) -> None:
        again = data.draw(same_structure(args), label="same structure")
        assert_compiles(fn, args, again, backend=backend, rtol=rtol, atol=atol)

    run_law("check_compiles", fn, strategy, check, settings, deadline=None)


# -- vmap ---------------------------------------------------------------------------------------


def _mapped_size(arg: Any, dim: int | None) -> int | None:
    """The size of ``arg``'s mapped dim, -1 when it has no such dim, None when it is not mapped."""
    if dim is None or not isinstance(arg, (TensorDict, TensorClass, torch.Tensor)):
        return None
    shape = arg.batch_size if isinstance(arg, (TensorDict, TensorClass)) else arg.shape
    return shape[dim] if -len(shape) <= dim < len(shape) else -1


def _stack(outs: list[Any]) -> Any:
    first = outs[0]
    if isinstance(first, (TensorDict, TensorClass)):
        return stack(outs)
    if isinstance(first, torch.Tensor):
        return torch.stack(outs)
    if type(first) in (tuple, list):
        return type(first)(_stack(list(parts)) for parts in zip(*outs))
    if isinstance(first, dict):
        return {k: _stack([o[k] for o in outs]) for k in first}
    raise TypeError(f"check_vmap: fn returned a {type(first).__name__}; return nodes, tensors, or containers of them")


def assert_vmap(
    fn: Callable[..., Any],
    *args: Any,
    in_dims: int | None | tuple[int | None, ...] = 0,
    rtol: float | None = None,
    atol: float | None = None,
) -> Any:
    """``tdtree.vmap(fn, in_dims)(*args)``, after checking it equals ``fn`` applied to each slice
    (``unbind`` along each argument's mapped dim) with the results stacked along dim 0.

    Nodes and tensors are mapped (``in_dims`` per argument, or one for all); other arguments are passed
    as they are. Tags are not compared here (that is :func:`~tdtree.testing.laws.assert_tags`' law).

    Args:
        fn: the function under test.
        *args: its arguments.
        in_dims: the mapped dim per argument (a tuple), or one for all; None: unmapped.
        rtol, atol: tolerances of the comparison (None: per dtype, as :func:`~tdtree.testing.assert_close`).

    Returns:
        What the mapped function returned.

    Raises:
        LawError: the results differ (naming the key).
        ValueError: no argument has a mapped dim of size 1 or more (draw with
            ``batch_size=batch_sizes(min_dims=1, min_side=1)``).
    """
    dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
    sizes = {s for s in (_mapped_size(a, d) for a, d in zip(args, dims)) if s is not None}
    if len(sizes) != 1 or min(sizes) < 1:
        raise ValueError(
            f"check_vmap: the mapped dims have sizes {sorted(sizes)}; every mapped argument needs the same "
            "size, 1 or more (draw nodes with batch_size=batch_sizes(min_dims=1, min_side=1))"
        )
    size = sizes.pop()
    got = vmap(fn, in_dims=in_dims)(*args)
    sliced = [a.unbind(d) if _mapped_size(a, d) is not None else None for a, d in zip(args, dims)]
    outs = [fn(*(s[i] if s is not None else a for a, s in zip(args, sliced))) for i in range(size)]
    _close(
        "check_vmap",
        fn,
        args,
        got,
        _stack(outs),
        "tdtree.vmap(fn) differs from stacking fn over the slices",
        rtol,
        atol,
        check_tags=False,
    )
    return got


def check_vmap(
    fn: Callable[..., Any],
    strategy: st.SearchStrategy[Any],
    *,
    in_dims: int | None | tuple[int | None, ...] = 0,
    rtol: float | None = None,
    atol: float | None = None,
    settings: Settings = None,
) -> None:
    """Over ``strategy``'s draws, ``tdtree.vmap(fn)`` equals ``fn`` stacked over the slices (see :func:`~tdtree.testing.laws.assert_vmap`).

    A draw whose mapped arguments hold no tensor (a node whose only entries are empty sub-nodes,
    which ``tensordicts(min_keys=1)`` can draw) is passed over (``hypothesis.assume``): vmap needs a
    tensor to map, as ``torch.vmap`` and ``jax.vmap`` do. The law runs with no deadline (each example
    traces afresh).

    Args:
        fn: the function under test.
        strategy: a strategy of the argument, or of a tuple of arguments (``st.tuples(...)``).
        in_dims: as in :func:`~tdtree.testing.laws.assert_vmap`.
        rtol, atol: tolerances of the comparison (None: per dtype, as :func:`~tdtree.testing.assert_close`).
        settings: ``hypothesis.settings`` for this run (None: the current profile's); the deadline
            is None either way.

    Raises:
        LawError: for the (shrunk) example where the law fails.
        ValueError: as :func:`~tdtree.testing.laws.assert_vmap`.
    """

    def check(data: Any, args: tuple[Any, ...]) -> None:
        dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
        mapped = [a for a, d in zip(args, dims) if _mapped_size(a, d) is not None]
        hypothesis.assume(any(isinstance(x, torch.Tensor) for x in tree.leaves(mapped)))
        assert_vmap(fn, *args, in_dims=in_dims, rtol=rtol, atol=atol)

    run_law("check_vmap", fn, strategy, check, settings, deadline=None)


# -- grad ---------------------------------------------------------------------------------------


def _float_leaves(out: Any) -> list[torch.Tensor]:
    return [x for x in tree.leaves(out) if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())]


def assert_grad(
    fn: Callable[..., Any], *args: Any, seed: int = 0, eps: float = 1e-6, rtol: float = 1e-4, atol: float = 1e-6
) -> Any:
    """The gradient ``torch.func.grad`` takes through ``fn``, after checking it against central differences.

    ``fn``'s floating outputs are reduced to a scalar with fixed random weights
    (a vector-Jacobian product, as ``torch.autograd.gradcheck``'s fast mode
    does); for each floating input leaf, the gradient along a random direction
    must match ``(L(x + eps u) - L(x - eps u)) / (2 eps)`` within
    ``atol + rtol * |fd|`` plus the rounding error of ``L`` divided by ``eps``. Inputs must be float64 (draw with
    ``dtypes=(torch.float64, ...)``); other leaves pass through undifferentiated.

    Args:
        fn: the function under test.
        *args: its arguments; floating leaves must be float64.
        seed: seeds the weights and directions.
        eps: the finite-difference step.
        rtol, atol: the tolerances of the comparison.

    Returns:
        The gradients, one per floating input leaf, in leaf order.

    Raises:
        LawError: a gradient differs from the finite differences (naming the leaf).
        ValueError: a floating input leaf is not float64.
    """
    leaves, spec = tree.flatten(args)
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    for i in where:
        if leaves[i].dtype != torch.float64:
            raise ValueError(
                f"check_grad: finite differences need float64 inputs, got {leaves[i].dtype} (draw with dtypes=(torch.float64,))"
            )
    weights = [values(tuple(o.shape), o.dtype, seed + 7 * j + 1) for j, o in enumerate(_float_leaves(fn(*args)))]

    def loss(floats: list[torch.Tensor]) -> torch.Tensor:
        full = list(leaves)
        for i, x in zip(where, floats):
            full[i] = x
        outs = _float_leaves(fn(*tree.unflatten(spec, full)))
        total = torch.zeros((), dtype=torch.float64)
        for o, w in zip(outs, weights, strict=True):
            total = total + (o * w.to(o.device)).real.sum().to(torch.float64)
        return total

    inputs = [leaves[i].detach() for i in where]
    grads = torch.func.grad(loss)(inputs)
    names = [p for p, _ in paths(args)]
    for n, (i, x, g) in enumerate(zip(where, inputs, grads)):
        if x.numel() == 0:
            continue
        u = values(tuple(x.shape), torch.float64, seed + 7 * n + 3).to(x.device)
        shifted = [[y + h * u if j == n else y for j, y in enumerate(inputs)] for h in (eps, -eps)]
        with torch.no_grad():
            up, down = float(loss(shifted[0])), float(loss(shifted[1]))
        fd = (up - down) / (2 * eps)
        # the rounding error of the loss itself, magnified by 1 / eps: a large loss makes the differences noisy
        noise = 8 * torch.finfo(torch.float64).eps * (abs(up) + abs(down)) / (2 * eps)
        got = float((g * u).sum())
        if not abs(got - fd) <= atol + rtol * abs(fd) + noise:
            raise law_error(
                "check_grad",
                fn,
                args,
                f"d/d{key_text(names[i])} along a random direction: torch.func.grad gives {got!r}, "
                f"central differences (eps={eps:g}) give {fd!r}",
            )
    return grads


def check_grad(
    fn: Callable[..., Any],
    strategy: st.SearchStrategy[Any],
    *,
    eps: float = 1e-6,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    settings: Settings = None,
) -> None:
    """Over ``strategy``'s (float64) draws, ``torch.func.grad`` through ``fn`` matches finite differences
    (see :func:`~tdtree.testing.laws.assert_grad`); the weights and directions come from a drawn seed.

    Args:
        fn: the function under test.
        strategy: a strategy of the argument, or of a tuple of arguments (``st.tuples(...)``).
        eps, rtol, atol: as in :func:`~tdtree.testing.laws.assert_grad`.
        settings: ``hypothesis.settings`` for this run (None: the current profile's); the deadline
            is None either way (each example runs ``torch.func.grad`` afresh).

    Raises:
        LawError: for the (shrunk) example where the law fails.
        ValueError: as :func:`~tdtree.testing.laws.assert_grad`.
    """

    def check(data: Any, args: tuple[Any, ...]) -> None:
        seed = data.draw(st.integers(0, 2**20), label="seed")
        assert_grad(fn, *args, seed=seed, eps=eps, rtol=rtol, atol=atol)

    run_law("check_grad", fn, strategy, check, settings, deadline=None)
