"""The implementations a bench case runs on, behind one small adapter.

Every case is written once and parametrized over ``impl``: ``tdtree``,
``tensordict`` (when importable) and, for cases marked ``pytree``, plain nested
dicts driven by optree. An adapter builds the case's data for its
implementation (:meth:`Impl.node`) and, where the three spell an operation
differently, returns a zero-argument *thunk* that performs it, so the timed
call is the operation plus one Python call for every implementation alike.

tdtree and tensordict share most method names, so cases call those methods
directly on the node; the adapter only covers the operations that plain dicts
spell differently, and the ones where tensordict mutates (see
:class:`TensordictImpl`).
"""

from __future__ import annotations

import functools
import importlib.util
import operator
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optree
import torch
import torch.utils._pytree

import tdtree

from . import plain

try:
    import tensordict
except ImportError as exc:  # the suite still runs tdtree and pytree
    tensordict = None
    TENSORDICT_MISSING = f"tensordict is not importable ({exc}); install the 'bench' extra"
else:
    TENSORDICT_MISSING = ""

__all__ = ["Impl", "IMPLS", "TENSORDICT_MISSING", "big_td", "big_nested", "small_td", "pytree_data"]

Thunk = Callable[[], Any]


def _has_index() -> bool:
    return importlib.util.find_spec("tdtree._index") is not None


def _has_torch_function() -> bool:
    return "__torch_function__" in vars(tdtree.TensorDict)


# What tdtree must have for an operation, by the name a skip reports. Names not
# listed here are methods of tdtree.TensorDict; "tdtree.x" is a module function.
_TDTREE_PROBES: dict[str, Callable[[], bool]] = {
    "td[idx]": _has_index,
    "torch.zeros_like(td)": _has_torch_function,
    "torch.ones_like(td)": _has_torch_function,
    "torch.full_like(td)": _has_torch_function,
}


class Impl:
    """One implementation: how to build data for it and how it spells the operations."""

    name: str = ""

    def node(self, source: Mapping[str, Any], batch_size: tuple[int, ...]) -> Any:
        """The implementation's node for the nested dict of tensors ``source``."""
        raise NotImplementedError

    def require(self, *ops: str) -> None:
        """Skip the case when this implementation lacks one of ``ops`` (only tdtree can)."""

    # thunks: every method below returns a zero-argument callable doing the op

    def keys(self, td: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        return lambda: list(td.keys(nested, leaves))

    def values(self, td: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        return lambda: list(td.values(nested, leaves))

    def items(self, td: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        return lambda: list(td.items(nested, leaves))

    def contains(self, td: Any, key: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        """``key in td.keys(nested, leaves)``, as tensordict's suite spells membership."""
        return lambda: key in td.keys(nested, leaves)

    def get(self, td: Any, key: Any) -> Thunk:
        return functools.partial(td.get, key)

    def getitem(self, td: Any, index: Any) -> Thunk:
        return functools.partial(operator.getitem, td, index)

    def method(self, td: Any, name: str, *args: Any, **kwargs: Any) -> Thunk:
        """``td.<name>(*args, **kwargs)``: the shape, map and device methods."""
        return functools.partial(getattr(td, name), *args, **kwargs)

    def add(self, td: Any, other: Any) -> Thunk:
        return functools.partial(operator.add, td, other)

    def like(self, fn: Callable[..., Any], td: Any, *args: Any) -> Thunk:
        """``torch.zeros_like(td)`` and its siblings."""
        return functools.partial(fn, td, *args)

    def stack(self, tds: list[Any], dim: int) -> Thunk:
        raise NotImplementedError

    def cat(self, tds: list[Any], dim: int) -> Thunk:
        raise NotImplementedError

    def clone(self, td: Any) -> Thunk:
        return td.clone

    def set(self, td: Any, key: Any, value: torch.Tensor) -> Thunk:
        """A node with ``value`` at ``key``, ``td`` unchanged."""
        return functools.partial(td.set, key, value)

    def update(self, td: Any, other: Any) -> Thunk:
        """A node with ``other``'s entries, ``td`` unchanged."""
        return functools.partial(td.update, other)

    def set_select(self, td: Any, key: Any, value: torch.Tensor, *keys: Any) -> Thunk:
        """``set(key, value)`` then ``select(*keys, strict=False)`` on the result."""
        return lambda: td.set(key, value).select(*keys, strict=False)

    def select(self, td: Any, *keys: Any) -> Thunk:
        """A node with only ``keys`` (nested keys keep their path), ``td`` unchanged."""
        return functools.partial(td.select, *keys)

    def exclude(self, td: Any, *keys: Any) -> Thunk:
        """A node without ``keys``, ``td`` unchanged."""
        return functools.partial(td.exclude, *keys)

    def flatten_keys(self, td: Any) -> Thunk:
        """A flat node, nested keys joined by "."."""
        return td.flatten_keys

    def unflatten_keys(self, td: Any) -> Thunk:
        """The nested node of a flat one with "."-joined keys."""
        return td.unflatten_keys

    def rename(self, td: Any, old: Any, new: Any) -> Thunk:
        """A node with the entry at ``old`` moved to ``new``, ``td`` unchanged."""
        return functools.partial(td.rename, {old: new})

    def scatter(self, td: Any, index: Any, value: Any) -> Thunk:
        """A node equal to ``td`` with ``value`` written at ``index``, ``td`` unchanged."""
        return lambda: td.at[index].set(value)

    def share(self, td: Any) -> Thunk:
        """A copy of ``td`` in shared memory, ``td`` unchanged."""
        return td.share_memory

    def lock(self, td: Any) -> Any:
        return td.lock()

    def unlock(self, td: Any) -> Any:
        return td.unlock()

    def locked(self, td: Any) -> Thunk:
        """A locked node with ``td``'s leaves, ``td`` unchanged."""
        return td.lock

    def tree_flatten(self, td: Any) -> Thunk:
        """The leaves and structure, by the pytree registry the implementation's users flatten with."""
        raise NotImplementedError

    def memmap_write(self, td: Any, path: Path) -> Thunk:
        """Write ``td`` as a memory-mapped directory at ``path``, again at each call."""
        return functools.partial(td.memmap, path)

    def memmap_read(self, path: Path, like: Any) -> Thunk:
        """Map the directory :meth:`memmap_write` wrote from ``like`` and read it into memory."""
        raise NotImplementedError

    def save(self, td: Any, path: Path) -> Thunk:
        """Write ``td`` to the one file ``path``."""
        return functools.partial(torch.save, td, path)

    def load(self, path: Path) -> Thunk:
        """Read back the file :meth:`save` wrote."""
        raise NotImplementedError

    def empty(self, td: Any, recurse: bool) -> Thunk:
        raise NotImplementedError


class TdtreeImpl(Impl):
    """tdtree: every operation is functional, so the thunks are the plain calls."""

    name = "tdtree"

    def node(self, source: Mapping[str, Any], batch_size: tuple[int, ...]) -> Any:
        return tdtree.TensorDict(source, batch_size)

    def require(self, *ops: str) -> None:
        import pytest

        for op in ops:
            probe = _TDTREE_PROBES.get(op)
            if op.startswith("tdtree."):
                present = hasattr(tdtree, op.removeprefix("tdtree."))
            elif probe is not None:
                present = probe()
            else:
                present = hasattr(tdtree.TensorDict, op)
            if not present:
                pytest.skip(f"tdtree has no {op} yet")

    def stack(self, tds: list[Any], dim: int) -> Thunk:
        return functools.partial(tdtree.stack, tds, dim)  # type: ignore[attr-defined]

    def cat(self, tds: list[Any], dim: int) -> Thunk:
        return functools.partial(tdtree.cat, tds, dim)  # type: ignore[attr-defined]

    def tree_flatten(self, td: Any) -> Thunk:
        return functools.partial(tdtree.tree.flatten, td)

    def memmap_write(self, td: Any, path: Path) -> Thunk:
        """``memmap(path, existsok=True)``: the directory is written aside and renamed in."""
        return functools.partial(td.memmap, path, existsok=True)

    def memmap_read(self, path: Path, like: Any) -> Thunk:
        return lambda: tdtree.load_memmap(path).clone()

    def save(self, td: Any, path: Path) -> Thunk:
        return functools.partial(tdtree.save, td, path)

    def load(self, path: Path) -> Thunk:
        """``tdtree.load``: tensors and plain data only, as ``torch.load(weights_only=True)``."""
        return functools.partial(tdtree.load, path)

    def empty(self, td: Any, recurse: bool) -> Thunk:
        """tdtree has no ``empty``: ``select()`` is the empty node, and excluding
        every leaf keeps the empty sub-nodes (what ``empty(recurse=True)`` gives)."""
        if not recurse:
            return td.select
        leaves = list(td.keys(True, True))
        return lambda: td.exclude(*leaves)


class TensordictImpl(Impl):
    """tensordict, on the same data.

    Where tdtree returns a new node and tensordict mutates, the thunk is the
    cheapest tensordict code with the same effect (a new node, the input
    unchanged): ``clone(recurse=False)`` then the mutation when the leaves can
    be shared (set, update, select), ``clone()`` then the mutation when new
    storage is needed (``td[idx] = v``). tensordict's own suite uses a deep
    ``clone()`` everywhere, so its CI numbers for set and update are higher.
    """

    name = "tensordict"

    def node(self, source: Mapping[str, Any], batch_size: tuple[int, ...]) -> Any:
        assert tensordict is not None
        return tensordict.TensorDict(source, batch_size)

    def stack(self, tds: list[Any], dim: int) -> Thunk:
        return functools.partial(torch.stack, tds, dim)

    def cat(self, tds: list[Any], dim: int) -> Thunk:
        return functools.partial(torch.cat, tds, dim)

    def set(self, td: Any, key: Any, value: torch.Tensor) -> Thunk:
        return lambda: td.clone(False).set(key, value)

    def update(self, td: Any, other: Any) -> Thunk:
        return lambda: td.clone(False).update(other)

    def set_select(self, td: Any, key: Any, value: torch.Tensor, *keys: Any) -> Thunk:
        return lambda: td.clone(False).set(key, value).select(*keys, strict=False)

    def rename(self, td: Any, old: Any, new: Any) -> Thunk:
        return lambda: td.clone(False).rename_key_(old, new)

    def scatter(self, td: Any, index: Any, value: Any) -> Thunk:
        def run() -> Any:
            out = td.clone()
            out[index] = value
            return out

        return run

    def share(self, td: Any) -> Thunk:
        return lambda: td.clone().share_memory_()

    def lock(self, td: Any) -> Any:
        return td.lock_()

    def locked(self, td: Any) -> Thunk:
        return lambda: td.clone(False).lock_()

    def tree_flatten(self, td: Any) -> Thunk:
        """torch's pytree registry: tensordict registers its nodes there, not with optree."""
        return functools.partial(torch.utils._pytree.tree_flatten, td)

    def memmap_read(self, path: Path, like: Any) -> Thunk:
        assert tensordict is not None
        return lambda: tensordict.TensorDict.load_memmap(path).clone()

    def load(self, path: Path) -> Thunk:
        """``torch.load`` of the pickled TensorDict (``weights_only=False``: it is not plain data)."""
        return functools.partial(torch.load, path, weights_only=False)

    def unlock(self, td: Any) -> Any:
        return td.unlock_()

    def empty(self, td: Any, recurse: bool) -> Thunk:
        return functools.partial(td.empty, recurse=recurse)


class PytreeImpl(Impl):
    """Plain nested dicts with optree: the floor a node's own traversal is held to.

    Shape methods act on every leaf's leading (batch) dims; only the operations
    dicts and optree have are offered, and cases without one carry no pytree row.
    """

    name = "pytree"

    def node(self, source: Mapping[str, Any], batch_size: tuple[int, ...]) -> Any:
        return plain.nested_dict(source)

    def keys(self, td: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        if nested:
            return lambda: plain.nested_entries(td, leaves)[0]
        return lambda: list(td.keys())

    def values(self, td: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        if nested:
            return lambda: plain.nested_entries(td, leaves)[1]
        return lambda: list(td.values())

    def items(self, td: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        if nested:
            return lambda: list(zip(*plain.nested_entries(td, leaves)))
        return lambda: list(td.items())

    def contains(self, td: Any, key: Any, nested: bool = False, leaves: bool = False) -> Thunk:
        # a path into the dicts: any entry is a nested key, a leaf is a nested leaf key
        if nested:
            return functools.partial(plain.has_leaf if leaves else plain.has_path, td, key)
        return lambda: key in td.keys()

    def get(self, td: Any, key: Any) -> Thunk:
        return functools.partial(plain.get_path, td, key)

    def getitem(self, td: Any, index: Any) -> Thunk:
        if type(index) is str or (type(index) is tuple and index and type(index[0]) is str):
            return functools.partial(plain.get_path, td, index)
        return functools.partial(optree.tree_map, lambda x: x[index], td)

    def method(self, td: Any, name: str, *args: Any, **kwargs: Any) -> Thunk:
        fn = plain.LEAF_METHODS[name](*args, **kwargs)
        return functools.partial(optree.tree_map, fn, td)

    def add(self, td: Any, other: Any) -> Thunk:
        if isinstance(other, dict):
            return functools.partial(optree.tree_map, operator.add, td, other)
        return functools.partial(optree.tree_map, lambda x: x + other, td)

    def like(self, fn: Callable[..., Any], td: Any, *args: Any) -> Thunk:
        return functools.partial(optree.tree_map, lambda x: fn(x, *args), td)

    def stack(self, tds: list[Any], dim: int) -> Thunk:
        return lambda: optree.tree_map(lambda *xs: torch.stack(xs, dim), *tds)

    def cat(self, tds: list[Any], dim: int) -> Thunk:
        return lambda: optree.tree_map(lambda *xs: torch.cat(xs, dim), *tds)

    def clone(self, td: Any) -> Thunk:
        return functools.partial(optree.tree_map, torch.clone, td)

    def update(self, td: Any, other: Any) -> Thunk:
        # the fastest plain-dict code for the data: ``|`` when no entry is nested, else a merge
        if any(type(v) is dict for v in other.values()):
            return functools.partial(plain.merge, td, other)
        return functools.partial(operator.or_, td, other)

    def scatter(self, td: Any, index: Any, value: Any) -> Thunk:
        return functools.partial(optree.tree_map, plain.scatter_leaf(index), td, value)

    def share(self, td: Any) -> Thunk:
        return functools.partial(optree.tree_map, plain.shared_copy, td)

    # Key operations on plain dicts: the dicts along a path are copied and the rest is shared, as a
    # node's are; nothing is validated.
    def set(self, td: Any, key: Any, value: torch.Tensor) -> Thunk:
        return functools.partial(plain.set_path, td, key, value)

    def set_select(self, td: Any, key: Any, value: torch.Tensor, *keys: Any) -> Thunk:
        def run() -> Any:
            out = plain.set_path(td, key, value)
            return plain.select(out, tuple(k for k in keys if plain.has_path(out, k)))

        return run

    def select(self, td: Any, *keys: Any) -> Thunk:
        return functools.partial(plain.select, td, keys)

    def exclude(self, td: Any, *keys: Any) -> Thunk:
        def run() -> Any:
            out = td
            for key in keys:
                out = plain.drop_path(out, key)
            return out

        return run

    def flatten_keys(self, td: Any) -> Thunk:
        return functools.partial(plain.flatten_keys, td)

    def unflatten_keys(self, td: Any) -> Thunk:
        return functools.partial(plain.unflatten_keys, td)

    def rename(self, td: Any, old: Any, new: Any) -> Thunk:
        return lambda: plain.set_path(plain.drop_path(td, old), new, plain.get_path(td, old))

    # A dict has no lock: an operation on a locked node is held to the same operation on the dicts,
    # and locking itself to a copy of the dicts (a node's lock returns a new node).
    def lock(self, td: Any) -> Any:
        return td

    def locked(self, td: Any) -> Thunk:
        return functools.partial(plain.nested_dict, td)

    def tree_flatten(self, td: Any) -> Thunk:
        return functools.partial(optree.tree_flatten, td)

    def memmap_write(self, td: Any, path: Path) -> Thunk:
        return functools.partial(plain.write_files, td, path)

    def memmap_read(self, path: Path, like: Any) -> Thunk:
        return functools.partial(plain.read_files, path, like)

    def load(self, path: Path) -> Thunk:
        return functools.partial(torch.load, path, weights_only=True)


IMPLS: dict[str, Impl] = {impl.name: impl for impl in (TdtreeImpl(), TensordictImpl(), PytreeImpl())}


# -- the suite's data, one builder per shape tensordict's suite uses ------------------------


def big_td(impl: Impl) -> Any:
    """A flat node of 100 keys "0".."99", each of shape (3, 4), batch (3, 4)."""
    return impl.node({str(i): torch.zeros(3, 4) + i for i in range(100)}, (3, 4))


def nested_key(depth: int) -> tuple[str, ...]:
    """The key of the sub-node ``depth`` levels down in :func:`big_nested`: ("0", "1", ...)."""
    return tuple(str(i) for i in range(depth))


def big_nested(impl: Impl, size: tuple[int, ...] = (3, 4)) -> Any:
    """19 levels "0" / "1" / ... / "18", one leaf "t" of shape ``size`` per level.

    Built, as tensordict's suite does, from the flat keys "0.t", "0.1.t", ...
    by ``unflatten_keys`` (pytree: the same nested dicts built directly).
    """
    flat = {".".join([*nested_key(i), "t"]): torch.zeros(size) + i for i in range(1, 20)}
    if impl.name == "pytree":
        return impl.node({tuple(k.split(".")): v for k, v in flat.items()}, size)
    return impl.node(flat, size).unflatten_keys(".")


def small_td(impl: Impl, lead: tuple[int, ...] = ()) -> Any:
    """{"a": (3, 4, 5), "b": {"b1": (3, 4, 5)}} with batch (3, 4), behind ``lead`` extra dims."""
    shape = (*lead, 3, 4, 5)
    return impl.node({"a": torch.zeros(shape), "b": {"b1": torch.zeros(shape)}}, (*lead, 3, 4))


def pytree_data(impl: Impl) -> Any:
    """tensordict's pytree-comparison data: {"a": {"b": (3,4,1), "c": {"d": (3,4,5,6)}}, "c": (3,4,1)}."""
    source = {
        "a": {"b": torch.randn(3, 4, 1), "c": {"d": torch.rand(3, 4, 5, 6)}},
        "c": torch.rand(3, 4, 1),
    }
    return impl.node(source, (3, 4))
