"""Pickling: nodes reduce to tensors and plain metadata, and rebuild through one function.

The rebuild function is the only thing tdtree adds to torch's safe globals, so
``torch.load(f, weights_only=True)`` of a file holding nodes works and can run
nothing else. Unpickling makes the tags' claims true again: leaves of a
``Shared`` node are moved to shared memory when they are not there already.

A pickled ``Memmap`` node comes back as the node that was pickled (its values,
its mode) or is refused with MemmapError; it never maps bytes another writer
put under the same prefix. Mapped ``"r+"`` or ``"r"``, it pickles by reference
(each leaf as its directory, file index, view and the identities of the files
mapped, see :func:`reference`) and maps the same files again with the same
mode, through ``torch.multiprocessing`` too (no bytes copied), while the
directory is the one mapped; a directory another writer replaced (or removed)
is refused. Mapped ``"c"`` (copy-on-write), its private writes are in no file:
it pickles by value, as its ``clone()`` (an untagged in-memory copy: new
storage; torch's own reduction cannot send a private mapping to a worker).
Leaves that hold no bytes travel by value. ``copy.deepcopy`` of a Memmap node
is an independent in-memory copy, untagged as ``clone()`` (writing it never
reaches the files); other nodes deep-copy through their pickle reduction.

``nn.Parameter`` leaves (a :func:`tdtree.nn.from_module` node) pickle as
Parameters, through torch's own reduction (its ``_rebuild_parameter``, which
torch's ``weights_only`` unpickler accepts): they come back as Parameters
with their ``requires_grad``, and through ``torch.multiprocessing`` in the
same shared storage. A leaf of any other tensor subclass is refused on load.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._base import Node, make
from ._kinds import error
from ._lookup import walk
from ._maps import clone, leaves, refuse_first
from ._memmap import leaf_name, mappable, origin, reopen
from ._names import name_of, root_named
from ._tags import Memmap, Shared, retag, tag_named
from ._treefile import dtype_name, dtype_named
from ._validate import build
from .errors import BatchSizeError, KeyCollisionError, MemmapError, SerializationError

__all__ = ["reduce_node", "rebuild_node", "deepcopy_node", "reference"]


# what a pickled leaf may be: exactly these types (a subclass could run its own code on use), each
# rebuilt by torch from tensors and plain metadata
_LEAF_TYPES = (torch.Tensor, nn.Parameter)


def reduce_node(node: Node) -> tuple[Any, tuple[Any, ...]]:
    """Pickle support (``__reduce__``): :func:`rebuild_node` and the node's metadata and leaves (a Memmap
    node's leaves as references to their files), so a pickle rebuilds a node with the same tags; a
    Memmap node holding a copy-on-write leaf anywhere reduces as its ``clone()`` (untagged, by value).

    A node holding sub-nodes reduces as one flat list of levels (:func:`_levels`), not as nested
    reductions: pickle recurses several C frames for each nested reduction, so a tree reduced level in
    level would stop pickling far above the depth a node reaches.

    A nested or mkldnn leaf is a LeafError naming it, before pickle writes anything."""
    return _reduced(node, "pickle")


def _reduced(node: Node, op: str) -> tuple[Any, tuple[Any, ...]]:
    """:func:`reduce_node`'s reduction, for ``op``: ``"pickle"`` refuses nested and mkldnn leaves (torch
    pickles no mkldnn tensor), ``"deepcopy"`` nested ones (which the rebuild does not take)."""
    if Memmap in node._meta[3] and _holds_private(node):
        node = clone(node)
    levels = _levels(node, _unpicklable if op == "pickle" else _nested, op)
    return rebuild_node, (*levels[0], tuple(levels[1:])) if len(levels) > 1 else levels[0]


def _level(node: Node, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``node``'s arguments to :func:`rebuild_node` holding ``values`` (a Memmap node's leaves as references)."""
    keys, batch_size, device, tags = node._meta
    if Memmap in tags:
        values = tuple(v if v is None or isinstance(v, Node) else reference(v) for v in values)
    return (
        name_of(type(node)._root),
        keys,
        values,
        tuple(batch_size),
        None if device is None else str(device),
        tuple(sorted(t.name for t in tags)),
    )


def _levels(node: Node, refused: Callable[[Any], bool], op: str) -> list[tuple[Any, ...]]:
    """The arguments of :func:`rebuild_node` for every node of the tree, parents first (depth first,
    keys in order), each sub-node's value None in its parent's: what :func:`_rebuild_tree` takes."""
    out = []
    todo = [node]
    while todo:
        level = todo.pop()
        values = tuple(level._data.values())
        subs = [v for v in values if isinstance(v, Node)]
        if subs:
            values = tuple(None if isinstance(v, Node) else v for v in values)
            todo.extend(subs[::-1])  # the first sub-node next
        if any(map(refused, values)):
            _refuse(node, refused, op)
        out.append(_level(level, values))
    return out


# torch pickles no mkldnn tensor (it has no storage to write), and a nested tensor would pickle but not
# come back (the rebuild takes tensors, Parameters and nodes): refused before pickle writes anything,
# rather than failing with torch's error midway or on loading
def _unpicklable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_nested or value.is_mkldnn)


def _nested(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _refuse(node: Node, refused: Callable[[Any], bool], op: str) -> None:
    key, value = next((k, v) for k, v in walk(node, True, True) if refused(v))
    why = "a node rebuilds tensors, Parameters and nodes" + (
        ", and torch pickles no mkldnn tensor" if op == "pickle" else ""
    )
    raise error(op, key, value, why)  # type: ignore[misc]


def rebuild_node(
    type_name: str,
    keys: tuple[str, ...],
    values: tuple[Any, ...],
    batch_size: tuple[int, ...],
    device: str | None,
    tag_names: tuple[str, ...],
    below: tuple[tuple[Any, ...], ...] = (),
) -> Node:
    """The node :func:`reduce_node` reduced, after the public constructor's validation.

    It is on torch's safe-globals list, so a hand-made pickle can call it with
    anything: keys must be unique, sorted strs, one per value, each a plain
    tensor, an ``nn.Parameter`` or a node; the batch size
    must fit every leaf; tags and the node type must be known. Anything else
    raises SerializationError. ``below``: the sub-nodes' own arguments, parents first, each one's
    place in its parent's values None (a tree reduced flat); pickles written before it hold each
    sub-node in its place.
    """
    if below:
        return _rebuild_tree(((type_name, keys, values, batch_size, device, tag_names), *below))
    node, tags = _rebuilt((type_name, keys, values, batch_size, device, tag_names))
    return retag(node, tags) if tags else node


def _rebuild_tree(levels: tuple[Any, ...]) -> Node:
    """The tree :func:`_levels` listed, each level checked by :func:`_rebuilt`, deepest first: a
    level's sub-nodes are the last ones built. The top's tags are then written on every node of the
    tree, as unpickling a tree reduced level in level does."""
    built: list[Node] = []
    tags: frozenset = frozenset()
    for level in levels[::-1]:
        if type(level) is not tuple or len(level) != 6 or type(level[2]) is not tuple:
            raise SerializationError("cannot unpickle a node: malformed sub-node arguments")
        values = list(level[2])
        for i, v in enumerate(values):
            if v is None:
                if not built:
                    raise SerializationError(f"cannot unpickle a {level[0]} node: a sub-node is missing")
                values[i] = built.pop()
        node, tags = _rebuilt((level[0], level[1], tuple(values), *level[3:]))
        built.append(node)
    if len(built) != 1:
        raise SerializationError("cannot unpickle a node: sub-nodes left over that no node holds")
    return retag(built[0], tags) if tags else built[0]


def _rebuilt(args: tuple[Any, ...]) -> tuple[Node, frozenset]:
    """The node of :func:`rebuild_node`'s first six arguments ``args``, untagged, and the tags to write on it."""
    type_name, keys, values, batch_size, device, tag_names = args
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
        values = _resolved(values)
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
    return make(root, dict(zip(keys, values)), built._meta[1], found), tags


def deepcopy_node(node: Node, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy`` support: what ``copy`` does with :func:`reduce_node`'s reduction, except for a
    Memmap node, which copies its values into memory (untagged, as ``clone()``: new storage) rather than
    mapping the same files again, where writes would reach the original's."""
    fn, args = _reduced(retag(node, frozenset()) if Memmap in node._meta[3] else node, "deepcopy")
    try:
        out = fn(*copy.deepcopy(args, memo))
    except Exception as exc:
        refuse_first("deepcopy", node, copy.deepcopy, exc)
        raise
    memo[id(node)] = out
    return out


# -- Memmap leaves by reference ----------------------------------------------------------------

_REF = "tdtree.memmap-leaf/2"
# what tdtree wrote before a reference recorded the identity of its files: never mapped again
_OLD_REF = "tdtree.memmap-leaf"


def _holds_private(node: Node) -> bool:
    """Whether a leaf of ``node`` (at any depth) is mapped copy-on-write: its values may be in no file."""
    for leaf in leaves(node):
        found = origin(leaf)
        if found is not None and found.mode == "c":
            return True
    return False


def reference(leaf: torch.Tensor) -> Any:
    """A plain tuple naming the file of ``leaf`` (a leaf of a Memmap node mapped ``"r+"`` or ``"r"``),
    its mode, the identities of its files (see :class:`tdtree._memmap.Origin`) and its view; the leaf
    itself when it holds no data."""
    storage = leaf.untyped_storage()
    if storage.nbytes() == 0:
        return leaf
    found = origin(leaf)
    if found is None:
        raise MemmapError(
            "cannot pickle a Memmap node whose leaf is not mapped from a memmap file; "
            "pickle node.unlock().clone() for a copy by value"
        )
    return (
        _REF,
        found.prefix,
        found.leaf,
        found.mode,
        found.meta,
        found.file,
        storage.nbytes(),
        dtype_name(leaf.dtype),
        tuple(leaf.shape),
        tuple(leaf.stride()),
        leaf.storage_offset(),
    )


def _ints(value: object, n: int | None = None) -> bool:
    return type(value) is tuple and (n is None or len(value) == n) and all(type(v) is int for v in value)


def _checked(ref: object) -> tuple[Any, ...]:
    """``ref``, a :func:`reference` tuple from a pickle (possibly an untrusted one), after checking its form."""
    if type(ref) is tuple and len(ref) == 9 and ref[0] == _OLD_REF:
        raise MemmapError(
            f"a memmap leaf of {str(ref[1])[:200]} was pickled by an older tdtree, which records no identity of "
            "its files: it is not mapped again (the directory may hold another writer's bytes now)"
        )
    if not (type(ref) is tuple and len(ref) == 11 and ref[0] == _REF):
        raise MemmapError(f"malformed memmap leaf reference {str(ref)[:120]}")
    _, prefix, index, mode, meta, identity, nbytes, dtype, shape, stride, offset = ref
    found = dtype_named(dtype)
    if (
        type(prefix) is not str
        or type(index) is not int
        or index < 0
        or mode not in ("r", "r+")
        or not _ints(meta, 4)
        or not _ints(identity, 2)
        or type(nbytes) is not int
        or nbytes <= 0
        or found is None
        or not mappable(found)
        or not _ints(shape)
        or not _ints(stride)
        or type(offset) is not int
    ):
        raise MemmapError(f"malformed memmap leaf reference {str(ref)[:120]}")
    return ref


def _resolved(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` of a Memmap node with each :func:`reference` replaced by its leaf, mapped again
    (:func:`tdtree._memmap.reopen`, once per directory) from the very files that were mapped."""
    out = list(values)
    groups: dict[tuple[str, Any], list[int]] = {}
    for i, value in enumerate(values):
        if isinstance(value, Node):
            continue
        if isinstance(value, torch.Tensor):
            if value.untyped_storage().nbytes():
                raise MemmapError("cannot unpickle a Memmap node whose leaf holds data but names no memmap file")
            continue
        ref = out[i] = _checked(value)
        groups.setdefault((ref[1], ref[4]), []).append(i)
    for (prefix, meta), where in groups.items():
        try:
            storages = reopen(prefix, meta, [(out[i][2], out[i][6], out[i][3], out[i][5]) for i in where])
        except MemmapError as err:
            raise MemmapError(f"cannot unpickle a Memmap node: {err}") from None
        for i, storage in zip(where, storages):
            _, _, index, _, _, _, _, dtype, shape, stride, offset = out[i]
            try:
                out[i] = torch.empty(0, dtype=dtype_named(dtype)).set_(storage, offset, shape, stride)
            except RuntimeError as err:
                raise MemmapError(
                    f"memmap leaf reference does not fit {os.path.join(prefix, leaf_name(index))}: {err}"
                ) from err
    return tuple(out)


torch.serialization.add_safe_globals([rebuild_node])
