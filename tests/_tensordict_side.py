"""The tensordict side of the interop tests: the optional import, a tensordict holding a node's
tensors, and the check that two tensordicts hold the same tensor objects."""

from __future__ import annotations

from typing import Any

import pytest

import tdtree as tt

try:
    import tensordict
except ImportError:
    tensordict = None

needs_tensordict = pytest.mark.skipif(tensordict is None, reason="tensordict is not installed: pip install tensordict")


def tensordict_like(node: tt.TensorDict, device: Any = "same") -> Any:
    """The tensordict holding ``node``'s tensors, built with tensordict's public constructor."""
    data = {k: tensordict_like(v, device) if isinstance(v, tt.TensorDict) else v for k, v in node.items()}
    out = tensordict.TensorDict(data, batch_size=node.batch_size, device=node.device if device == "same" else device)
    return out.lock_() if node.is_locked else out


def assert_same_tensordict(a: Any, b: Any) -> None:
    """Same keys (as sets), batch sizes, devices and tensor objects, level by level."""
    assert set(a.keys()) == set(b.keys())
    assert a.batch_size == b.batch_size
    assert a.device == b.device
    for key in a.keys():
        x, y = a.get(key), b.get(key)
        if isinstance(x, tensordict.TensorDict):
            assert_same_tensordict(x, y)
        else:
            assert x is y
