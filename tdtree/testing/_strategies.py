"""Hypothesis strategies for nodes, keys and batch sizes, and ``same_structure`` for binary laws."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from .. import NestedKey, TensorClass, TensorDict
from ._tagging import apply_tags, tag_sets
from ._values import DEFAULT_DTYPES, ELEMENTS, SPECIAL_RATES, values

__all__ = ["batch_sizes", "nested_keys", "tensordicts", "same_structure", "NAMES"]

NAMES = st.text(alphabet="abcdefgh", min_size=1, max_size=3)


def batch_sizes(
    min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4
) -> st.SearchStrategy[torch.Size]:
    """Batch sizes of ``min_dims`` to ``max_dims`` dims, each of ``min_side`` to ``max_side``.

    Args:
        min_dims, max_dims: the range of the number of dims.
        min_side, max_side: the range of each dim's size.

    Returns:
        A strategy of ``torch.Size``.
    """
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(torch.Size)


def nested_keys(max_depth: int = 3, names: st.SearchStrategy[str] = NAMES) -> st.SearchStrategy[Any]:
    """Keys: a str, or a tuple of 1 to ``max_depth`` str.

    Args:
        max_depth: the longest tuple.
        names: the strategy for each part (default: 1 to 3 letters of ``a``..``h``).

    Returns:
        A strategy of keys (str or tuple of str).
    """
    return st.one_of(names, st.lists(names, min_size=1, max_size=max_depth).map(tuple))


class _Options:
    """What ``tensordicts`` was asked for, checked once."""

    def __init__(
        self,
        *,
        pinned: dict[str, Any] | None,
        max_depth: int,
        max_keys: int,
        min_keys: int,
        dtypes: tuple[torch.dtype, ...],
        elements: str,
        names: st.SearchStrategy[str],
        extra_batch_dims: bool,
        noncontiguous: bool,
        aliasing: bool,
        tags: bool | Collection[Any],
        devices: Sequence[torch.device | str] | None,
        empty_nodes: bool,
        zero_size: bool,
    ) -> None:
        if elements not in ELEMENTS:
            raise ValueError(f"elements={elements!r}: choose one of {ELEMENTS}")
        if not dtypes:
            raise ValueError("dtypes=(): give at least one dtype")
        self.pinned, self.max_depth, self.max_keys, self.min_keys = pinned, max_depth, max_keys, min_keys
        self.dtypes, self.elements, self.names = dtypes, elements, names
        self.extra_batch_dims, self.noncontiguous, self.aliasing = extra_batch_dims, noncontiguous, aliasing
        self.empty_nodes = empty_nodes
        self.devices = tuple(torch.device(d) for d in (devices or ("cpu",)))
        self.tag_sets = tag_sets(tags)
        self.min_side = 0 if zero_size else 1


class _Leaf:
    """A pinned leaf: its feature shape, or None to draw one."""

    __slots__ = ("feature",)

    def __init__(self, feature: tuple[int, ...] | None) -> None:
        self.feature = feature


def _pinned(keys: Collection[NestedKey] | Mapping[NestedKey, Sequence[int] | None]) -> dict[str, Any]:
    """The tree of ``keys``: key part -> subtree, or a :class:`_Leaf`; ValueError naming a clash."""
    tree: dict[str, Any] = {}
    for key in keys:
        feature = keys.get(key) if isinstance(keys, Mapping) else None
        parts = (key,) if isinstance(key, str) else tuple(key)
        if not parts or not all(isinstance(p, str) for p in parts):
            raise ValueError(f"keys=: {key!r} is not a str or a non-empty tuple of str")
        level = tree
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if (part in level) and (isinstance(level[part], _Leaf) or last):
                raise ValueError(f"keys=: {parts[: i + 1]!r} is both a leaf and a sub-node (or given twice)")
            if last:
                level[part] = _Leaf(None if feature is None else tuple(feature))
            else:
                level = level.setdefault(part, {})
    return tree


def _spec(
    draw: st.DrawFn, opt: _Options, batch: torch.Size, depth: int, pinned: dict[str, Any] | None, root: bool
) -> dict:
    """The drawn structure: key -> ("leaf", shape, dtype) or ("node", batch, spec)."""
    if pinned is not None:
        plan = {k: (not isinstance(sub, _Leaf), sub) for k, sub in pinned.items()}
    else:
        low = opt.min_keys if root else (0 if opt.empty_nodes else 1)
        names = draw(st.lists(opt.names, min_size=low, max_size=max(opt.max_keys, low), unique=True))
        plan = {k: (depth > 0 and draw(st.booleans()), None) for k in names}
    spec: dict[str, Any] = {}
    for key, (is_node, sub) in plan.items():
        if is_node:
            sub_batch = batch
            if opt.extra_batch_dims:
                extra = draw(st.lists(st.integers(opt.min_side, 3), max_size=1))
                sub_batch = torch.Size((*batch, *extra))
            spec[key] = ("node", sub_batch, _spec(draw, opt, sub_batch, depth - 1, sub, False))
        else:
            feature = sub.feature if isinstance(sub, _Leaf) else None
            if feature is None:
                feature = tuple(draw(st.lists(st.integers(opt.min_side, 3), max_size=2)))
            spec[key] = ("leaf", (*batch, *feature), draw(st.sampled_from(opt.dtypes)))
    return spec


def _leaves(spec: dict, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], tuple[int, ...], torch.dtype]]:
    found = []
    for key, entry in spec.items():
        if entry[0] == "node":
            found += _leaves(entry[2], (*path, key))
        else:
            found.append(((*path, key), entry[1], entry[2]))
    return found


def _bent(flat: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A non-contiguous view of ``flat`` with ``shape``: laid out in the reversed shape, permuted back."""
    return flat.view(tuple(reversed(shape))).permute(tuple(reversed(range(len(shape)))))


def _materialize(
    draw: st.DrawFn, opt: _Options, leaves: list, device: torch.device
) -> dict[tuple[str, ...], torch.Tensor]:
    """A tensor per leaf path; under ``aliasing``, leaves of one dtype may view one storage."""
    made: dict[tuple[str, ...], torch.Tensor] = {}
    groups: dict[torch.dtype, list] = {}
    for leaf in leaves:
        groups.setdefault(leaf[2], []).append(leaf)
    for dtype, group in groups.items():
        rate = draw(st.sampled_from(SPECIAL_RATES)) if opt.elements == "special" else 0.0
        seed = draw(st.integers(0, 2**31 - 1))
        numels = [torch.Size(shape).numel() for _, shape, _ in group]
        if opt.aliasing and len(group) > 1 and draw(st.booleans()):
            overlap = draw(st.booleans())
            if overlap:  # every leaf starts somewhere in one buffer as long as the largest leaf
                size = max(numels)
                offsets = [draw(st.integers(0, size - n)) for n in numels]
            else:  # leaves side by side in one buffer
                size = sum(numels)
                offsets = [sum(numels[:i]) for i in range(len(numels))]
            base = values((size,), dtype, seed, rate).to(device)
            views = [base[o : o + n] for o, n in zip(offsets, numels)]
        else:
            views = [values((n,), dtype, seed + i, rate).to(device) for i, n in enumerate(numels)]
        for (path, shape, _), flat in zip(group, views):
            bent = opt.noncontiguous and len(shape) > 1 and draw(st.booleans())
            made[path] = _bent(flat, shape) if bent else flat.view(shape)
    return made


def _build(spec: dict, batch: torch.Size, made: dict, path: tuple[str, ...] = ()) -> TensorDict:
    data: dict[str, Any] = {}
    for key, entry in spec.items():
        if entry[0] == "node":
            data[key] = _build(entry[2], entry[1], made, (*path, key))
        else:
            data[key] = made[(*path, key)]
    return TensorDict(data, batch)


@st.composite
def _tensordict(draw: st.DrawFn, opt: _Options, batch: torch.Size) -> TensorDict:
    spec = _spec(draw, opt, batch, opt.max_depth, opt.pinned, True)
    device = draw(st.sampled_from(opt.devices))
    node = _build(spec, batch, _materialize(draw, opt, _leaves(spec), device))
    return apply_tags(node, draw(st.sampled_from(opt.tag_sets)))


def tensordicts(
    batch_size: torch.Size | Sequence[int] | st.SearchStrategy[torch.Size] | None = None,
    *,
    keys: Collection[NestedKey] | Mapping[NestedKey, Sequence[int] | None] | None = None,
    max_depth: int = 2,
    max_keys: int = 4,
    min_keys: int = 0,
    dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES,
    elements: str = "normal",
    names: st.SearchStrategy[str] = NAMES,
    extra_batch_dims: bool = False,
    noncontiguous: bool = False,
    aliasing: bool = False,
    tags: bool | Collection[Any] = False,
    devices: Sequence[torch.device | str] | None = None,
    empty_nodes: bool = True,
    zero_size: bool = True,
) -> st.SearchStrategy[TensorDict]:
    """Nodes, untagged on the CPU unless asked otherwise.

    Args:
        batch_size: a fixed batch size or a strategy of them (default: :func:`batch_sizes`).
        keys: pin the leaf keys: the node holds exactly these (str or tuples of str; a tuple nests);
            a mapping from key to feature shape pins the leaves' shapes too (None: drawn).
        max_depth: how deep sub-nodes may nest.
        max_keys, min_keys: entries per node (``min_keys`` applies to the root).
        dtypes: the leaf dtypes to draw from (``tdtree.testing.ALL_DTYPES`` holds the float16, bfloat16,
            float64, complex64, int8, uint8, int64 and bool mix).
        elements: ``"normal"`` (random finite values) or ``"special"``: a drawn share (0 to all)
            of each leaf's elements are NaN, ±inf, -0.0, subnormals, the dtype's extremes.
        names: the strategy for key parts.
        extra_batch_dims: let sub-nodes have more batch dims than their parent.
        noncontiguous: let leaves be non-contiguous (permuted) views.
        aliasing: let leaves of one dtype view one storage, side by side or overlapping (the case
            the tag rule and the in-place writers' alias checks exist for).
        tags: False (untagged), True (every reachable tag set: ``{}``, ``{Locked}``, ``{Shared}``,
            ``{Shared, Locked}``, ``{Memmap}``, ``{Memmap, Locked}``), one set of tags, or a
            collection of sets. Shared and Memmap draws are copies (``share_memory()``,
            ``memmap()``), so their leaves are contiguous and alias nothing; memmap files live in
            a temporary directory removed after each example.
        devices: the devices to draw a node's device from (default the CPU;
            :func:`available_devices` gives the CPU and every CUDA device present).
        empty_nodes: let sub-nodes be empty. zero_size: let batch and feature dims be 0. Both
            default to True because those cases are where bugs hide; turn them off for functions
            that are undefined there.

    Returns:
        A strategy of :class:`~tdtree.TensorDict`; hypothesis shrinks over keys, shapes, dtypes and tags
        (values come from a drawn seed).

    Raises:
        ValueError: an unknown ``elements``, no ``dtypes``, a key in ``keys`` that is not a key or
            is both a leaf and a sub-node, or a tag set no node can carry.

    >>> from hypothesis import given, settings
    >>> from tdtree.testing import tensordicts
    >>> @given(tensordicts(batch_size=[3]))
    ... @settings(max_examples=10)
    ... def test_double(td):
    ...     assert (td + td).batch_size == td.batch_size
    >>> test_double()
    """
    opt = _Options(
        pinned=None if keys is None else _pinned(keys),
        max_depth=max_depth,
        max_keys=max_keys,
        min_keys=min_keys,
        dtypes=tuple(dtypes),
        elements=elements,
        names=names,
        extra_batch_dims=extra_batch_dims,
        noncontiguous=noncontiguous,
        aliasing=aliasing,
        tags=tags,
        devices=devices,
        empty_nodes=empty_nodes,
        zero_size=zero_size,
    )
    if batch_size is None:
        sizes: st.SearchStrategy[torch.Size] = batch_sizes(min_side=opt.min_side)
    elif isinstance(batch_size, st.SearchStrategy):
        sizes = batch_size
    else:
        sizes = st.just(torch.Size(batch_size))
    return sizes.flatmap(lambda bs: _tensordict(opt, bs))


# -- same_structure --------------------------------------------------------------------------


def _twin_leaf(x: torch.Tensor, made: dict[Any, torch.UntypedStorage], seed: int, rate: float) -> torch.Tensor:
    """A tensor with ``x``'s dtype, device, shape, strides and offset on a new storage; leaves of one
    storage get one new storage (so aliasing is kept), then fresh values where the view allows."""
    storage = x.untyped_storage()
    if storage.nbytes() == 0:
        out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    else:
        key = (x.device, storage.data_ptr())
        if key not in made:
            made[key] = storage.clone()
        out = torch.empty(0, dtype=x.dtype, device=x.device)
        out.set_(made[key], x.storage_offset(), x.shape, x.stride())
        fresh = values(tuple(x.shape), x.dtype, seed, rate).to(x.device)
        if all(st_ != 0 or n <= 1 for st_, n in zip(x.stride(), x.shape)):
            out.copy_(fresh)  # an expanded view (stride 0) keeps the copied bytes: it cannot be written
    return out.requires_grad_() if x.requires_grad else out


def rebuild(value: Any, leaf: Any) -> Any:
    """``value`` (nodes, tensorclasses, tensors, tuples and lists of them) rebuilt untagged through
    public constructors, each tensor replaced by ``leaf(tensor)``."""
    if isinstance(value, TensorClass):
        inner = value.to_node()
        static = {f: getattr(value, f) for f in type(value)._fields if f not in inner.keys()}
        return type(value).from_node(rebuild(inner, leaf), **static)
    if isinstance(value, TensorDict):
        return TensorDict({k: rebuild(v, leaf) for k, v in value.items()}, value.batch_size, value.device)
    if isinstance(value, torch.Tensor):
        return leaf(value)
    if type(value) in (tuple, list):
        return type(value)(rebuild(v, leaf) for v in value)
    return value


def _tags_of(value: Any) -> frozenset:
    return value.tags if isinstance(value, (TensorDict, TensorClass)) else frozenset()


@st.composite
def _same(draw: st.DrawFn, value: Any, elements: str) -> Any:
    seed = draw(st.integers(0, 2**31 - 1))
    rate = draw(st.sampled_from(SPECIAL_RATES)) if elements == "special" else 0.0
    made: dict[Any, torch.UntypedStorage] = {}
    count = iter(range(seed, seed + 2**20))
    twin = rebuild(value, lambda x: _twin_leaf(x, made, next(count), rate))

    def tagged(v: Any, t: Any) -> Any:
        if isinstance(v, (TensorDict, TensorClass)):
            return apply_tags(t, _tags_of(v))
        if type(v) in (tuple, list):
            return type(v)(tagged(a, b) for a, b in zip(v, t))
        return t

    return tagged(value, twin)


def same_structure(value: Any, *, elements: str = "normal") -> st.SearchStrategy[Any]:
    """Values with ``value``'s structure and fresh leaf values: for binary-operation laws, and inputs
    a compiled function must take without recompiling.

    ``value`` is a node, tensorclass, tensor, or a tuple or list of them. The draw has the same keys,
    batch sizes, device, tags, static fields, leaf shapes, dtypes, strides and storage offsets, and
    the same aliasing (leaves that share a storage in ``value`` share one new storage); tagged nodes
    are made as the strategies make them (``lock()``, ``share_memory()``, ``memmap()``).

    Args:
        value: a node, tensorclass, tensor, or a tuple or list of them.
        elements: as in :func:`tensordicts`.

    Returns:
        A strategy of values like ``value``.

    Raises:
        ValueError: an unknown ``elements``.
    """
    if elements not in ELEMENTS:
        raise ValueError(f"elements={elements!r}: choose one of {ELEMENTS}")
    return _same(value, elements)
