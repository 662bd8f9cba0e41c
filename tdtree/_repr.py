"""A readable repr of nodes and tensorclasses: each field with shape, dtype and device, nested
nodes and tensorclasses indented."""

from __future__ import annotations

from typing import Any

import torch

from ._base import Holder, Node
from ._kinds import kind

__all__ = ["node_repr", "record_repr"]


def _leaf(t: torch.Tensor) -> str:
    try:
        shape = tuple(t.shape)
    except Exception:  # a repr never fails: a nested tensor of strided layout has no sizes torch can tell
        found = kind(t)
        if found is None:
            raise
        return f"Tensor({found[0]}, device={t.device}, dtype={t.dtype})"
    return f"Tensor(shape={shape}, device={t.device}, dtype={t.dtype})"


def node_repr(node: Node, indent: int = 0) -> str:
    """``TypeName(fields={...}, batch_size=(...), device=...)``, one field a line."""
    # from an explicit stack of the levels above, not by recursion: any depth a nested dict gets
    lines: list[str] = []
    above: list[tuple[Node, Any, int]] = []
    items = _opened(node, indent, f"{type(node).__name__}(", lines)
    while True:
        pad = " " * (indent + 4)
        for k, v in items:
            if isinstance(v, Node):
                above.append((node, items, indent))
                node, indent = v, indent + 8
                items = _opened(v, indent, f"{pad}    {k}: {type(v).__name__}(", lines)
                break
            lines.append(f"{pad}    {k}: {_leaf(v)},")
        else:
            if node._data:
                lines.append(f"{pad}}},")
            _, batch_size, device, _ = node._meta
            lines += [f"{pad}batch_size={tuple(batch_size)},", f"{pad}device={device}", " " * indent + ")"]
            if not above:
                return "\n".join(lines)
            lines[-1] += ","
            node, items, indent = above.pop()


def _opened(node: Node, indent: int, first: str, lines: list[str]) -> Any:
    """The lines that open ``node``'s repr put in ``lines``; its entries, to be written next."""
    pad = " " * (indent + 4)
    lines.append(first)
    lines.append(f"{pad}fields={{" if node._data else f"{pad}fields={{}},")
    return iter(node._data.items())


def _value(value: Any, indent: int) -> str:
    if isinstance(value, torch.Tensor):
        return _leaf(value)
    if isinstance(value, Node):
        return node_repr(value, indent)
    if isinstance(value, Holder):  # a nested tensorclass
        return record_repr(value, indent)
    return repr(value)


def record_repr(tc: Any, indent: int = 0) -> str:
    """A tensorclass's repr: ``ClassName(field=..., ..., batch_size=(...), device=...)``, one field a line."""
    pad = " " * (indent + 4)
    lines = [f"{type(tc).__name__}("]
    lines += [f"{pad}{name}={_value(getattr(tc, name), indent + 4)}," for name in type(tc)._fields]
    lines.append(f"{pad}batch_size={tuple(tc.batch_size)},")
    lines.append(f"{pad}device={tc.device}")
    if tc.tags:
        lines[-1] += ","
        lines.append(f"{pad}tags={{{', '.join(sorted(t.name for t in tc.tags))}}}")
    lines.append(" " * indent + ")")
    return "\n".join(lines)
