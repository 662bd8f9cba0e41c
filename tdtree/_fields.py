"""A tensorclass's fields validated (:func:`record`): bound by position and name, each value of its
annotated kind, split into data and static values, then checked as the TensorDict constructor checks
its entries (``_validate.checked_data``): the batch size, the device and every entry's shape.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ._base import Holder, Node, make, sorted_data
from ._validate import CPU, NO_BATCH, as_batch_size, as_device, checked_data, shape_bound
from .errors import BatchSizeError, FieldError

__all__ = ["STATIC_TYPES", "Check", "bind", "hint_name", "field_value", "split", "fill_record", "record"]


# A tensorclass ``cls`` brings ``cls._fields`` (declaration order), ``cls._fieldset``, ``cls._ordered``
# (declared in canonical order), ``cls._defaults`` and, per field in declaration order, a check
# ``(name, accepted, hint, takes_tensor)``: the types the field takes (None: any), its annotation,
# and whether it takes a plain tensor.

STATIC_TYPES = (str, int, float, bool, type(None), enum.Enum)
_Tensor = torch.Tensor
_DATA = (torch.Tensor, Node)
Check = tuple[str, "tuple[type, ...] | None", Any, bool]


def bind(cls: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The value of every field of ``cls`` from a constructor's arguments: by position in declaration
    order, by name, else its default; FieldError naming an unknown, repeated or missing field."""
    fields = cls._fields
    if len(args) > len(fields):
        raise FieldError(f"{cls.__name__} takes {len(fields)} fields {list(fields)}, got {len(args)} positional values")
    values = dict(zip(fields, args))
    for name, value in kwargs.items():
        if name not in fields:
            raise FieldError(f"{cls.__name__} has no field {name!r}; its fields are {list(fields)}")
        if name in values:
            raise FieldError(f"{cls.__name__}: field {name!r} given twice (by position and by name)")
        values[name] = value
    if len(values) < len(fields):
        defaults = cls._defaults
        missing = [f for f in fields if f not in values and f not in defaults]
        if missing:
            raise FieldError(f"{cls.__name__}: missing field{'s' if len(missing) > 1 else ''} {missing}")
        for f in fields:
            if f not in values:
                values[f] = defaults[f]
    return values


def hint_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def field_value(cls: Any, name: str, value: Any, accepted: tuple[type, ...] | None, hint: Any) -> tuple[Any, Any]:
    """``(entry for the inner node, None)`` for a data value (a tensorclass as its node), ``(None, value)``
    for a static one; FieldError naming the field for a value of another type than ``accepted``."""
    if accepted is not None and not isinstance(value, accepted):
        raise FieldError(f"{cls.__name__}.{name} expects {hint_name(hint)}, got {type(value).__name__}")
    if isinstance(value, _DATA):
        return value, None
    if isinstance(value, Holder):  # a tensorclass
        return value._td, None
    if isinstance(value, STATIC_TYPES):
        return None, value
    raise FieldError(
        f"{cls.__name__}.{name} is a {type(value).__name__}: a field holds a tensor, a TensorDict, "
        "a tensorclass, or a static str, int, float, bool, None or enum member"
    )


def split(
    cls: Any, checks: Sequence[Check], values: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[tuple[str, Any], ...]]:
    """The data entries (in declaration order) and the static pairs of ``values``, each checked by
    :func:`field_value`. KeyError when ``values`` lacks a field (the caller binds first)."""
    data: dict[str, Any] = {}
    static: list[tuple[str, Any]] = []
    for name, accepted, hint, _ in checks:
        value = values[name]
        if accepted is None or isinstance(value, accepted):  # the common cases, told inline
            if isinstance(value, _DATA):
                data[name] = value
                continue
            if isinstance(value, STATIC_TYPES):
                static.append((name, value))
                continue
        entry, plain = field_value(cls, name, value, accepted, hint)
        if entry is not None:
            data[name] = entry
        else:
            static.append((name, plain))
    return data, tuple(static)


def fill_record(obj: Any, td: Node, static: tuple[tuple[str, Any], ...], values: Mapping[str, Any]) -> None:
    """Write the slots of the tensorclass instance ``obj``: the inner node ``td``, the static pairs and
    every field (data fields as ``td`` holds them; a nested tensorclass rewrapped when the node holds a
    new sub-node for it)."""
    object.__setattr__(obj, "_td", td)
    object.__setattr__(obj, "_static", static)
    entries = td._data
    for name, value in values.items():
        entry = entries.get(name, value)  # a static value, or the leaf or node as the inner node holds it
        if entry is not value and isinstance(value, Holder):
            entry = value if entry is value._td else value._wrap(entry)
        object.__setattr__(obj, name, entry)


def record(
    obj: Any,
    root: type[Node],
    checks_of: Callable[[Any], Sequence[Check]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    batch_size: Any,
    device: Any,
) -> None:
    """Write the slots of ``obj``, a tensorclass instance fresh from its constructor, from the
    constructor's arguments; its inner node is of type ``root``. ``checks_of(cls)`` makes the class's
    checks once (and ``cls._tensors_only``: the fields in canonical order when every field takes a
    plain tensor, else None); they are kept as ``cls._checks``.

    The fields are bound (:func:`bind`) and checked (:func:`split`), then the batch size, the device
    and the data entries as the TensorDict constructor checks them (:func:`checked_data`); a
    BatchSizeError names the class.
    """
    cls = type(obj)
    checks = cls.__dict__.get("_checks") or checks_of(cls)
    if not args and _plain_record(obj, cls, root, checks, kwargs, batch_size, device):
        return
    values = kwargs if not args and kwargs.keys() == cls._fieldset else bind(cls, args, kwargs)
    data, static = split(cls, checks, values)
    size = as_batch_size(batch_size)
    try:
        data, dev = checked_data(root, data, size, device if device is None else as_device(device), (), cls._ordered)
    except BatchSizeError as err:
        raise BatchSizeError(f"{cls.__name__}: {err}") from None
    fill_record(obj, make(root, data, size, dev), static, values)


def _plain_record(
    obj: Any, cls: Any, root: type[Node], checks: Sequence[Check], kwargs: dict[str, Any], batch_size: Any, device: Any
) -> bool:
    """:func:`record`'s common case in one pass over the fields, with the checks :func:`checked_data` makes
    inline: every field given by name; each data value a plain tensor, or an untagged node of type
    ``root`` (a tensorclass's own) with a device, whose shape starts with the batch size, all on one
    device; each other value a static one of its field's type. False for anything else (``obj``
    partly written): :func:`record` then checks from the start and reports what is wrong, in its order.
    """
    tensors_only: tuple[str, ...] | None = cls._tensors_only
    # Fields given in canonical order (what a tensors-only class keeps as its node's data) are every
    # field by name: one compare of the key tuple then stands for the compare of key sets.
    given = tuple(kwargs) if tensors_only is not None else ()
    if (given != tensors_only and kwargs.keys() != cls._fieldset) or (
        device is not None and type(device) is not torch.device
    ):
        return False
    if batch_size is None:
        size = NO_BATCH
    else:
        try:
            size = as_batch_size(batch_size)
        except (TypeError, ValueError):
            return False  # the full path reports a field's error before this one
    n = len(size)
    hi = shape_bound(size)
    cpu = device is not None and device == CPU
    found = CPU if cpu else device
    if tensors_only is not None:
        # every field takes a tensor: one loop over the values as given, and ``kwargs`` (the dict
        # __init__ got, which no caller holds) is the node's data when given in canonical order
        for name, value in kwargs.items():
            if type(value) is not _Tensor or (n and not size <= value.shape < hi):
                break
            if not (value.is_cpu if found is CPU else value.device == found):
                if found is not None:
                    return False  # to move to ``device``, or leaves on different devices
                on = value.device
                found = CPU if on == CPU else on
            object.__setattr__(obj, name, value)
        else:
            data = kwargs if given == tensors_only else {k: kwargs[k] for k in tensors_only}
            object.__setattr__(obj, "_td", make(root, data, size, found if device is None else device))
            object.__setattr__(obj, "_static", ())
            return True
        found = CPU if cpu else device
    data = {}
    static: list[tuple[str, Any]] = []
    for name, accepted, _, takes_tensor in checks:
        value = kwargs[name]
        if type(value) is _Tensor and takes_tensor:
            if n and not size <= value.shape < hi:
                return False
            if not (value.is_cpu if found is CPU else value.device == found):
                if found is not None:
                    return False
                on = value.device
                found = CPU if on == CPU else on
            data[name] = value
        elif accepted is not None and not isinstance(value, accepted):
            return False
        elif isinstance(value, STATIC_TYPES):
            static.append((name, value))
        else:
            # an untagged node or tensorclass (its sub-nodes untagged too, by the tag invariant) with a
            # device is kept as it is, as checked_data keeps it
            node = value._td if isinstance(value, Holder) else value
            if type(node) is not root:  # not a node, or a tagged one
                return False
            _, shape, held, _ = node._meta
            if held is None or (n and not size <= shape < hi):
                return False
            if found is None:
                found = CPU if held == CPU else held
            elif held != found:
                return False
            data[name] = node
        object.__setattr__(obj, name, value)
    td = make(root, data if cls._ordered else sorted_data(data), size, found if device is None else device)
    object.__setattr__(obj, "_td", td)
    object.__setattr__(obj, "_static", tuple(static))
    return True
