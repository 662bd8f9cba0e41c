"""Pickling: nodes reduce to tensors and plain metadata, and rebuild through one function.

The rebuild function is the only thing tdtree adds to torch's safe globals, so
``torch.load(f, weights_only=True)`` of a file holding nodes works and can run
nothing else. Unpickling makes the tags' claims true again: leaves of a
``Shared`` node are moved to shared memory when they are not there already,
and a ``Memmap`` node pickles by reference (each leaf as its directory, file
index and view, see :func:`tdtree._memmap.reference`) and maps its files again,
shared or private as it was. Leaves that hold no bytes travel by value.

``nn.Parameter`` leaves (a :func:`tdtree.nn.from_module` node) pickle as
Parameters, through torch's own reduction (its ``_rebuild_parameter``, which
torch's ``weights_only`` unpickler accepts): they come back as Parameters
with their ``requires_grad``, and through ``torch.multiprocessing`` in the
same shared storage. A leaf of any other tensor subclass is refused on load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._base import Node, make
from ._memmap import reference, resolve
from ._names import name_of, root_named
from ._tags import Memmap, Shared, retag, tag_named
from ._validate import build
from .errors import BatchSizeError, KeyCollisionError, SerializationError

__all__ = ["reduce_node", "rebuild_node"]


# what a pickled leaf may be: exactly these types (a subclass could run its own code on use), each
# rebuilt by torch from tensors and plain metadata
_LEAF_TYPES = (torch.Tensor, nn.Parameter)


def reduce_node(node: Node) -> tuple[Any, tuple[Any, ...]]:
    """Pickle support (``__reduce__``): :func:`rebuild_node` and the node's metadata and leaves (a Memmap
    node's leaves as references to their files), so a pickle rebuilds a node with the same tags."""
    root = type(node)._root
    keys, batch_size, device, tags = node._meta
    values = tuple(node._data.values())
    if Memmap in tags:
        values = tuple(v if isinstance(v, Node) else reference(v) for v in values)
    return rebuild_node, (
        name_of(root),
        keys,
        values,
        tuple(batch_size),
        None if device is None else str(device),
        tuple(sorted(t.name for t in tags)),
    )


def rebuild_node(
    type_name: str,
    keys: tuple[str, ...],
    values: tuple[Any, ...],
    batch_size: tuple[int, ...],
    device: str | None,
    tag_names: tuple[str, ...],
) -> Node:
    """The node :func:`reduce_node` reduced, after the public constructor's validation.

    It is on torch's safe-globals list, so a hand-made pickle can call it with
    anything: keys must be unique, sorted strs, one per value, each a plain
    tensor, an ``nn.Parameter`` or a node; the batch size
    must fit every leaf; tags and the node type must be known. Anything else
    raises SerializationError.
    """
    root = root_named(type_name)
    if root is None:
        raise SerializationError(f"cannot unpickle a node of unknown type {str(type_name)[:80]!r}")
    if (
        type(keys) is not tuple
        or type(values) is not tuple
        or len(keys) != len(values)
        or any(type(k) is not str for k in keys)
        or list(keys) != sorted(set(keys))
    ):
        raise SerializationError(
            f"cannot unpickle a {type_name} node: its keys {str(keys)[:80]} are not unique sorted strs, "
            f"one for each of its {len(values) if type(values) is tuple else '?'} values"
        )
    if type(batch_size) is not tuple or any(type(d) is not int or d < 0 for d in batch_size):
        raise SerializationError(f"cannot unpickle a {type_name} node: malformed batch_size {str(batch_size)[:80]}")
    if type(tag_names) is not tuple or type(device) not in (str, type(None)):
        raise SerializationError(f"cannot unpickle a {type_name} node: malformed tags or device")
    try:
        tags = frozenset(tag_named(n) for n in tag_names)
        recorded = None if device is None else torch.device(device)
    except (ValueError, RuntimeError, TypeError) as err:
        raise SerializationError(f"cannot unpickle a {type_name} node: {err}") from None
    if Memmap in tags:
        values = tuple(v if isinstance(v, Node) else resolve(v) for v in values)
    for k, v in zip(keys, values):
        if type(v) not in _LEAF_TYPES and not isinstance(v, Node):
            raise SerializationError(
                f"cannot unpickle a {type_name} node: its value at {k!r} is a {type(v).__name__}, "
                "not a tensor, a Parameter or a node"
            )
    try:
        built = build(root, dict(zip(keys, values)), torch.Size(batch_size), None)
    except (BatchSizeError, KeyCollisionError, TypeError, ValueError) as err:
        raise SerializationError(f"cannot unpickle a {type_name} node: {err}") from None
    if recorded is not None and built._meta[2] not in (None, recorded):
        raise SerializationError(
            f"cannot unpickle a {type_name} node: recorded on {recorded}, its leaves are on {built._meta[2]}"
        )
    if Shared in tags:
        for v in values:
            if isinstance(v, torch.Tensor) and not v.is_shared():
                v.share_memory_()
    # built only validates (it would untag tagged sub-nodes, which keep their tags); the claims are
    # true again (above), so the tags are written back: unpickling is one of retag's callers
    found = recorded if recorded is not None else built._meta[2]
    node = make(root, dict(zip(keys, values)), built._meta[1], found)
    return retag(node, tags) if tags else node


torch.serialization.add_safe_globals([rebuild_node])
