"""The static (non-tensor) field values of a tensorclass instance, for the tensorclass tests."""

from __future__ import annotations

from typing import Any

import torch

import tdtree as tt


def statics(tc: Any) -> list[tuple[str, Any]]:
    """Every static field's value, nested ones by dotted path, in field order."""
    out: list[tuple[str, Any]] = []
    for name in type(tc)._fields:
        value = getattr(tc, name)
        if isinstance(value, tt.TensorClass):
            out += [(f"{name}.{k}", v) for k, v in statics(value)]
        elif not isinstance(value, (torch.Tensor, tt.TensorDict)):
            out.append((name, value))
    return out
