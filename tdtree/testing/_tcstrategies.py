"""``tensorclasses(cls)``: instances of a user's tensorclass drawn from its annotations."""

from __future__ import annotations

import enum
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from .. import TensorClass, TensorDict
from ._strategies import batch_sizes, tensordicts
from ._tagging import apply_tags, tag_sets
from ._values import DEFAULT_DTYPES, ELEMENTS, SPECIAL_RATES, values

__all__ = ["tensorclasses"]

FieldStrategy = st.SearchStrategy[Any] | Callable[[torch.Size], st.SearchStrategy[Any]]


def _hints(cls: type) -> dict[str, Any]:
    """Each field's annotation as an object (string annotations evaluated in their class's module)."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        for name, hint in klass.__dict__.get("__annotations__", {}).items():
            if name not in cls._fields:  # type: ignore[attr-defined]
                continue
            if isinstance(hint, str):
                try:
                    hint = eval(hint, dict(vars(module)) if module else {}, {klass.__name__: klass})  # noqa: S307
                except Exception as err:  # a name local to a function, or not importable from the module
                    raise TypeError(
                        f"tensorclasses({cls.__name__}): cannot resolve the annotation {hint!r} of field "
                        f"{name!r} ({err}); pass fields={{{name!r}: strategy}}"
                    ) from None
            hints[name] = hint
    return hints


class _Draw:
    """The options of one ``tensorclasses`` call, and how each annotation is drawn."""

    def __init__(
        self, cls: type, dtypes: tuple[torch.dtype, ...], elements: str, device: torch.device, min_side: int, depth: int
    ) -> None:
        self.cls, self.dtypes, self.elements, self.device = cls, dtypes, elements, device
        self.min_side, self.depth = min_side, depth

    def tensor(self, batch: torch.Size) -> st.SearchStrategy[torch.Tensor]:
        @st.composite
        def draw_tensor(draw: st.DrawFn) -> torch.Tensor:
            feature = tuple(draw(st.lists(st.integers(self.min_side, 3), max_size=2)))
            dtype = draw(st.sampled_from(self.dtypes))
            rate = draw(st.sampled_from(SPECIAL_RATES)) if self.elements == "special" else 0.0
            return values((*batch, *feature), dtype, draw(st.integers(0, 2**31 - 1)), rate).to(self.device)

        return draw_tensor()

    def field(self, name: str, hint: Any, batch: torch.Size) -> st.SearchStrategy[Any]:
        origin = typing.get_origin(hint)
        if origin is typing.Union or origin is types.UnionType:
            return st.one_of([self.field(name, arg, batch) for arg in typing.get_args(hint)])
        if hint is None or hint is type(None):
            return st.none()
        if isinstance(hint, type):
            if issubclass(hint, torch.Tensor):
                return self.tensor(batch)
            if issubclass(hint, TensorClass):
                if self.depth <= 0:
                    return st.nothing()  # a recursive class: only its other alternatives (None) remain
                return _instances(
                    hint,
                    st.just(batch),
                    self.dtypes,
                    self.elements,
                    (),
                    (self.device,),
                    self.min_side,
                    {},
                    self.depth - 1,
                )
            if issubclass(hint, TensorDict):
                return tensordicts(
                    batch,
                    max_depth=1,
                    dtypes=self.dtypes,
                    elements=self.elements,
                    devices=(self.device,),
                    zero_size=self.min_side == 0,
                )
            if issubclass(hint, enum.Enum):
                return st.sampled_from(hint)
            # static values live in the pytree metadata, where NaN would never equal itself
            simple = {
                bool: st.booleans(),
                int: st.integers(-(2**31), 2**31 - 1),
                str: st.text(max_size=8),
                float: st.floats(allow_nan=False, allow_infinity=False),
            }
            if hint in simple:
                return simple[hint]
        raise TypeError(
            f"tensorclasses({self.cls.__name__}): cannot draw field {name!r} annotated {hint!r}; "
            f"pass fields={{{name!r}: strategy}} (a strategy, or a function of the batch size returning one)"
        )


def _instances(
    cls: type,
    sizes: st.SearchStrategy[torch.Size],
    dtypes: tuple[torch.dtype, ...],
    elements: str,
    sets: tuple[frozenset, ...],
    devices: Sequence[torch.device],
    min_side: int,
    fields: Mapping[str, FieldStrategy],
    depth: int,
) -> st.SearchStrategy[Any]:
    hints = {name: hint for name, hint in _hints(cls).items() if name not in fields}

    @st.composite
    def draw_instance(draw: st.DrawFn) -> Any:
        batch = draw(sizes)
        drawer = _Draw(cls, dtypes, elements, draw(st.sampled_from(list(devices))), min_side, depth)
        given: dict[str, Any] = {}
        for name in cls._fields:  # type: ignore[attr-defined]
            custom = fields.get(name)
            if custom is None:
                strategy = drawer.field(name, hints[name], batch)
            else:
                strategy = custom if isinstance(custom, st.SearchStrategy) else custom(batch)
            given[name] = draw(strategy)
        instance = cls(**given, batch_size=batch)
        return apply_tags(instance, draw(st.sampled_from(sets))) if sets else instance

    return draw_instance()


def tensorclasses(
    cls: type,
    *,
    batch_size: torch.Size | Sequence[int] | st.SearchStrategy[torch.Size] | None = None,
    dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES,
    elements: str = "normal",
    tags: bool | Collection[Any] = False,
    devices: Sequence[torch.device | str] | None = None,
    zero_size: bool = True,
    fields: Mapping[str, FieldStrategy] | None = None,
    max_depth: int = 2,
) -> st.SearchStrategy[Any]:
    """Instances of the tensorclass ``cls``, each field drawn from its annotation.

    ``torch.Tensor`` fields get a tensor of the batch size and 0 to 2 feature dims; ``TensorDict``
    fields a node (:func:`tensordicts`); nested tensorclass fields an instance of that class (up to
    ``max_depth`` levels, so a class that refers to itself ends in its ``None`` alternative);
    ``X | None`` either; static fields a value of their type (``bool``, ``int``, ``str``, finite
    ``float``, enum members). Every data field shares the instance's batch size and device.

    Args:
        cls: the tensorclass (a :class:`tdtree.TensorClass` subclass or ``@tensorclass`` class).
        batch_size, dtypes, elements, tags, devices, zero_size: as for :func:`tensordicts`.
        fields: a strategy per field name, or a function of the batch size returning one, for
            fields whose annotation says too little (``Any``) or too much.

    Returns:
        A strategy of ``cls`` instances (hypothesis's ``st.from_type(cls)`` gives it too).

    Raises:
        TypeError: ``cls`` is not a tensorclass, or naming a field whose annotation cannot be
            drawn (pass it in ``fields``).
        ValueError: an unknown ``elements``.
    """
    if not (isinstance(cls, type) and issubclass(cls, TensorClass)):
        raise TypeError(f"tensorclasses: {cls!r} is not a tensorclass")
    if elements not in ELEMENTS:
        raise ValueError(f"elements={elements!r}: choose one of {ELEMENTS}")
    min_side = 0 if zero_size else 1
    if batch_size is None:
        sizes: st.SearchStrategy[torch.Size] = batch_sizes(max_dims=2, min_side=min_side)
    elif isinstance(batch_size, st.SearchStrategy):
        sizes = batch_size
    else:
        sizes = st.just(torch.Size(batch_size))
    chosen = tuple(torch.device(d) for d in (devices or ("cpu",)))
    return _instances(
        cls, sizes, tuple(dtypes), elements, tag_sets(tags), chosen, min_side, dict(fields or {}), max_depth
    )
