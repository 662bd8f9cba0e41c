"""Conversion to and from tensordict: ``from_tensordict`` and ``to_tensordict``.

Both directions keep keys, nesting, batch sizes, the device and the very same
tensor objects (nothing is copied). tensordict is optional: it is imported on
the first call, and its absence raises an ImportError that says how to install it.

Tags map by storage, not by tensordict's flags, because the flags drift
(tensordict's ``unlock_()`` clears ``is_shared()`` while the leaves stay in
shared memory). Going in, a node is

* ``Locked`` when the tensordict is locked;
* ``Memmap`` when every leaf holding data is file-backed (the storage has a
  file name, or tdtree mapped it from a memmap file);
* ``Shared`` when every leaf holding data lives in shared memory and the node
  is not ``Memmap`` (file-backed storages count as shared too; tensordict and
  tdtree both keep the two apart).

Zero-byte storages hold no data and never decide; when no leaf holds data,
tensordict's flag decides. CUDA storages are always shared (torch's and
tensordict's ``is_shared()`` agree), so a tensordict on CUDA maps to ``Shared``. ``memmap_()`` without a prefix
maps an unlinked file through Python's ``mmap``; torch's storage does not know
it is file-backed, so such a tensordict gets no ``Memmap`` tag. A ``Memmap``
node whose files tdtree did not write cannot pickle by reference (a
MemmapError says so); ``node.memmap(prefix)`` writes tdtree's layout.

Going out, ``Locked`` locks the tensordict, and a locked ``Shared`` or
``Memmap`` node sets tensordict's matching flag (tensordict only keeps those
flags on locked tensordicts; an unlocked one maps back by storage, except a
node with no leaf holding data, which has nothing to check and comes back
untagged).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from ._base import Layout, Node, layout
from ._keys import display
from ._memmap import _ORIGIN
from ._node import TensorDict
from ._tags import Locked, Memmap, Shared, retag
from ._tensorclass import TensorClass, from_layout
from ._tensorclass._class import _hints, _tensorclass_in
from ._validate import as_batch_size, build
from .errors import FieldError

__all__ = ["from_tensordict", "to_tensordict"]


def _require(what: str) -> ModuleType:
    try:
        import tensordict  # an optional dependency, imported by the functions that need it
    except ImportError as err:
        raise ImportError(f"tdtree.{what} needs the optional tensordict package: pip install tensordict") from err
    return tensordict


def _unwrap(obj: Any, tensordict: ModuleType, path: tuple[str, ...]) -> Any:
    """The tensordict holding ``obj``'s entries: the dispatch point for collection types."""
    if tensordict.is_non_tensor(obj):
        where = f"entry {display(path)!r}" if path else "the input"
        raise TypeError(
            f"{where} is tensordict non-tensor data; tdtree nodes hold tensors only: exclude it first, "
            "or pass cls= a tdtree tensorclass with a field for it"
        )
    if tensordict.is_tensorclass(obj):
        # A tensorclass keeps its fields in this tensordict; to_tensordict() would copy them.
        return obj._tensordict
    if isinstance(obj, tensordict.TensorDict):
        return obj
    where = f"entry {display(path)!r}" if path else "the input"
    raise TypeError(
        f"{where} is a {type(obj).__name__}; from_tensordict takes a tensordict.TensorDict or a "
        "tensorclass instance (convert lazy stacks and other collections with .to_tensordict(), a copy)"
    )


def _convert(td: Any, tensordict: ModuleType, path: tuple[str, ...], static: dict | None = None) -> Node:
    """The node of ``td``'s tensors; with ``static``, non-tensor entries go there by path instead of
    being refused."""
    data: dict[str, Any] = {}
    for key, value in td.items():
        if isinstance(value, torch.Tensor):
            data[key] = value
        elif static is not None and tensordict.is_non_tensor(value):
            static[(*path, key)] = value.data
        elif tensordict.is_tensor_collection(value):
            data[key] = _convert(_unwrap(value, tensordict, (*path, key)), tensordict, (*path, key), static)
        else:
            raise TypeError(
                f"entry {display((*path, key))!r} is a {type(value).__name__}; tdtree nodes hold tensors only"
            )
    return build(TensorDict, data, as_batch_size(td.batch_size), td.device, path)


def _layout(cls: Any, node: Node, static: dict, path: tuple[str, ...]) -> Layout:
    """The layout of a ``cls`` instance around ``node``: non-tensor entries become its static fields
    (defaults fill the others), sub-nodes under fields annotated with a tensorclass nest."""
    hints = _hints(cls)
    pairs, nested = [], []
    for name in cls._fields:
        sub = _tensorclass_in(hints.get(name, Any))
        if (*path, name) in static:
            pairs.append((name, static[(*path, name)]))
        elif sub is not None and isinstance(node._data.get(name), Node):
            nested.append((name, _layout(sub, node._data[name], static, (*path, name))))
        elif name not in node._data and name in cls._defaults:
            pairs.append((name, cls._defaults[name]))
    return cls, tuple(pairs), tuple(nested)


def _storages(node: Node) -> list[torch.UntypedStorage]:
    """The storages of ``node``'s leaves that hold data."""
    out = []
    for value in node._data.values():
        if isinstance(value, Node):
            out += _storages(value)
        else:
            storage = value.untyped_storage()
            if storage.nbytes():
                out.append(storage)
    return out


def _file_backed(storage: torch.UntypedStorage) -> bool:
    # tdtree's read-only memmaps are private mappings, which keep no file name.
    return storage.filename is not None or storage.data_ptr() in _ORIGIN


def _tags_of(td: Any, node: Node) -> frozenset:
    storages = _storages(node)
    tags = set()
    if td.is_locked:
        tags.add(Locked)
    if all(map(_file_backed, storages)) if storages else td.is_memmap():
        tags.add(Memmap)
        return frozenset(tags)
    if all(s.is_shared() for s in storages) if storages else td.is_shared():
        tags.add(Shared)
    return frozenset(tags)


def from_tensordict(td: Any, /, cls: type | None = None) -> Any:
    """A tdtree node holding the same tensors as the tensordict (or tensorclass instance) ``td``.

    The module functions cross to the tensordict package; a tdtree tensorclass's
    ``from_node`` / ``to_node`` methods stay inside tdtree (a tdtree TensorDict).

    Args:
        td: a ``tensordict.TensorDict`` or a tensordict tensorclass instance;
            nested tensordicts and tensorclasses become nested nodes.
        cls: a tdtree tensorclass: the result is an instance of it, whose
            non-tensor fields are ``td``'s non-tensor entries (a tensordict
            tensorclass keeps its non-tensor fields that way), the defaults
            filling those missing, and whose fields annotated with a
            tensorclass are instances of it. The inverse of
            :func:`to_tensordict` on a tdtree tensorclass.

    Returns:
        A node with the same keys (in canonical sorted order), nesting,
        batch sizes and tensor objects (``node["a"] is td["a"]``). Its device
        is tensordict's when set, else the device all leaves share (tdtree's
        rule), else None. Tags as the module docstring says, decided by
        storage and applied to every sub-node. Dim names are dropped.

    Raises:
        ImportError: tensordict is not installed.
        TypeError: an entry is non-tensor data (without ``cls``), or a
            collection other than a TensorDict or tensorclass (a lazy
            stack), naming the key.
        FieldError: ``td`` does not fit ``cls`` (an unknown or missing field).

    >>> import torch, tensordict, tdtree as tt
    >>> x = torch.zeros(2, 3)
    >>> node = tt.from_tensordict(tensordict.TensorDict({"x": x}, [2]).lock_())
    >>> node["x"] is x, sorted(t.name for t in node.tags)
    (True, ['Locked'])
    """
    tensordict = _require("from_tensordict")
    source = _unwrap(td, tensordict, ())
    static: dict | None = None if cls is None else {}
    node = _convert(source, tensordict, (), static)
    node = retag(node, _tags_of(source, node))
    if cls is None:
        return node
    if not (isinstance(cls, type) and issubclass(cls, TensorClass)):
        raise TypeError(f"from_tensordict: cls must be a tdtree tensorclass, got {cls!r}")

    def error(reason: str) -> Exception:
        return FieldError(f"from_tensordict(cls={cls.__name__}): {reason}")

    return from_layout(_layout(cls, node, static or {}, ()), node, error)


def _build(node: Node, tensordict: ModuleType, shared: bool, memmap: bool) -> Any:
    data = {k: _build(v, tensordict, shared, memmap) if isinstance(v, Node) else v for k, v in node._data.items()}
    _, batch_size, device, _ = node._meta
    # The trusted constructor: the node was validated when it was built, and it
    # is tensordict's only way to mark leaves already in shared memory or in
    # files as such without copying them.
    return tensordict.TensorDict._new_unsafe(
        source=data, batch_size=batch_size, device=device, nested=False, is_shared=shared, is_memmap=memmap
    )


def _set_static(out: Any, lay: Layout, path: tuple[str, ...]) -> None:
    _, static, nested = lay
    for name, value in static:
        out.set_non_tensor((*path, name), value)
    for name, sub in nested:
        _set_static(out, sub, (*path, name))


def to_tensordict(node: Any, /) -> Any:
    """A ``tensordict.TensorDict`` holding the same tensors as ``node``.

    Args:
        node: a tdtree node, or a tdtree tensorclass instance: its tensor
            fields become entries and its non-tensor fields non-tensor entries
            (``set_non_tensor``), nested tensorclasses as nested tensordicts;
            ``from_tensordict(out, cls=type(node))`` gives it back.

    Returns:
        A tensordict with the same keys (in the node's sorted order), nesting,
        batch sizes, device and tensor objects. ``Locked`` locks it; a locked
        ``Memmap`` node sets ``is_memmap()``, a locked ``Shared`` one (not
        ``Memmap``) ``is_shared()``.

    Raises:
        ImportError: tensordict is not installed.
        TypeError: ``node`` is not a node or tensorclass instance.

    >>> import torch, tdtree as tt
    >>> x = torch.zeros(2, 3)
    >>> td = tt.to_tensordict(tt.TensorDict({"x": x}, [2]).lock())
    >>> td["x"] is x, td.is_locked
    (True, True)
    """
    tensordict = _require("to_tensordict")
    record = node
    if isinstance(node, TensorClass):
        node = node._td
    if not isinstance(node, Node):
        raise TypeError(f"to_tensordict takes a tdtree node or tensorclass instance, got {type(node).__name__}")
    tags = node._meta[3]
    locked = Locked in tags
    memmap = locked and Memmap in tags
    shared = locked and Shared in tags and not memmap
    out = _build(node, tensordict, shared, memmap)
    if record is not node:
        _set_static(out, layout(record), ())
    return out.lock_() if locked else out
