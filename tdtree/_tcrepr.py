"""The repr of a tensorclass: its class name and each field, one a line."""

from __future__ import annotations

from typing import Any

import torch

from ._base import Node
from ._repr import node_repr
from ._tcops import RecordOps

__all__ = ["record_repr"]


def _value(value: Any, indent: int) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={tuple(value.shape)}, device={value.device}, dtype={value.dtype})"
    if isinstance(value, Node):
        return node_repr(value, indent)
    if isinstance(value, RecordOps):
        return record_repr(value, indent)
    return repr(value)


def record_repr(tc: Any, indent: int = 0) -> str:
    """``ClassName(field=..., ..., batch_size=(...), device=...)``, one field a line."""
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
