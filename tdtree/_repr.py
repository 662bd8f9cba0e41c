"""A readable repr: each field with shape, dtype and device, nested nodes indented."""

from __future__ import annotations

import torch

from ._base import Node

__all__ = ["node_repr"]


def _leaf(t: torch.Tensor) -> str:
    return f"Tensor(shape={tuple(t.shape)}, device={t.device}, dtype={t.dtype})"


def node_repr(node: Node, indent: int = 0) -> str:
    """``TypeName(fields={...}, batch_size=(...), device=...)``, one field a line."""
    pad = " " * (indent + 4)
    lines = [f"{type(node).__name__}("]
    if node._data:
        lines.append(f"{pad}fields={{")
        for k, v in node._data.items():
            text = node_repr(v, indent + 8) if isinstance(v, Node) else _leaf(v)
            lines.append(f"{pad}    {k}: {text},")
        lines.append(f"{pad}}},")
    else:
        lines.append(f"{pad}fields={{}},")
    _, batch_size, device, _ = node._meta
    lines += [f"{pad}batch_size={tuple(batch_size)},", f"{pad}device={device}", " " * indent + ")"]
    return "\n".join(lines)
