"""A node as torch's ``Stateful``: ``state_dict()`` / ``load_state_dict()``.

``torch.distributed.checkpoint`` (DCP) asks each top-level value of the state dict it is given
whether it is ``Stateful`` (has both methods): it saves ``value.state_dict()`` and, when loading,
loads in place into the tensors of ``value.state_dict()`` and then hands that dict to
``value.load_state_dict``. A node answers with nested plain dicts of its own leaves, so DCP records
one entry per leaf, as for the same dict (a sharded DTensor leaf stays sharded), and loads in place
into the node's leaves. Without the protocol DCP's load replaces any mapping that is not a ``dict``
by ``None`` before planning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import Node, NodeT
from ._keys import display
from ._lookup import to_dict
from ._validate import nest
from ._writers import update_
from .errors import KeyMismatchError

__all__ = ["state_dict", "load_state_dict"]


def state_dict(node: Node) -> dict[str, Any]:
    """Nested plain dicts of the node's own leaves (not copied, not detached), as :meth:`to_dict`.

    With :func:`load_state_dict` this is torch's ``Stateful`` protocol, which
    ``torch.distributed.checkpoint`` uses for a node at the top level of a state dict. A dict
    holds no tags; the node keeps its own.

    Example:
        >>> import torch, tdtree as tt
        >>> td = tt.TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}})
        >>> sd = td.state_dict()
        >>> type(sd["b"]).__name__, sd["a"] is td["a"]
        ('dict', True)
    """
    return to_dict(node)


def load_state_dict(node: NodeT, state_dict: Mapping[Any, Any]) -> NodeT:
    """Write every value of ``state_dict`` into the leaf at its key, in place; works on Locked nodes.

    Strict, as ``nn.Module.load_state_dict``: the keys at every level are the node's. A value
    that is the leaf itself (a dict from :func:`state_dict` that was loaded into, as
    ``torch.distributed.checkpoint`` does) is not written again.

    Args:
        node: the node written (``self`` as a method).
        state_dict: nested mappings (or tuple keys) of tensors or numbers, shaped as the node.

    Returns:
        ``node`` itself (same object, tags kept).

    Raises:
        KeyMismatchError: the key sets differ at some level (the message names the keys).
        WriteError: a value's dtype, device or shape does not fit its leaf, or a leaf cannot be
            written (raised by the ``update_`` that writes); nothing was written.

    Example:
        >>> import torch, tdtree as tt
        >>> td = tt.TensorDict({"a": torch.zeros(2), "b": {"c": torch.zeros(2)}}).lock()
        >>> td.load_state_dict({"a": torch.ones(2), "b": {"c": torch.ones(2)}})["b", "c"].tolist()
        [1.0, 1.0]
    """
    return update_(node, _changed(node, _mapping(state_dict), ()))


def _changed(node: Node, source: Mapping[str, Any], prefix: tuple[str, ...]) -> dict[str, Any]:
    """``source`` less the values that are the node's leaves already; the keys checked equal."""
    data = node._data
    if data.keys() != source.keys():
        raise KeyMismatchError(
            f"load_state_dict at {display(prefix)!r}" if prefix else "load_state_dict",
            [display((*prefix, k)) for k in data],
            [display((*prefix, k)) for k in source],
        )
    out: dict[str, Any] = {}
    for k, value in source.items():
        leaf = data[k]
        if value is leaf:
            continue
        if isinstance(leaf, Node) and isinstance(value, Mapping):
            sub = _changed(leaf, _mapping(value), (*prefix, k))
            if sub:
                out[k] = sub
        else:
            out[k] = value
    return out


def _mapping(value: Mapping[Any, Any]) -> Mapping[str, Any]:
    return value._data if isinstance(value, Node) else nest(value, copy=False)
