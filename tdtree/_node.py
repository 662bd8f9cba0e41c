"""The TensorDict node: data, construction and thin methods over named functions.

Guarantees:

* Immutable. No ``__setitem__``, ``__delitem__`` or attribute writes; every
  operation returns a new node. Only the in-place writers, whose names end in
  ``_``, change storage contents (never structure).
* Canonical key order. Keys are kept sorted, so two nodes with the same content
  have equal pytree structures and binary operations pair leaves by key.
* Validated once. The constructor checks keys, shapes and devices; results of
  operations are built unchecked through :func:`tdtree._base.make`.
* Tags are types. ``type(td)`` tells a node's tags, and one rule
  (:func:`tdtree._tags.tag_rule`) decides for every operation whether the
  result keeps them, by storage identity alone.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch

from . import _combine, _device, _index, _inplace, _keyops, _maps, _memmap, _ops, _records, _shape, _shared
from ._base import Node
from ._keys import NestedKey
from ._pickle import reduce_node
from ._pytree import register
from ._repr import node_repr
from ._tags import Locked, Memmap, Shared, Tag, refuse_tagged, retag, tagged_type
from ._validate import construct

__all__ = ["TensorDict"]


class TensorDict(Node):
    """A frozen mapping from str keys to tensors and nested nodes sharing leading batch dims.

    Args:
        source: a mapping from keys (str, or tuple of str for nested keys) to
            tensors, nodes or dicts (dicts become nested nodes).
        batch_size: the leading dims every leaf shares; ``None`` is ``()``.
        device: when given, every leaf is moved there; else the device all
            leaves share, or None.

    Raises:
        BatchSizeError: a leaf's shape does not start with ``batch_size``.
        TypeError: a key is not a str or tuple of str, or a value is not a
            tensor, node or dict.

    The constructor makes untagged nodes (nodes put inside it are retagged to
    match); tags come from :meth:`lock`, :meth:`share_memory`, :meth:`memmap`.
    A tagged type (``TensorDict[Shared]``) cannot be called, nor its ``from_*``
    constructors: TypeError naming those three.

    >>> import torch, tdtree as tt
    >>> td = tt.TensorDict({"obs": torch.zeros(4, 3), ("next", "reward"): torch.ones(4)}, batch_size=[4])
    >>> td.batch_size, list(td.keys(include_nested=True, leaves_only=True))
    (torch.Size([4]), [('next', 'reward'), 'obs'])
    >>> (td + 1)["next", "reward"]
    tensor([2., 2., 2., 2.])
    >>> locked = td.lock()
    >>> isinstance(locked, tt.TensorDict[tt.Locked]), locked[1:].tags, (locked + 1).tags
    (True, frozenset({Locked}), frozenset())
    """

    __slots__ = ()
    _root: ClassVar[type[TensorDict]]  # a TensorDict's root is TensorDict or a subclass of it
    # Set in the body: registration (the name table, pytree, tagged variants) reads it.
    __module__ = "tdtree"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_tags" not in cls.__dict__:  # a root type of its own (tagged_type registers the variants it makes)
            register(cls)

    def __init__(
        self,
        source: Mapping[Any, Any] | None = None,
        batch_size: int | Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        construct(self, source, batch_size, device)

    def __class_getitem__(cls, tags: Tag | tuple[Tag, ...]) -> type:
        """``TensorDict[Shared]``, ``TensorDict[Locked, Shared]``: the cached tagged types."""
        return tagged_type(cls._root, tags if isinstance(tags, tuple) else (tags,))

    @classmethod
    def from_dict(
        cls, data: Mapping[Any, Any], batch_size: int | Sequence[int] | None = None, device: Any = None
    ) -> TensorDict:
        """An untagged node from nested mappings; ``batch_size=None`` infers the longest common prefix per level."""
        if cls._tags:
            raise refuse_tagged(cls, f"{cls.__name__}.from_dict")
        return _keyops.from_dict(cls._root, data, batch_size, device)

    @classmethod
    def from_dataclass(cls, obj: Any, batch_size: int | Sequence[int] | None = None, device: Any = None) -> TensorDict:
        """An untagged node with one entry per field of a dataclass instance; nested records nest; batch size as
        from_dict."""
        if cls._tags:
            raise refuse_tagged(cls, f"{cls.__name__}.from_dataclass")
        return _records.from_dataclass(cls._root, obj, batch_size, device)

    @classmethod
    def from_namedtuple(cls, obj: Any, batch_size: int | Sequence[int] | None = None, device: Any = None) -> TensorDict:
        """An untagged node with one entry per field of a named tuple; nested records nest; batch size as
        from_dict."""
        if cls._tags:
            raise refuse_tagged(cls, f"{cls.__name__}.from_namedtuple")
        return _records.from_namedtuple(cls._root, obj, batch_size, device)

    def to_namedtuple(self) -> Any:
        """A named tuple of the same tensors, fields in key order, sub-nodes nested; drops batch size and tags."""
        return _records.to_namedtuple(self)

    # -- metadata -------------------------------------------------------------

    @property
    def batch_size(self) -> torch.Size:
        return self._meta[1]

    @property
    def shape(self) -> torch.Size:
        return self._meta[1]

    @property
    def ndim(self) -> int:
        return len(self._meta[1])

    def dim(self) -> int:
        return len(self._meta[1])

    def numel(self) -> int:
        """The number of batch elements (the product of ``batch_size``)."""
        return self._meta[1].numel()

    @property
    def device(self) -> torch.device | None:
        return self._meta[2]

    @property
    def tags(self) -> frozenset[Tag]:
        return self._meta[3]

    @property
    def is_locked(self) -> bool:
        return Locked in self._meta[3]

    @property
    def is_shared(self) -> bool:
        return Shared in self._meta[3]

    @property
    def is_memmap(self) -> bool:
        return Memmap in self._meta[3]

    def __repr__(self) -> str:
        return node_repr(self)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_node(self)

    # -- mapping protocol and lookup -----------------------------------------------

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __contains__(self, key: object) -> bool:
        return _keyops.contains(self, key)

    def __getitem__(self, index: Any) -> Any:
        if type(index) is str:
            value = self._data.get(index, _keyops.MISSING)
            if value is _keyops.MISSING:
                return _keyops.get(self, index)
            return value
        if type(index) is tuple and index and type(index[0]) is str:
            return _keyops.get(self, index)
        return _index.getitem(self, index)

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError(
            "TensorDict is immutable: td = td.set(key, value) for a new node, "
            "td.at[idx].set(value) for a functional scatter, or td.at[idx].set_(value) to write in place"
        )

    def __delitem__(self, key: Any) -> None:
        raise TypeError("TensorDict is immutable: td = td.exclude(key) for a node without it")

    def __bool__(self) -> bool:
        raise RuntimeError(
            "the truth value of a TensorDict is ambiguous: use td.all() or td.any() on a node of bools, "
            "or len(td) for the number of keys"
        )

    # get and the views are the named functions themselves (a function in the class body is a method):
    # the flat ``td.values()`` is a dict view, and a wrapper method would be a third of its cost (a
    # tenth of a nested ``get``'s).
    get = _keyops.get
    keys = _keyops.keys
    values = _keyops.values
    items = _keyops.items

    # -- functional editors (refused on Locked nodes) ------------------------------

    def set(self, key: NestedKey, value: Any) -> TensorDict:
        """A new node with ``value`` at ``key`` (validated); only the path to it is copied."""
        return _keyops.set_entry(self, key, value)

    def setdefault(self, key: NestedKey, default: Any) -> TensorDict:
        """This node when ``key`` exists, else a new node with ``default`` there."""
        return _keyops.setdefault(self, key, default)

    def update(self, other: Mapping[Any, Any] | TensorDict) -> TensorDict:
        """A new node with every entry of ``other`` set; nested mappings merge into sub-nodes."""
        return _keyops.update(self, other)

    def rename(self, mapping: Mapping[NestedKey, NestedKey]) -> TensorDict:
        """A new node with keys moved from ``old`` to ``new`` for each pair of ``mapping``."""
        return _keyops.rename(self, mapping)

    # -- key views -------------------------------------------------------------------

    # the named functions themselves, as the views are (a wrapper repacking ``*keys`` and ``strict``
    # costs an eighth of ``select()``)
    select = _keyops.select
    exclude = _keyops.exclude

    def flatten_keys(self, sep: str = ".") -> TensorDict:
        """A flat node with nested keys joined by ``sep``; keeps tags."""
        return _keyops.flatten_keys(self, sep)

    def unflatten_keys(self, sep: str = ".") -> TensorDict:
        """The inverse of :meth:`flatten_keys`; keeps tags."""
        return _keyops.unflatten_keys(self, sep)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dicts holding the same tensors."""
        return _keyops.to_dict(self)

    def clone(self, recurse: bool = True) -> TensorDict:
        """A copy; ``recurse=False`` shares the leaves (and keeps tags), else new storage (no tags)."""
        return _maps.clone(self, recurse)

    # -- tags ----------------------------------------------------------------------------

    def lock(self) -> TensorDict:
        """The same leaves, tagged ``Locked`` in addition to the node's tags."""
        return retag(self, self._meta[3] | {Locked})

    def unlock(self) -> TensorDict:
        """The same leaves without the ``Locked`` tag (other tags kept)."""
        return retag(self, self._meta[3] - {Locked})

    # -- maps, arithmetic, reductions (_maps.py, _ops.py) --------------------------------

    def apply(self, fn: Callable[..., torch.Tensor], *others: TensorDict, batch_size: Any = None) -> TensorDict:
        """``fn(leaf, *others' leaves)`` at every leaf, others paired by key; tags by the rule."""
        return _maps.apply(self, fn, *others, batch_size=batch_size)

    def named_apply(self, fn: Callable[..., torch.Tensor], *others: TensorDict, batch_size: Any = None) -> TensorDict:
        """``fn(key, leaf, *others' leaves)`` at every leaf, key as in keys(include_nested=True); tags by the rule."""
        return _maps.named_apply(self, fn, *others, batch_size=batch_size)

    # Comparisons return nodes, as torch's do; hashing stays by identity, as for tensors.
    __hash__ = Node.__hash__

    def __add__(self, other: Any) -> TensorDict:
        """``self + other`` leaf by leaf (number, batch-aligned tensor, or node by key); drops tags."""
        return _ops.add(self, other)

    def __radd__(self, other: Any) -> TensorDict:
        """``other + self`` leaf by leaf; drops tags."""
        return _ops.radd(self, other)

    def __sub__(self, other: Any) -> TensorDict:
        """``self - other`` leaf by leaf; drops tags."""
        return _ops.sub(self, other)

    def __rsub__(self, other: Any) -> TensorDict:
        """``other - self`` leaf by leaf; drops tags."""
        return _ops.rsub(self, other)

    def __mul__(self, other: Any) -> TensorDict:
        """``self * other`` leaf by leaf; drops tags."""
        return _ops.mul(self, other)

    def __rmul__(self, other: Any) -> TensorDict:
        """``other * self`` leaf by leaf; drops tags."""
        return _ops.rmul(self, other)

    def __truediv__(self, other: Any) -> TensorDict:
        """``self / other`` leaf by leaf; drops tags."""
        return _ops.truediv(self, other)

    def __rtruediv__(self, other: Any) -> TensorDict:
        """``other / self`` leaf by leaf; drops tags."""
        return _ops.rtruediv(self, other)

    def __floordiv__(self, other: Any) -> TensorDict:
        """``self // other`` leaf by leaf; drops tags."""
        return _ops.floordiv(self, other)

    def __rfloordiv__(self, other: Any) -> TensorDict:
        """``other // self`` leaf by leaf; drops tags."""
        return _ops.rfloordiv(self, other)

    def __mod__(self, other: Any) -> TensorDict:
        """``self % other`` leaf by leaf; drops tags."""
        return _ops.mod(self, other)

    def __rmod__(self, other: Any) -> TensorDict:
        """``other % self`` leaf by leaf; drops tags."""
        return _ops.rmod(self, other)

    def __pow__(self, other: Any) -> TensorDict:
        """``self ** other`` leaf by leaf; drops tags."""
        return _ops.pow(self, other)

    def __rpow__(self, other: Any) -> TensorDict:
        """``other ** self`` leaf by leaf; drops tags."""
        return _ops.rpow(self, other)

    def __eq__(self, other: Any) -> TensorDict:  # type: ignore[override]
        """A node of bools, ``self == other`` leaf by leaf; drops tags."""
        return _ops.eq(self, other)

    def __ne__(self, other: Any) -> TensorDict:  # type: ignore[override]
        """A node of bools, ``self != other`` leaf by leaf; drops tags."""
        return _ops.ne(self, other)

    def __lt__(self, other: Any) -> TensorDict:
        """A node of bools, ``self < other`` leaf by leaf; drops tags."""
        return _ops.lt(self, other)

    def __le__(self, other: Any) -> TensorDict:
        """A node of bools, ``self <= other`` leaf by leaf; drops tags."""
        return _ops.le(self, other)

    def __gt__(self, other: Any) -> TensorDict:
        """A node of bools, ``self > other`` leaf by leaf; drops tags."""
        return _ops.gt(self, other)

    def __ge__(self, other: Any) -> TensorDict:
        """A node of bools, ``self >= other`` leaf by leaf; drops tags."""
        return _ops.ge(self, other)

    def __neg__(self) -> TensorDict:
        """``-leaf`` for every leaf; drops tags."""
        return _ops.neg(self)

    def __abs__(self) -> TensorDict:
        """``abs(leaf)`` for every leaf; drops tags."""
        return _ops.abs(self)

    def neg(self) -> TensorDict:
        """``torch.neg`` of every leaf; drops tags."""
        return _ops.neg(self)

    def abs(self) -> TensorDict:
        """``torch.abs`` of every leaf; drops tags."""
        return _ops.abs(self)

    def exp(self) -> TensorDict:
        """``torch.exp`` of every leaf; drops tags."""
        return _ops.exp(self)

    def log(self) -> TensorDict:
        """``torch.log`` of every leaf; drops tags."""
        return _ops.log(self)

    def sqrt(self) -> TensorDict:
        """``torch.sqrt`` of every leaf; drops tags."""
        return _ops.sqrt(self)

    def sigmoid(self) -> TensorDict:
        """``torch.sigmoid`` of every leaf; drops tags."""
        return _ops.sigmoid(self)

    def tanh(self) -> TensorDict:
        """``torch.tanh`` of every leaf; drops tags."""
        return _ops.tanh(self)

    def sign(self) -> TensorDict:
        """``torch.sign`` of every leaf; drops tags."""
        return _ops.sign(self)

    def pow(self, exponent: Any) -> TensorDict:
        """``self ** exponent`` leaf by leaf; drops tags."""
        return _ops.pow(self, exponent)

    def clamp(self, min: Any = None, max: Any = None) -> TensorDict:  # noqa: A002
        """``torch.clamp(leaf, min, max)`` for every leaf; drops tags."""
        return _ops.clamp(self, min, max)

    def where(self, condition: Any, other: Any) -> TensorDict:
        """``tdtree.where(condition, self, other)``: self where condition holds, else other; drops tags."""
        return _ops.where(condition, self, other)

    def sum(self, dim: Any = None, keepdim: bool = False) -> TensorDict:
        """Sums over batch dims ``dim`` (None: all), leaf by leaf; drops tags."""
        return _ops.sum(self, dim, keepdim)

    def mean(self, dim: Any = None, keepdim: bool = False) -> TensorDict:
        """Means over batch dims ``dim`` (None: all), leaf by leaf; drops tags."""
        return _ops.mean(self, dim, keepdim)

    def amax(self, dim: Any = None, keepdim: bool = False) -> TensorDict:
        """Maxima over batch dims ``dim`` (None: all), leaf by leaf; drops tags."""
        return _ops.amax(self, dim, keepdim)

    def amin(self, dim: Any = None, keepdim: bool = False) -> TensorDict:
        """Minima over batch dims ``dim`` (None: all), leaf by leaf; drops tags."""
        return _ops.amin(self, dim, keepdim)

    def all(self, dim: Any = None, keepdim: bool = False) -> Any:
        """No dim: one 0-dim bool tensor over every element of every leaf; with dim: a node (drops tags)."""
        return _ops.all(self, dim, keepdim)

    def any(self, dim: Any = None, keepdim: bool = False) -> Any:
        """No dim: one 0-dim bool tensor over every element of every leaf; with dim: a node (drops tags)."""
        return _ops.any(self, dim, keepdim)

    # -- shapes (_shape.py) -----------------------------------------------------------------

    def view(self, *shape: Any) -> TensorDict:
        """The batch dims viewed as ``shape`` (-1 allowed); leaves are views, keeps tags."""
        return _shape.view(self, *shape)

    def reshape(self, *shape: Any) -> TensorDict:
        """The batch dims reshaped to ``shape`` (-1 allowed); keeps tags exactly when every leaf is a view."""
        return _shape.reshape(self, *shape)

    def permute(self, *dims: Any) -> TensorDict:
        """The batch dims reordered as ``dims``; views, keeps tags."""
        return _shape.permute(self, *dims)

    def transpose(self, dim0: int, dim1: int) -> TensorDict:
        """Batch dims ``dim0`` and ``dim1`` swapped; views, keeps tags."""
        return _shape.transpose(self, dim0, dim1)

    def squeeze(self, dim: int | Sequence[int] | None = None) -> TensorDict:
        """Without the batch dims of size 1 (all, or those in ``dim``); views, keeps tags."""
        return _shape.squeeze(self, dim)

    def unsqueeze(self, dim: int) -> TensorDict:
        """With a batch dim of size 1 inserted at ``dim``; views, keeps tags."""
        return _shape.unsqueeze(self, dim)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> TensorDict:
        """Batch dims ``start_dim``..``end_dim`` merged into one; keeps tags when the leaves are views."""
        return _shape.flatten(self, start_dim, end_dim)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> TensorDict:
        """Batch dim ``dim`` split into ``sizes``; views, keeps tags."""
        return _shape.unflatten(self, dim, sizes)

    def expand(self, *shape: Any) -> TensorDict:
        """The batch dims broadcast to ``shape`` (-1 keeps a dim); views, keeps tags."""
        return _shape.expand(self, *shape)

    def unbind(self, dim: int = 0) -> tuple[TensorDict, ...]:
        """One node per index along batch dim ``dim``, without it; views, keeps tags."""
        return _shape.unbind(self, dim)

    def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[TensorDict, ...]:
        """Nodes cut along batch dim ``dim`` as ``torch.split`` does; views, keeps tags."""
        return _shape.split(self, split_size_or_sections, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[TensorDict, ...]:
        """At most ``chunks`` nodes cut along batch dim ``dim`` as ``torch.chunk`` does; views, keeps tags."""
        return _shape.chunk(self, chunks, dim)

    # -- indexing and scatter (_index.py) ------------------------------------------------

    @property
    def at(self) -> _index.At[TensorDict]:
        """``td.at[idx].set(v)``: a new node with ``v`` written at ``idx`` (drops tags; refused when Locked);
        ``td.at[idx].set_(v)``: writes in place and returns ``td`` (keeps tags); ``td.at[idx].get()``: ``td[idx]``."""
        return _index.At(self)

    # -- combining, devices and memory (_combine.py, _device.py) ------------------------

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """``torch.stack``/``cat``/``zeros_like``/``ones_like``/``full_like``/``empty_like`` on nodes; others decline."""
        return _combine.torch_function(func, args, kwargs)

    def to(self, *args: Any, **kwargs: Any) -> TensorDict:
        """Every leaf through ``Tensor.to`` (device and/or dtype); keeps tags when nothing changes."""
        return _device.to(self, *args, **kwargs)

    def cpu(self) -> TensorDict:
        """``to("cpu")``; keeps tags when already there."""
        return _device.cpu(self)

    def cuda(self, device: Any = None, non_blocking: bool = False) -> TensorDict:
        """``to(CUDA device)``; keeps tags when already there."""
        return _device.cuda(self, device, non_blocking)

    def pin_memory(self) -> TensorDict:
        """Every leaf in page-locked memory (needs an accelerator); drops tags unless already pinned."""
        return _device.pin_memory(self)

    def contiguous(self) -> TensorDict:
        """Every leaf contiguous; keeps tags when every leaf already is."""
        return _device.contiguous(self)

    @property
    def nbytes(self) -> int:
        """The bytes of the distinct storages the leaves use (views count once)."""
        return _device.nbytes(self)

    def double(self) -> TensorDict:
        """``to(torch.float64)``; keeps tags when already so."""
        return _device.to(self, torch.float64)

    def half(self) -> TensorDict:
        """``to(torch.float16)``; keeps tags when already so."""
        return _device.to(self, torch.float16)

    def bfloat16(self) -> TensorDict:
        """``to(torch.bfloat16)``; keeps tags when already so."""
        return _device.to(self, torch.bfloat16)

    def long(self) -> TensorDict:
        """``to(torch.int64)``; keeps tags when already so."""
        return _device.to(self, torch.int64)

    # float/int/bool shadow the builtins for the annotations below them, so they come last in the section.
    def float(self) -> TensorDict:
        """``to(torch.float32)``; keeps tags when already so."""
        return _device.to(self, torch.float32)

    def int(self) -> TensorDict:
        """``to(torch.int32)``; keeps tags when already so."""
        return _device.to(self, torch.int32)

    def bool(self) -> TensorDict:
        """``to(torch.bool)``; keeps tags when already so."""
        return _device.to(self, torch.bool)

    # -- in-place writers and shared memory (_inplace.py, _shared.py) -------------------

    def update_(self, other: Mapping[Any, Any] | TensorDict) -> TensorDict:
        """This node, after writing ``other``'s values into the existing leaves (broadcast; same keys)."""
        return _inplace.update_(self, other)

    def copy_(self, other: TensorDict) -> TensorDict:
        """This node, after copying every leaf of ``other`` (same keys, shapes, dtypes) into its leaves."""
        return _inplace.copy_(self, other)

    def zero_(self) -> TensorDict:
        """This node, after setting every leaf to zero in place."""
        return _inplace.zero_(self)

    def fill_(self, key: NestedKey, value: Any) -> TensorDict:
        """This node, after filling the leaf (or every leaf of the sub-node) at ``key`` with ``value``."""
        return _inplace.fill_(self, key, value)

    def share_memory(self) -> TensorDict:
        """A copy with every leaf in shared memory, tagged ``{Shared, Locked}`` (the input is unchanged)."""
        return _shared.share_memory(self)

    # -- memory-mapped files and serialization (_memmap.py, _serialize.py) --------------

    def memmap(self, prefix: Any, existsok: builtins.bool = False) -> TensorDict:
        """A node equal to this one with leaves mapped from files under the directory ``prefix`` (str or
        path); tags ``{Memmap, Locked}`` (made, not kept). See :func:`tdtree._memmap.memmap`."""
        return _memmap.memmap(self, prefix, existsok)


register(TensorDict)
