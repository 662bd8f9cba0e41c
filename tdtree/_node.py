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

from . import (
    _combine,
    _device,
    _index,
    _keyops,
    _lookup,
    _maps,
    _memmap,
    _ops,
    _records,
    _scatter,
    _shape,
    _shared,
    _statedict,
    _writers,
)
from ._base import Node
from ._dataset import TensorDictDataset, not_a_dataset
from ._pickle import deepcopy_node, reduce_node
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
        """Register a subclass that is a root type of its own (pytree, name table, tagged variants)."""
        super().__init_subclass__(**kwargs)
        if "_tags" not in cls.__dict__:  # a root type of its own (tagged_type registers the variants it makes)
            register(cls)

    def __init__(
        self,
        source: Mapping[Any, Any] | None = None,
        batch_size: int | Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        """Validate the arguments and build the node (Args and Raises: see the class docstring)."""
        construct(self, source, batch_size, device)

    def __class_getitem__(cls, tags: Tag | tuple[Tag, ...]) -> type:
        """``TensorDict[Shared]``, ``TensorDict[Locked, Shared]``: the cached tagged types (TypeError for a non-tag)."""
        return tagged_type(cls._root, tags if isinstance(tags, tuple) else (tags,))

    @classmethod
    def from_dict(
        cls, data: Mapping[Any, Any], batch_size: int | Sequence[int] | None = None, device: Any = None
    ) -> TensorDict:
        """A node from nested mappings, validated as the constructor does.

        Args:
            data: a mapping from keys (str or tuple of str) to tensors, nodes or mappings.
            batch_size: the batch size; None infers, at each level, the longest common prefix of
                the shapes of the leaves below it (a single leaf: its whole shape).
            device: when given, every leaf is moved there.

        Returns:
            A new, untagged node (the leaves are ``data``'s tensors unless moved).

        Raises:
            TypeError: called on a tagged type, a key is not a str or tuple of str, a value is not
                a tensor, node or mapping, or ``batch_size`` is not a sequence of ints.
            ValueError: ``batch_size`` has a negative dim.
            BatchSizeError: a leaf's shape does not start with the batch size.
            KeyCollisionError: a key is given twice (``"a"`` and ``("a",)``), or below a tensor.
        """
        if cls._tags:
            raise refuse_tagged(cls, f"{cls.__name__}.from_dict")
        return _keyops.from_dict(cls._root, data, batch_size, device)

    @classmethod
    def from_dataclass(cls, obj: Any, batch_size: int | Sequence[int] | None = None, device: Any = None) -> TensorDict:
        """A node with one entry per field of a dataclass instance; nested records nest.

        Args:
            obj: a dataclass instance whose fields are tensors, nodes, mappings, dataclass
                instances or named tuples (the records become sub-nodes).
            batch_size, device: as in :meth:`from_dict` (None infers the batch size).

        Returns:
            A new, untagged node holding the fields' tensors (not copied).

        Raises:
            TypeError: ``obj`` is not a dataclass instance, a field has another type (the
                message names it), or called on a tagged type; and as :meth:`from_dict`.
        """
        if cls._tags:
            raise refuse_tagged(cls, f"{cls.__name__}.from_dataclass")
        return _records.from_dataclass(cls._root, obj, batch_size, device)

    @classmethod
    def from_namedtuple(cls, obj: Any, batch_size: int | Sequence[int] | None = None, device: Any = None) -> TensorDict:
        """A node with one entry per field of a named tuple; as :meth:`from_dataclass`.

        Args:
            obj: a named tuple instance (fields as in :meth:`from_dataclass`).
            batch_size, device: as in :meth:`from_dict`.

        Returns:
            A new, untagged node holding the fields' tensors (not copied).

        Raises:
            TypeError: ``obj`` is not a named tuple, a field has another type, or called on a
                tagged type; and as :meth:`from_dict`.
        """
        if cls._tags:
            raise refuse_tagged(cls, f"{cls.__name__}.from_namedtuple")
        return _records.from_namedtuple(cls._root, obj, batch_size, device)

    def to_namedtuple(self) -> Any:
        """A named tuple of the same tensors, fields in key order, sub-nodes as nested named tuples.

        Returns:
            The record (one type per key set); batch size, device and tags are not kept.

        Raises:
            ValueError: a key is not a valid field name (an identifier, not a keyword, no leading ``_``).
        """
        return _records.to_namedtuple(self)

    # -- metadata -------------------------------------------------------------

    @property
    def batch_size(self) -> torch.Size:
        """The leading dims every leaf shares (a ``torch.Size``)."""
        return self._meta[1]

    @property
    def shape(self) -> torch.Size:
        """The batch size, as ``batch_size``."""
        return self._meta[1]

    @property
    def ndim(self) -> int:
        """The number of batch dims."""
        return len(self._meta[1])

    def dim(self) -> int:
        """The number of batch dims, as ``ndim``."""
        return len(self._meta[1])

    def numel(self) -> int:
        """The number of batch elements (the product of ``batch_size``)."""
        return self._meta[1].numel()

    @property
    def device(self) -> torch.device | None:
        """The device every leaf is on, or None (leaves on several devices, or none)."""
        return self._meta[2]

    @property
    def tags(self) -> frozenset[Tag]:
        """The node's tags (a frozenset of ``Locked``, ``Shared``, ``Memmap``): part of its type."""
        return self._meta[3]

    @property
    def is_locked(self) -> bool:
        """Whether the node is tagged ``Locked``."""
        return Locked in self._meta[3]

    @property
    def is_shared(self) -> bool:
        """Whether the node is tagged ``Shared``."""
        return Shared in self._meta[3]

    @property
    def is_memmap(self) -> bool:
        """Whether the node is tagged ``Memmap``."""
        return Memmap in self._meta[3]

    __repr__ = node_repr
    __reduce__ = reduce_node
    __deepcopy__ = deepcopy_node

    # -- mapping protocol and lookup -----------------------------------------------

    def __len__(self) -> int:
        """The number of top-level keys."""
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        """The top-level keys, in canonical (sorted) order."""
        return iter(self._data)

    def __getitems__(self, indices: Sequence[builtins.int]) -> TensorDict:
        """Always raises TypeError: torch calls it on a dataset (``DataLoader(td)``, ``Subset(td, ...)``),
        and a node is a mapping, whose ``len`` counts keys; the message says to pass :meth:`as_dataset`."""
        raise not_a_dataset(self)

    def as_dataset(self) -> TensorDictDataset[TensorDict]:
        """The rows of this node along its first batch dim, as a map-style ``torch.utils.data.Dataset``.

        ``len(td)`` counts keys (a node is a mapping); the dataset's ``len`` is the first batch dim,
        ``ds[i]`` is ``td[i]`` and a batch of indices is read in one index operation
        (``__getitems__``), so ``DataLoader(td.as_dataset(), batch_size=64, shuffle=True)`` yields one
        node per batch (untagged: new storage). See also ``tdtree.data.minibatches``.

        Returns:
            A :class:`tdtree.data.TensorDictDataset` holding this node (nothing is copied).

        Raises:
            TypeError: the node has no batch dims.

        >>> import torch, tdtree as tt
        >>> from torch.utils.data import DataLoader
        >>> td = tt.TensorDict({"x": torch.arange(6.0), "y": torch.arange(6)}, batch_size=[6])
        >>> [b["y"].tolist() for b in DataLoader(td.as_dataset(), batch_size=4)]
        [[0, 1, 2, 3], [4, 5]]
        """
        return TensorDictDataset(self)

    __contains__ = _lookup.contains

    def __getitem__(self, index: Any) -> Any:
        """An entry by key, or the node indexed over its batch dims.

        Args:
            index: a key (str, or tuple of str for a nested key); or an index over the batch
                dims as torch takes for a tensor (int, slice, None, ``...``, an index tensor or
                list, a bool mask, or a tuple of them). Feature dims are never indexed.

        Returns:
            For a key, the tensor or sub-node there. For an index, a new node of the indexed
            batch size: basic indices (ints, slices, None, ``...``) give views and keep the
            tags; index tensors and masks copy, and the tags are dropped.

        Raises:
            KeyNotFoundError: the key is not there (the message lists the keys and close matches).
            NotANodeKeyError: a nested key goes through a tensor.
            BatchDimError: more indices than batch dims, an int out of range, or a mask that
                does not fit the batch dims it covers.
            TypeError: a key mixed with an index, or an unsupported index type.
            ValueError: a slice with a step that is not positive.

        >>> import torch, tdtree as tt
        >>> td = tt.TensorDict({"a": torch.arange(6).view(3, 2), "b": {"c": torch.zeros(3)}}, batch_size=[3])
        >>> td["b", "c"], td[1:]["a"], td[torch.tensor([True, False, True])].batch_size
        (tensor([0., 0., 0.]), tensor([[2, 3],
                [4, 5]]), torch.Size([2]))
        """
        if type(index) is str:
            value = self._data.get(index, _lookup.MISSING)
            if value is _lookup.MISSING:
                return _lookup.get(self, index)
            return value
        if type(index) is tuple and index and type(index[0]) is str:
            return _lookup.get(self, index)
        return _index.getitem(self, index)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Always raises TypeError: nodes are immutable (the message names ``set`` and ``at[idx]``)."""
        raise TypeError(
            "TensorDict is immutable: td = td.set(key, value) for a new node, "
            "td.at[idx].set(value) for a functional scatter, or td.at[idx].set_(value) to write in place"
        )

    def __delitem__(self, key: Any) -> None:
        """Always raises TypeError: nodes are immutable (the message names ``exclude``)."""
        raise TypeError("TensorDict is immutable: td = td.exclude(key) for a node without it")

    def __bool__(self) -> bool:
        """Always raises RuntimeError: a node has no single truth value (use ``all()`` / ``any()``)."""
        raise RuntimeError(
            "the truth value of a TensorDict is ambiguous: use td.all() or td.any() on a node of bools, "
            "or len(td) for the number of keys"
        )

    # get and the views are the named functions themselves (a function in the class body is a method):
    # the flat ``td.values()`` is a dict view, and a wrapper method would be a third of its cost (a
    # tenth of a nested ``get``'s).
    get = _lookup.get
    keys = _lookup.keys
    values = _lookup.values
    items = _lookup.items

    # -- functional editors (refused on Locked nodes) ------------------------------

    # the named functions themselves (their docstrings are the methods'), as the views are
    set = _keyops.set_entry
    setdefault = _keyops.setdefault
    update = _keyops.update
    rename = _keyops.rename

    # -- key views -------------------------------------------------------------------

    # the named functions themselves, as the views are (a wrapper repacking ``*keys`` and ``strict``
    # costs an eighth of ``select()``)
    select = _lookup.select
    exclude = _lookup.exclude

    flatten_keys = _keyops.flatten_keys
    unflatten_keys = _keyops.unflatten_keys
    to_dict = _lookup.to_dict
    clone = _maps.clone

    # -- tags ----------------------------------------------------------------------------

    def lock(self) -> TensorDict:
        """The same leaves, tagged ``Locked`` in addition to the node's tags (on every sub-node).

        Returns:
            A node sharing every leaf, whose functional editors refuse with LockedError;
            ``self`` when already so tagged.
        """
        return retag(self, self._meta[3] | {Locked})

    def unlock(self) -> TensorDict:
        """The same leaves without the ``Locked`` tag (other tags kept, on every sub-node).

        Returns:
            A node sharing every leaf; ``self`` when already so tagged.
        """
        return retag(self, self._meta[3] - {Locked})

    # -- maps, arithmetic, reductions (_maps.py, _ops.py) --------------------------------

    apply = _maps.apply  # bound as get is, docstrings on the functions: a wrapper would add a call frame
    named_apply = _maps.named_apply

    # Comparisons return nodes, as torch's do; hashing stays by identity, as for tensors.
    __hash__ = Node.__hash__
    __add__ = _ops.add
    __radd__ = _ops.radd
    __sub__ = _ops.sub
    __rsub__ = _ops.rsub
    __mul__ = _ops.mul
    __rmul__ = _ops.rmul
    __truediv__ = _ops.truediv
    __rtruediv__ = _ops.rtruediv
    __floordiv__ = _ops.floordiv
    __rfloordiv__ = _ops.rfloordiv
    __mod__ = _ops.mod
    __rmod__ = _ops.rmod
    __pow__ = _ops.pow
    __rpow__ = _ops.rpow
    __eq__ = _ops.eq  # type: ignore[assignment]
    __ne__ = _ops.ne  # type: ignore[assignment]
    __lt__ = _ops.lt
    __le__ = _ops.le
    __gt__ = _ops.gt
    __ge__ = _ops.ge
    __neg__ = neg = _ops.neg
    __abs__ = abs = _ops.abs
    exp = _ops.exp
    log = _ops.log
    sqrt = _ops.sqrt
    sigmoid = _ops.sigmoid
    tanh = _ops.tanh
    sign = _ops.sign
    clamp = _ops.clamp
    detach = _ops.detach
    sum = _ops.sum
    mean = _ops.mean
    amax = _ops.amax
    amin = _ops.amin
    max = _ops.max
    min = _ops.min
    norm = _ops.norm
    all = _ops.all
    any = _ops.any

    def pow(self, exponent: Any) -> TensorDict:
        """``self ** exponent`` leaf by leaf: ``**`` with torch's argument name (``tdtree._ops.pow``).

        Args:
            exponent: a number, a tensor aligned with the batch dims, or a node paired by key.

        Returns:
            A new node; tags dropped (new storage).

        Raises:
            TypeError: ``exponent`` is none of those.
            KeyMismatchError: ``exponent`` is a node with other keys.
            BatchSizeError: the batch sizes do not fit.
        """
        out = _ops.pow(self, exponent)
        if out is NotImplemented:  # the operator's answer, which a named method must not return
            raise TypeError(f"pow takes a number, tensor or node as exponent, got {type(exponent).__name__}")
        return out

    def where(self, condition: Any, other: Any) -> TensorDict:
        """``tdtree.where(condition, self, other)``: ``self`` where ``condition`` holds, else ``other``.

        Args:
            condition: a node of bools, a bool tensor aligned with the batch dims, or a bool.
            other: a node, a tensor aligned with the batch dims, or a number.

        Returns:
            A new node with this node's structure; tags dropped (new storage).

        Raises:
            TypeError, KeyMismatchError, BatchSizeError: as :func:`tdtree.where`.
        """
        return _ops.where(condition, self, other)

    # -- shapes (_shape.py) -----------------------------------------------------------------

    view = _shape.view
    reshape = _shape.reshape
    permute = _shape.permute
    transpose = _shape.transpose
    squeeze = _shape.squeeze
    unsqueeze = _shape.unsqueeze
    flatten = _shape.flatten
    unflatten = _shape.unflatten
    expand = _shape.expand
    unbind = _shape.unbind
    split = _shape.split
    chunk = _shape.chunk

    # -- indexing and scatter (_index.py, _scatter.py) ---------------------------------

    @property
    def at(self) -> _scatter.At[TensorDict]:
        """Scatter by batch index, as ``td.at[idx].set(v)``, ``td.at[idx].set_(v)``, ``td.at[idx].get()``.

        ``set`` returns a new node with ``v`` written at ``idx`` (tags dropped; refused when
        Locked); ``set_`` writes in place and returns ``td`` (tags kept); ``get`` is ``td[idx]``.
        See :class:`tdtree._scatter.AtIndex` for the arguments and errors.

        >>> import torch, tdtree as tt
        >>> td = tt.TensorDict({"x": torch.zeros(3)}, batch_size=[3])
        >>> td.at[1].set(5.0)["x"], td["x"]
        (tensor([0., 5., 0.]), tensor([0., 0., 0.]))
        """
        return _scatter.At(self)

    # -- combining, devices and memory (_combine.py, _device.py) ------------------------

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """``torch.stack``/``cat``/``zeros_like``/``ones_like``/``full_like``/``empty_like`` on nodes; a
        higher-order operator (``checkpoint``, ``nested_compile_region``, ..., which only dynamo hands
        here) goes back to torch unchanged; other functions decline."""
        return _combine.torch_function(func, args, kwargs)

    to = _device.to
    cpu = _device.cpu
    cuda = _device.cuda
    pin_memory = _device.pin_memory
    contiguous = _device.contiguous

    @property
    def nbytes(self) -> int:
        """The bytes of the distinct storages the leaves use (views count once)."""
        return _device.nbytes(self)

    # float/int/bool shadow the builtins for the annotations below them, so they come last in the section.
    double = _device.cast(torch.float64, "double")
    half = _device.cast(torch.float16, "half")
    bfloat16 = _device.cast(torch.bfloat16, "bfloat16")
    long = _device.cast(torch.int64, "long")
    float = _device.cast(torch.float32, "float")
    int = _device.cast(torch.int32, "int")
    bool = _device.cast(torch.bool, "bool")

    # -- in-place writers and shared memory (_writers.py, _shared.py) -------------------

    update_ = _writers.update_
    copy_ = _writers.copy_
    zero_ = _writers.zero_
    fill_ = _writers.fill_
    # torch's Stateful protocol (torch.distributed.checkpoint)
    state_dict = _statedict.state_dict
    load_state_dict = _statedict.load_state_dict
    share_memory: ClassVar[Callable[[TensorDict], TensorDict]] = _shared.share_memory

    # -- memory-mapped files and serialization (_memmap.py, _serialize.py) --------------

    def memmap(self, prefix: Any, existsok: builtins.bool = False) -> TensorDict:
        """A node equal to this one whose leaves are mapped from files under the directory ``prefix``.

        Args:
            prefix: the directory to create (str or path; its parent is created when missing).
            existsok: replace an existing memmap directory (or empty directory) at ``prefix``.

        Returns:
            A new node on the CPU whose leaves are mapped read-write from the files, tagged
            ``{Memmap, Locked}`` (made, not kept). ``tdtree.load_memmap(prefix)`` maps it again.

        Raises:
            MemmapError: ``prefix`` exists (without ``existsok``, or is not a memmap directory),
                a leaf's dtype cannot be mapped, a leaf is a meta tensor (no values: use
                ``memmap_like``), or writing failed; nothing is left behind.
        """
        return _memmap.memmap(self, prefix, existsok)

    def memmap_like(self, prefix: Any, existsok: builtins.bool = False) -> TensorDict:
        """A memmapped node of this one's keys, batch sizes, shapes and dtypes, holding zeros: the
        files are created at their final size without any value passing through memory.

        Only the leaves' shapes and dtypes are read, so this node may hold meta tensors (a spec:
        ``torch.empty(50_000, 3, 32, 32, dtype=torch.uint8, device="meta")``) or expanded views of
        one row. Fill the result in place, chunk by chunk, with ``at[i:j].set_(chunk)``.

        Args:
            prefix: the directory to create (str or path; its parent is created when missing).
            existsok: replace an existing memmap directory (or empty directory) at ``prefix``.

        Returns:
            A new node on the CPU whose leaves are mapped read-write from zero-filled files, tagged
            ``{Memmap, Locked}`` (made, not kept), as :meth:`memmap` returns.

        Raises:
            MemmapError: as :meth:`memmap`; nothing is left behind.

        >>> import tempfile, torch, tdtree as tt
        >>> spec = tt.TensorDict({"x": torch.empty(1000, 3, device="meta")}, batch_size=[1000])
        >>> data = spec.memmap_like(tempfile.mkdtemp() + "/data")
        >>> data = data.at[:10].set_(tt.TensorDict({"x": torch.ones(10, 3)}, batch_size=[10]))
        >>> data.tags == {tt.Memmap, tt.Locked}, data["x"][:11].sum().item()
        (True, 30.0)
        """
        return _memmap.memmap(self, prefix, existsok, values=False)


register(TensorDict)
# A virtual subclass: torch (load_state_dict, collate) and other libraries ask isinstance(x, Mapping). Registered,
# not inherited: no ABCMeta on the node's class and no mixin methods; subclasses and tagged types follow.
Mapping.register(TensorDict)
__test__ = {"TensorDict": TensorDict}  # doctest finds the methods' examples here (the class's module is "tdtree")
