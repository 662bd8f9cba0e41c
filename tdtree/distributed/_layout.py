"""A node's wire layout: its structure fingerprint and its consolidated buffer.

The *description* of a node lists every sub-node (path, batch size) and every
leaf (path, shape, dtype) in canonical key order; tags and devices are not part
of it, so a shared node may be sent to a plain one. The *fingerprint* is a
64-bit hash of the description, the same in every process (``hashlib``, not
Python's salted ``hash``).

The consolidated buffer is one contiguous ``uint8`` tensor holding every leaf's
bytes: leaves are grouped by dtype (in order of first appearance), each group
starts at a multiple of 16 bytes, so a group is a contiguous tensor of its
dtype (what a reduction needs) and every leaf is a view of it. Unpacking makes
views only, no copy.

Layouts depend only on structure, so they are cached by the node's pytree
structure plus its leaves' shapes and dtypes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import optree
import torch

from .._base import Node
from .._keys import display
from .._pytree import NAMESPACE
from .._tags import retag

__all__ = ["Layout", "layout_of", "pack", "rows", "unpack", "unpack_stacked", "differences"]

_ALIGN = 16  # the largest element size (complex128), so every group's start suits its dtype
_CACHE_SIZE = 512


@dataclass(frozen=True)
class Run:
    """Consecutive leaves of one group with the same shape: packed by one ``stack``, unpacked by one ``unbind``."""

    shape: torch.Size
    indices: tuple[int, ...]
    numel: int


@dataclass(frozen=True)
class Group:
    """The leaves of one dtype: where they start in the buffer, and their runs of equal shapes."""

    dtype: torch.dtype
    start: int
    nbytes: int
    runs: tuple[Run, ...]


@dataclass(frozen=True)
class Layout:
    """Everything about a node's structure that sending it needs; see the module docstring."""

    fingerprint: int
    description: tuple[tuple[Any, ...], ...]
    spec: optree.PyTreeSpec  # the untagged structure results are rebuilt with
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    groups: tuple[Group, ...]
    nbytes: int
    headers: dict[Any, Any] = field(default_factory=dict, compare=False)  # filled by _protocol.header
    # the view every leaf is a row of, when there is one group of one run (leaves of one dtype and
    # shape, the common case): pack and unpack then skip the per-group and per-run slicing
    stacked: tuple[torch.dtype, tuple[int, ...]] | None = None


def _describe(node: Node) -> tuple[tuple[Any, ...], ...]:
    out: list[tuple[Any, ...]] = []
    _describe_into(node, (), out)
    return tuple(out)


def _describe_into(level: Node, prefix: tuple[str, ...], out: list[tuple[Any, ...]]) -> None:
    # a module function, not a closure: a closure calling itself is a cycle only the garbage collector frees
    out.append(("node", list(prefix), list(level._meta[1])))
    for k, v in level._data.items():
        if isinstance(v, Node):
            _describe_into(v, (*prefix, k), out)
        else:
            out.append(("leaf", [*prefix, k], list(v.shape), str(v.dtype).removeprefix("torch.")))


def _fingerprint(description: tuple[tuple[Any, ...], ...]) -> int:
    digest = hashlib.blake2b(json.dumps(description).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _groups(leaves: list[torch.Tensor]) -> tuple[tuple[Group, ...], int]:
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, leaf in enumerate(leaves):
        by_dtype.setdefault(leaf.dtype, []).append(i)
    groups, start = [], 0
    for dtype, indices in by_dtype.items():
        runs: list[list[int]] = []
        for i in indices:
            if runs and leaves[runs[-1][-1]].shape == leaves[i].shape:
                runs[-1].append(i)
            else:
                runs.append([i])
        made = tuple(Run(leaves[r[0]].shape, tuple(r), len(r) * leaves[r[0]].numel()) for r in runs)
        nbytes = sum(r.numel for r in made) * dtype.itemsize
        groups.append(Group(dtype, start, nbytes, made))
        start += -(-nbytes // _ALIGN) * _ALIGN
    return tuple(groups), start


def _build(node: Node, leaves: list[torch.Tensor]) -> Layout:
    description = _describe(node)
    groups, nbytes = _groups(leaves)
    spec = optree.tree_structure(retag(node, frozenset()), namespace=NAMESPACE)
    stacked = None
    if len(groups) == 1 and len(groups[0].runs) == 1 and len(leaves) > 1:
        run = groups[0].runs[0]
        stacked = (groups[0].dtype, (len(run.indices), *run.shape))
    return Layout(
        _fingerprint(description),
        description,
        spec,
        tuple(x.shape for x in leaves),
        tuple(x.dtype for x in leaves),
        groups,
        nbytes,
        stacked=stacked,
    )


_CACHE: dict[tuple[Any, ...], Layout] = {}


def layout_of(node: Node) -> tuple[Layout, list[torch.Tensor]]:
    """``node``'s layout (cached by structure) and its leaves in canonical order, detached (views of
    the same storages) when some require grad."""
    if not isinstance(node, Node):
        raise TypeError(f"tdtree.distributed sends nodes, got {type(node).__name__}")
    leaves: list[torch.Tensor]
    leaves, spec = optree.tree_flatten(node, namespace=NAMESPACE)  # type: ignore[arg-type]
    if torch.is_grad_enabled() and any(x.requires_grad for x in leaves):
        # torch.distributed moves values, not autograd history (its ops on a Parameter write
        # the data in place, unrecorded): packing and receiving work on the leaves' data
        leaves = [x.detach() for x in leaves]
    key = (spec, *[(x.shape, x.dtype) for x in leaves])
    layout = _CACHE.get(key)
    if layout is None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        layout = _CACHE[key] = _build(node, leaves)
    return layout, leaves


def _parts(seg: torch.Tensor, group: Group, dim: int) -> Any:
    if len(group.runs) == 1:
        return (seg,)
    return seg.split([r.numel for r in group.runs], dim)


def rows(layout: Layout, buf: torch.Tensor) -> torch.Tensor | None:
    """``buf`` viewed as the stack of every leaf (see ``Layout.stacked``), or None when there is no such view."""
    if layout.stacked is None:
        return None
    return buf[: layout.groups[0].nbytes].view(layout.stacked[0]).view(layout.stacked[1])


def pack(layout: Layout, leaves: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """``out`` (a ``uint8`` tensor of ``layout.nbytes``) after copying every leaf into it."""
    stack = rows(layout, out)
    if stack is not None:
        torch.stack(leaves, out=stack)
        return out
    for g in layout.groups:
        seg = out[g.start : g.start + g.nbytes].view(g.dtype)
        for run, part in zip(g.runs, _parts(seg, g, 0)):
            if len(run.indices) == 1:
                part.view(run.shape).copy_(leaves[run.indices[0]])
            else:
                torch.stack([leaves[i] for i in run.indices], out=part.view(len(run.indices), *run.shape))
    return out


def unpack(layout: Layout, buf: torch.Tensor) -> Any:
    """An untagged node whose leaves are views of ``buf`` (no copy)."""
    stack = rows(layout, buf)
    if stack is not None:
        return optree.tree_unflatten(layout.spec, stack.unbind(0))
    leaves: list[Any] = [None] * len(layout.shapes)
    for g in layout.groups:
        seg = buf[g.start : g.start + g.nbytes].view(g.dtype)
        for run, part in zip(g.runs, _parts(seg, g, 0)):
            if len(run.indices) == 1:
                leaves[run.indices[0]] = part.view(run.shape)
            else:
                for i, leaf in zip(run.indices, part.view(len(run.indices), *run.shape).unbind(0)):
                    leaves[i] = leaf
    return optree.tree_unflatten(layout.spec, leaves)


def unpack_stacked(layout: Layout, buf: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The leaves of ``n`` buffers laid end to end in ``buf``, each leaf stacked on a new dim 0 (views)."""
    rows = buf.view(n, layout.nbytes)
    leaves: list[Any] = [None] * len(layout.shapes)
    for g in layout.groups:
        seg = rows[:, g.start : g.start + g.nbytes].view(g.dtype)
        for run, part in zip(g.runs, _parts(seg, g, 1)):
            k = len(run.indices)
            for i, leaf in zip(run.indices, part.view(n, k, *run.shape).unbind(1)):
                leaves[i] = leaf
    return leaves


def _by_path(description: Any) -> dict[tuple[str, ...], tuple[Any, ...]]:
    return {tuple(entry[1]): tuple(entry) for entry in description}


def differences(mine: Any, theirs: Any, me: str, them: str) -> list[str]:
    """Lines naming how the description ``mine`` (held by ``me``) differs from ``theirs`` (held by ``them``)."""
    a, b = _by_path(mine), _by_path(theirs)
    lines = []
    only_a = [repr(display(p)) for p in a if p not in b]
    only_b = [repr(display(p)) for p in b if p not in a]
    if only_a:
        lines.append(f"keys only on {me}: {', '.join(only_a)}")
    if only_b:
        lines.append(f"keys only on {them}: {', '.join(only_b)}")
    for path, x in a.items():
        y = b.get(path)
        if y is None or x == y:
            continue
        where = f"{display(path)!r}" if path else "the root"
        if x[0] != y[0]:
            kinds = {"node": "a node", "leaf": "a tensor"}
            lines.append(f"{where} is {kinds[x[0]]} on {me} and {kinds[y[0]]} on {them}")
        elif x[0] == "node":
            lines.append(f"{where} has batch_size {tuple(x[2])} on {me} and {tuple(y[2])} on {them}")
        else:
            if x[2] != y[2]:
                lines.append(f"{where} has shape {tuple(x[2])} on {me} and {tuple(y[2])} on {them}")
            if x[3] != y[3]:
                lines.append(f"{where} has dtype {x[3]} on {me} and {y[3]} on {them}")
    return lines
