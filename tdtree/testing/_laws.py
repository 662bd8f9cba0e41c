"""Laws over a user's function: how each runs as a hypothesis test, and the purity and tag laws.

Each law comes twice: ``assert_<law>(fn, *args)`` checks one example (call it
inside your own ``@given`` test, next to other assertions), and
``check_<law>(fn, strategy)`` runs it as a hypothesis test over ``strategy``.
A strategy that draws a tuple gives ``fn`` several positional arguments.
Failures raise AssertionError naming the law, the key and the drawn example.
A ``check_`` form is a test of its own: call it from a plain test function,
not inside ``@given`` (hypothesis refuses nested tests; use ``assert_`` there).

Settings: a ``check_`` form runs under the current hypothesis profile, with
what its work needs over it: the compile, vmap and grad laws run with no
deadline (each example compiles, or traces, afresh: a second or more against
hypothesis's default 200 ms), and the compile law draws fewer examples unless
told otherwise. Pass others as ``settings=hypothesis.settings(...)``; a
``@settings`` decorator on the calling test does not reach the law (hypothesis
refuses it on a test without ``@given``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import hypothesis
import torch
from hypothesis import given
from hypothesis import strategies as st

from .. import Locked, LockedError, Memmap, Shared, TensorClass, TensorDict, tree
from ._assert import key_text

__all__ = ["run_law", "LawError", "law_error", "example_text", "assert_pure", "assert_tags", "check_pure", "check_tags"]

Settings = hypothesis.settings | None


class LawError(AssertionError):
    """A law does not hold for a function on a drawn example."""


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _short(x: Any) -> str:
    if not isinstance(x, torch.Tensor):
        return repr(x)
    if x.is_meta:
        return f"{x.dtype} {tuple(x.shape)} on meta"
    flat = x.detach().cpu().reshape(-1)
    shown = ", ".join(repr(v) for v in flat[:6].tolist()) + (", ..." if flat.numel() > 6 else "")
    return f"{x.dtype} {tuple(x.shape)} [{shown}]"


def _describe(arg: Any) -> str:
    if isinstance(arg, (TensorDict, TensorClass)):
        return f"{type(arg).__name__}, batch_size {tuple(arg.batch_size)}, device {arg.device}, tags {_tag_names(arg.tags)}"
    return type(arg).__name__


def _tag_names(tags: frozenset) -> str:
    return "{" + ", ".join(sorted(t.name for t in tags)) + "}"


def paths(args: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(path, leaf)`` of each leaf of ``args``; the path leaves out the argument index for one argument."""
    found, leaves, _ = tree.flatten_with_path(args)
    for path, leaf in zip(found, leaves):
        yield (path[1:] if len(args) == 1 else path), leaf


def example_text(args: tuple[Any, ...]) -> str:
    """The drawn arguments, one line per argument and per leaf (dtype, shape, first values)."""
    lines = [f"  argument {i}: {_describe(a)}" for i, a in enumerate(args)]
    lines += [f"    {key_text(p)}: {_short(x)}" for p, x in paths(args)]
    return "\n".join(lines)


def law_error(law: str, fn: Callable[..., Any], args: tuple[Any, ...], what: str, drawn: str | None = None) -> LawError:
    """The failure of ``law`` for ``fn`` on ``args`` (``drawn``: their text, when taken before ``fn`` ran)."""
    return LawError(f"{law}({_name(fn)}): {what}\ndrawn example:\n{drawn or example_text(args)}")


def run_law(
    law: str,
    fn: Callable[..., Any],
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any, tuple[Any, ...]], None],
    settings: Settings,
    **needs: Any,
) -> None:
    """Run ``check(data, args)`` as a hypothesis test over ``strategy`` (a tuple draw is the arguments),
    under ``settings`` (None: the current profile's) with the settings the law ``needs`` over them."""

    def test(drawn: Any, data: Any) -> None:
        check(data, drawn if type(drawn) is tuple else (drawn,))

    test.__name__ = test.__qualname__ = law
    # hypothesis keys its example database by the test's source and this digest (as for pytest's
    # parametrize cases), so that each law over each function replays its own failures
    test._hypothesis_internal_add_digest = f"{law}:{getattr(fn, '__module__', '')}.{_name(fn)}".encode()  # type: ignore[attr-defined]
    runner = given(strategy, st.data())(test)
    if needs:
        settings = hypothesis.settings(settings or hypothesis.settings(), **needs)
    if settings is not None:
        runner = settings(runner)
    runner()


# -- purity -----------------------------------------------------------------------------------


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s elements as rows of bytes (bit-for-bit comparison: -0.0 differs from 0.0, NaN payloads count)."""
    flat = x.detach().reshape(-1).contiguous()
    return flat.view(torch.uint8).reshape(flat.numel(), x.element_size())


def _snapshot(args: tuple[Any, ...]) -> tuple[Any, list[tuple[tuple[Any, ...], Any, int, torch.Tensor | None]]]:
    taken: list[tuple[tuple[Any, ...], Any, int, torch.Tensor | None]] = [
        (p, x, x._version, _bits(x).clone()) if isinstance(x, torch.Tensor) else (p, x, 0, None) for p, x in paths(args)
    ]
    return tree.structure(args), taken


def assert_pure(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, after checking it left ``args`` as they were: the same structure (keys, batch sizes,
    tags), the same leaf objects, each leaf's ``_version`` and its values bit for bit.

    Args:
        fn: the function under test.
        *args: its arguments (nodes, tensorclasses, tensors, containers of them).

    Returns:
        What ``fn`` returned.

    Raises:
        LawError: naming the first change found and the arguments.

    >>> import torch, tdtree as tt
    >>> from tdtree.testing.laws import assert_pure
    >>> td = tt.TensorDict({"x": torch.zeros(2)})
    >>> assert_pure(lambda t: t + 1, td)["x"]
    tensor([1., 1.])
    """
    structure, before = _snapshot(args)
    drawn = example_text(args)  # the values as drawn, before fn could change them
    out = fn(*args)

    def failed(what: str) -> LawError:
        return law_error("check_pure", fn, args, what, drawn)

    if tree.structure(args) != structure:
        raise failed(f"the input's structure changed: {structure} -> {tree.structure(args)}")
    now = dict(paths(args))
    for path, leaf, version, bits in before:
        where = key_text(path)
        if path not in now or now[path] is not leaf:
            raise failed(f"the leaf at {where} was replaced")
        if bits is None:
            continue
        if leaf._version != version:
            raise failed(f"fn wrote into its input at {where}: _version {version} -> {leaf._version}")
        after = _bits(leaf)
        if not torch.equal(after, bits):
            i = int((after != bits).any(1).nonzero()[0])
            index = tuple(int(d) for d in torch.unravel_index(torch.tensor(i), leaf.shape)) if leaf.ndim else ()
            was = bits[i].view(leaf.dtype).item()
            now_value = leaf.detach().cpu()[index].item()
            raise failed(
                f"fn changed its input at {where} without a recorded write: first at index {index}: {was!r} -> {now_value!r}"
            )
    return out


def check_pure(fn: Callable[..., Any], strategy: st.SearchStrategy[Any], *, settings: Settings = None) -> None:
    """Over ``strategy``'s draws, ``fn`` leaves its inputs unchanged (see :func:`~tdtree.testing.laws.assert_pure`).

    Args:
        fn: the function under test.
        strategy: a strategy of the argument, or of a tuple of arguments (``st.tuples(...)``).
        settings: ``hypothesis.settings`` for this run (None: the current profile's).

    Raises:
        LawError: for the (shrunk) example where the law fails.
    """
    run_law("check_pure", fn, strategy, lambda data, args: assert_pure(fn, *args), settings)


# -- tags ---------------------------------------------------------------------------------------


def _storage(x: torch.Tensor) -> tuple[torch.device, int] | None:
    """The storage identity of DESIGN 3: ``(device, data_ptr)``; None for a storage with no bytes."""
    s = x.untyped_storage()
    return (x.device, s.data_ptr()) if s.nbytes() else None


def _inner(value: Any) -> TensorDict:
    return value.to_node() if isinstance(value, TensorClass) else value


def _node_inputs(args: tuple[Any, ...]) -> list[Any]:
    """The node inputs as the rule counts them: node arguments, and nodes in list or tuple arguments."""
    found = []
    for a in args:
        for item in a if type(a) in (list, tuple) else (a,):
            if isinstance(item, (TensorDict, TensorClass)):
                found.append(item)
    return found


def _results(out: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(out, (TensorDict, TensorClass)):
        yield path, out
    elif type(out) in (list, tuple):
        for i, item in enumerate(out):
            yield from _results(item, (*path, i))
    elif isinstance(out, dict):
        for k, item in out.items():
            yield from _results(item, (*path, k))


def _claims(result: Any) -> str | None:
    """What is false about ``result``'s tags (every sub-node carries them; each claim holds), or None."""
    node = _inner(result)
    tags = result.tags
    for key, value in node.items(include_nested=True):
        if isinstance(value, TensorDict) and value.tags != tags:
            return f"sub-node {key_text(key if isinstance(key, tuple) else (key,))} carries {_tag_names(value.tags)}, the root {_tag_names(tags)}"
    for key, leaf in node.items(include_nested=True, leaves_only=True):
        if _storage(leaf) is None:
            continue
        where = key_text(key if isinstance(key, tuple) else (key,))
        if Shared in tags and not leaf.is_shared():
            return f"it claims Shared but the leaf at {where} is not in shared memory"
        if Memmap in tags and leaf.untyped_storage().filename is None:
            return f"it claims Memmap but the leaf at {where} is not mapped from a file"
    if Locked in tags and len(node.keys()):
        key = next(iter(node.keys()))
        try:
            node.set(key, node[key])
        except LockedError:
            pass
        else:
            return f"it claims Locked but set({key!r}, ...) did not raise LockedError"
    return None


def assert_tags(fn: Callable[..., Any], *args: Any, rule: bool = True) -> Any:
    """``fn(*args)``, after checking the tags of every node or tensorclass it returns.

    Every claim must be true: every sub-node carries the root's tags, the leaves
    of a Shared node are in shared memory, those of a Memmap node are mapped from
    files, a Locked node refuses ``set``. With ``rule`` (for tdtree's operations
    and functions made of them), the tags are also the rule's, computed here
    independently of tdtree: a storage is ``(device, untyped_storage().data_ptr())``,
    storages with no bytes never decide; a result carries the tags common to the
    node inputs if every leaf holding data uses an input's storage, and no tags
    otherwise. Pass ``rule=False`` for functions that make tags (``lock``,
    ``share_memory``, ``memmap``, ``unlock``) or build nodes from leaves (which
    carry no tags by design).

    Args:
        fn: the function under test.
        *args: its arguments.
        rule: also check the tags against the storage rule.

    Returns:
        What ``fn`` returned.

    Raises:
        LawError: naming the result and the false claim, or the tags the rule gives.
    """
    inputs = _node_inputs(args)
    known = {_storage(x) for node in inputs for x in tree.leaves(node) if isinstance(x, torch.Tensor)}
    common = frozenset.intersection(*(n.tags for n in inputs)) if inputs else frozenset()
    out = fn(*args)
    for path, result in _results(out):
        where = f"result {key_text(path)}" if path else "the result"
        if rule:
            new = [
                p
                for p, x in _inner(result).items(include_nested=True, leaves_only=True)
                if _storage(x) is not None and _storage(x) not in known
            ]
            expected = frozenset() if new else common
            if result.tags != expected:
                why = (
                    f"the leaf at {key_text(new[0] if isinstance(new[0], tuple) else (new[0],))} is new storage"
                    if new
                    else "every leaf uses an input's storage"
                )
                raise law_error(
                    "check_tags",
                    fn,
                    args,
                    f"{where} carries {_tag_names(result.tags)}; the rule gives {_tag_names(expected)} ({why})",
                )
        false = _claims(result)
        if false is not None:
            raise law_error("check_tags", fn, args, f"{where}: {false}")
    return out


def check_tags(
    fn: Callable[..., Any], strategy: st.SearchStrategy[Any], *, rule: bool = True, settings: Settings = None
) -> None:
    """Over ``strategy``'s draws (tagged ones: ``tensordicts(tags=True)``), every claim of ``fn``'s results'
    tags is true and, with ``rule``, the tags follow the storage rule (see :func:`~tdtree.testing.laws.assert_tags`).

    Args:
        fn: the function under test.
        strategy: a strategy of the argument, or of a tuple of arguments (``st.tuples(...)``).
        rule: also check the tags against the storage rule.
        settings: ``hypothesis.settings`` for this run (None: the current profile's).

    Raises:
        LawError: for the (shrunk) example where the law fails.
    """
    run_law("check_tags", fn, strategy, lambda data, args: assert_tags(fn, *args, rule=rule), settings)
