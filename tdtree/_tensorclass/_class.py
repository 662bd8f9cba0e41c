"""Tensorclasses: typed, frozen records of tensors that behave like nodes.

A tensorclass instance holds

* ``_td``: a :class:`TensorDict` of its *data* fields (tensors, TensorDicts,
  and the inner TensorDicts of nested tensorclasses), which carries the batch
  size, device and tags;
* ``_static``: a tuple of ``(name, value)`` pairs for its *static* fields
  (``str``, ``int``, ``float``, ``bool``, ``None`` or an enum member), which
  live in the pytree metadata, never among the leaves;
* one slot per field with the field's value (a nested tensorclass as its
  instance), so reading a field is a slot read.

Whether a field is data or static is decided by its value, so an optional
tensor field (``x: torch.Tensor | None = None``) is static while None.
Operations are thin methods (:mod:`tdtree._tensorclass._ops`) that run the TensorDict
operation on ``_td`` and rewrap the result with :func:`rewrap`: the tag rule
and every other behaviour are the TensorDict's.

``replace`` (:func:`replaced`) edits the inner node as ``set`` does; its common case (plain
tensors for tensor fields of an untagged instance) is checked inline and copies the other slots
with code made for the class.

The pytree registration and :func:`rewrap` are in :mod:`tdtree._tensorclass._pytree`.
"""

from __future__ import annotations

import keyword
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, dataclass_transform

import torch

from .._base import Layout, layout, with_meta
from .._fields import STATIC_TYPES, Check, bind, field_value, fill_record, hint_name, record, split
from .._node import TensorDict
from .._repr import record_repr
from .._tags import Locked, tag_rule
from .._torch_private import substitute_in_graph
from .._validate import CPU
from ..errors import BatchSizeError, FieldError, LockedError
from ._ops import RecordOps
from ._pytree import register, rewrap

__all__ = ["TensorClass", "TensorClassMeta", "tensorclass", "from_layout"]

_Tensor = torch.Tensor


def _field(*, default: Any = None, kw_only: bool = False) -> Any:
    """The field specifier the type checker reads for ``batch_size`` and ``device``; never called."""
    raise NotImplementedError


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return annotation is ClassVar or typing.get_origin(annotation) is ClassVar


@dataclass_transform(frozen_default=True, field_specifiers=(_field,))
class TensorClassMeta(type):
    """Makes every class it builds a tensorclass: fields from the annotations, one slot each,
    registered with both pytree registries."""

    _fields: tuple[str, ...]
    _fieldset: frozenset[str]
    _ordered: bool  # the fields are declared in canonical (sorted) order
    _tensors_only: tuple[str, ...] | None  # the fields sorted when every one takes a plain tensor (first use)
    _defaults: dict[str, Any]

    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kwargs: Any) -> TensorClassMeta:
        inherited: list[str] = []
        defaults: dict[str, Any] = {}
        for base in reversed(bases):
            for f in getattr(base, "_fields", ()):
                if f not in inherited:
                    inherited.append(f)
            defaults.update(getattr(base, "_defaults", {}))
        own = [n for n, a in ns.get("__annotations__", {}).items() if not _is_classvar(a)]
        tc_bases = [b for b in bases if isinstance(b, TensorClassMeta)]
        for f in own:
            if f.startswith("_"):
                raise FieldError(f"{name}: field {f!r} starts with an underscore; rename the field")
            if any(hasattr(b, f) and f not in b._fields for b in tc_bases):
                raise FieldError(
                    f"{name}: field {f!r} is the name of a tensorclass attribute or method; rename the field"
                )
            if f in ns:
                defaults[f] = ns.pop(f)
        fields = inherited + [f for f in own if f not in inherited]
        seen_default = None
        for f in fields:
            if f in defaults:
                seen_default = f
            elif seen_default is not None:
                raise FieldError(f"{name}: field {f!r} without a default follows field {seen_default!r} with one")
        ns["__slots__"] = (*ns.get("__slots__", ()), *(f for f in own if f not in inherited))
        cls = super().__new__(mcls, name, bases, ns, **kwargs)
        cls._fields = tuple(fields)
        cls._fieldset = frozenset(fields)
        cls._ordered = fields == sorted(fields)
        cls._defaults = defaults
        if tc_bases:  # TensorClass itself is no tensorclass
            register(cls)
        return cls


# -- construction ---------------------------------------------------------------------------


def _resolve_hints(cls: Any) -> dict[str, Any]:
    """The fields' annotations as objects; a field whose annotation cannot be resolved maps to Any."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        globalns = dict(vars(module)) if module is not None else {}
        localns = {cls.__name__: cls, klass.__name__: klass}
        for name, ann in klass.__dict__.get("__annotations__", {}).items():
            if name not in cls._fields:
                continue
            if isinstance(ann, str):
                try:
                    ann = eval(ann, globalns, localns)  # noqa: S307 - annotations of the user's own class
                except Exception:
                    ann = Any
            hints[name] = ann
    return hints


def _hints(cls: Any) -> dict[str, Any]:
    hints = cls.__dict__.get("_hints")
    if hints is None:
        hints = _resolve_hints(cls)
        type.__setattr__(cls, "_hints", hints)
    return hints


def _accepted(hint: Any) -> tuple[type, ...] | None:
    """The types a field annotated ``hint`` takes (for one isinstance), or None for no check."""
    if hint is None or hint is type(None):
        return (type(None),)
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        parts = [_accepted(arg) for arg in typing.get_args(hint)]
        return None if any(p is None for p in parts) else tuple(t for p in parts for t in p)  # type: ignore[union-attr]
    if hint is Any or hint is object or not isinstance(hint, type):
        return None  # Any, generics, literals, type variables: the kind check still applies
    return (float, int) if hint is float else (hint,)


def _checks(cls: Any) -> tuple[Check, ...]:
    """Per field: its name, the types it takes, its annotation and whether it takes a plain tensor
    (the checks of :func:`tdtree._fields.record`); made on first construction."""
    checks = cls.__dict__.get("_checks")
    if checks is None:
        hints = _hints(cls)
        checks = tuple(
            (name, accepted, hints.get(name, Any), accepted is None or issubclass(torch.Tensor, accepted))
            for name, accepted in ((name, _accepted(hints.get(name, Any))) for name in cls._fields)
        )
        type.__setattr__(cls, "_checks", checks)
        type.__setattr__(cls, "_tensors_only", tuple(sorted(cls._fields)) if all(c[3] for c in checks) else None)
        # replace's copy is made here too: compiled code guards on the keys of the class's __dict__, so
        # an attribute added at a later first use (an eager replace) would recompile every compiled caller
        _swap(cls)
    return checks  # type: ignore[no-any-return]


@tag_rule
def _rebuilt(old: TensorDict, data: dict[str, Any]) -> TensorDict:
    # The old node is the rule's input: the result keeps its tags when every leaf is one it had.
    return TensorDict(data, old._meta[1], old._meta[2])


def _slot(cls: Any, name: str) -> Any:
    """The slot descriptor of ``name`` in ``cls`` (declared by the class or a base)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name)
        if isinstance(found, types.MemberDescriptorType):
            return found
    raise AttributeError(f"{cls.__name__} has no slot {name!r}")


def _swap(cls: Any) -> tuple[frozenset[str], Callable[..., Any]]:
    """For :func:`replaced`'s common case: the fields of ``cls`` that take a plain tensor, and a function
    of ``(tc, changes, td, static)`` making an instance with ``td``, ``static`` and each field's value
    from ``changes``, else ``tc``'s; made with the class's checks (:func:`_checks`), kept as ``cls._swap``."""
    swap = cls.__dict__.get("_swap")
    if swap is None:
        # Straight-line code, one line per field, with no loop over the names; each slot is written
        # through its descriptor's __set__, which costs less than object.__setattr__ (that call packs
        # its arguments into a tuple). A field is read as an attribute when its name can be spelled as
        # one (always, for fields declared in a class body).
        namespace: dict[str, Any] = {
            "_new": object.__new__,
            "_get": getattr,
            "_cls": cls,
            "_set_td": _slot(cls, "_td").__set__,
            "_set_static": _slot(cls, "_static").__set__,
        }
        lines = [
            "def _copy(tc, changes, td, static):",
            "    obj = _new(_cls)",
            "    _set_td(obj, td)",
            "    _set_static(obj, static)",
        ]
        for i, name in enumerate(cls._fields):
            namespace[f"_set{i}"] = _slot(cls, name).__set__
            read = f"tc.{name}" if name.isidentifier() and not keyword.iskeyword(name) else f"_get(tc, {name!r})"
            lines.append(f"    _set{i}(obj, changes[{name!r}] if {name!r} in changes else {read})")
        lines.append("    return obj")
        exec("\n".join(lines), namespace)  # noqa: S102 - source built above from the class's field names
        swap = (frozenset(c[0] for c in _checks(cls) if c[3]), namespace["_copy"])
        type.__setattr__(cls, "_swap", swap)
    return swap  # type: ignore[no-any-return]


def replaced(tc: Any, changes: dict[str, Any]) -> Any:
    """``tc`` with the fields in ``changes`` replaced (each checked as in the constructor, the others
    not again); the inner node is edited as ``set``/``exclude`` edit it, so tags follow the rule.
    LockedError for a Locked instance."""
    cls = type(tc)
    td = tc._td
    _, size, device, tags = meta = td._meta
    if tags or device is None:
        return _edited(tc, cls, td, changes)
    # The common case, told inline: an untagged node with a device (no tag to decide, no device to
    # settle), and every change a plain tensor for a data field that takes one, fitting the batch size,
    # on that device: ``set`` would keep it as it is, and the keys and static fields stay the same.
    takes, copy = cls.__dict__.get("_swap") or _swap(cls)
    old = td._data
    n = len(size)
    # a shape s fits when size <= s < hi, as _validate.checked_data tells it
    hi = (size[0], size[1] + 1) if n == 2 else (size[0] + 1,) if n == 1 else (*size[:-1], size[-1] + 1) if n else ()
    cpu = device is CPU
    for name, value in changes.items():
        if (
            type(value) is not _Tensor
            or name not in old
            or name not in takes
            or (n and not size <= value.shape < hi)
            or not (value.is_cpu if cpu else value.device == device)
        ):
            return _edited(tc, cls, td, changes)
    data = old.copy()
    data.update(changes)
    return copy(tc, changes, with_meta(type(td), data, meta), tc._static)


@substitute_in_graph(replaced)
def _replaced_traced(tc: Any, changes: dict[str, Any]) -> Any:
    # Compiled code takes the general path: dynamo cannot trace the generated copy's descriptor
    # writes, and its graph holds the same tensor ops either way.
    return _edited(tc, type(tc), tc._td, changes)


def _edited(tc: Any, cls: Any, td: TensorDict, changes: dict[str, Any]) -> Any:
    """:func:`replaced` for any change: each value checked by ``field_value``, the node edited with
    ``set``/``exclude`` (their tag rule and errors)."""
    tags = td._meta[3]
    if tags and Locked in tags:
        raise LockedError("replace")
    checks = cls.__dict__.get("_checks") or _checks(cls)
    fields = cls._fields
    statics = dict(tc._static)
    for name, value in changes.items():
        if name not in cls._fieldset:
            raise FieldError(f"{cls.__name__} has no field {name!r}; its fields are {list(fields)}")
        data, static = field_value(cls, name, value, *checks[fields.index(name)][1:3])
        if data is None:
            statics[name] = static
            if name in td._data:
                td = td.exclude(name)
            continue
        statics.pop(name, None)
        try:
            td = td.set(name, data)
        except BatchSizeError as err:
            raise BatchSizeError(f"{cls.__name__}.replace: {err}") from None
    obj = object.__new__(cls)
    values = {name: changes[name] if name in changes else getattr(tc, name) for name in fields}
    fill_record(obj, td, tuple((name, statics[name]) for name in fields if name in statics), values)
    return obj


def from_node(cls: Any, td: TensorDict, static: dict[str, Any]) -> Any:
    """An instance of ``cls`` holding the entries of ``td`` as its data fields, ``static`` as the rest.

    An entry whose field is annotated with a tensorclass becomes that class (by its own
    ``from_node``); the result keeps ``td``'s tags (the same leaves).
    """
    if not isinstance(td, TensorDict):
        raise TypeError(
            f"{cls.__name__}.from_node takes a tdtree TensorDict, got {type(td).__name__}; for a "
            f"tensordict package object use tdtree.from_tensordict(td, cls={cls.__name__})"
        )
    hints = _hints(cls)
    values: dict[str, Any] = dict(static)
    for key, value in td._data.items():
        if key not in cls._fields:
            raise FieldError(
                f"{cls.__name__} has no field {key!r} (a key of the TensorDict); its fields are {list(cls._fields)}"
            )
        if key in values:
            raise FieldError(f"{cls.__name__}.from_node: field {key!r} given both in the TensorDict and by name")
        sub = _tensorclass_in(hints.get(key, Any))
        values[key] = sub.from_node(value) if sub is not None and isinstance(value, TensorDict) else value
    obj = object.__new__(cls)
    bound = bind(cls, (), values)
    data, static_pairs = split(cls, _checks(cls), bound)
    fill_record(obj, _rebuilt(td, data), static_pairs, bound)
    return obj


def _tensorclass_in(hint: Any) -> Any:
    if isinstance(hint, type) and issubclass(hint, TensorClass):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, TensorClass)]
        return found[0] if len(found) == 1 else None
    return None


# -- layouts: what a tensorclass adds to its inner node (pickle and memmap) -------------------


def from_layout(lay: Layout, td: TensorDict, error: Callable[[str], Exception]) -> Any:
    """The instance described by ``lay`` around ``td``; ``error(reason)`` makes the exception for a
    layout that does not fit the node (a corrupt file)."""
    cls, static, nested = lay
    statics, subs = dict(static), dict(nested)
    entries = td._data
    fields = cls._fields
    extra = [k for k in entries if k not in fields]
    if extra:
        raise error(f"{cls.__name__} has no field {extra[0]!r}")
    obj: Any = object.__new__(cls)
    object.__setattr__(obj, "_td", td)
    object.__setattr__(obj, "_static", tuple(static))
    for name, accepted, hint, _ in _checks(cls):
        if name in subs:
            if not isinstance(entries.get(name), TensorDict):
                raise error(f"{cls.__name__}.{name} is a nested tensorclass but the node holds no sub-node there")
            value = from_layout(subs[name], entries[name], error)
        elif name in entries:
            value = entries[name]
        elif name in statics:
            value = statics[name]
            if not isinstance(value, STATIC_TYPES):
                raise error(f"{cls.__name__}.{name} holds a {type(value).__name__}, not a static value")
        else:
            raise error(f"{cls.__name__}.{name} is missing")
        if accepted is not None and not isinstance(value, accepted):
            raise error(f"{cls.__name__}.{name} expects {hint_name(hint)}, got {type(value).__name__}")
        object.__setattr__(obj, name, value)
    return obj


def _unpickle(lay: Layout, td: TensorDict) -> Any:
    return from_layout(lay, td, lambda reason: TypeError(f"cannot unpickle a tensorclass: {reason}"))


# Pickles name this function; they were written while it lived in the module tdtree._tensorclass,
# which the package re-exports it as, so old and new pickles name the same place.
_unpickle.__module__ = "tdtree._tensorclass"


# -- the base class ---------------------------------------------------------------------------


if TYPE_CHECKING:

    class _BatchSizeField:
        def __get__(self, obj: object, owner: Any) -> torch.Size: ...
        def __set__(self, obj: object, value: int | Sequence[int] | torch.Size | None) -> None: ...

    class _DeviceField:
        def __get__(self, obj: object, owner: Any) -> torch.device | None: ...
        def __set__(self, obj: object, value: torch.device | str | None) -> None: ...


class TensorClass(RecordOps, metaclass=TensorClassMeta):
    """Base of tensorclasses: subclass it with annotated fields for a typed, frozen record.

    Args:
        *args: the fields by position (declaration order).
        **kwargs: the fields by name (defaults from the class body). Fields are tensors,
            TensorDicts, tensorclasses (data, sharing the leading ``batch_size`` dims), or static
            ``str``, ``int``, ``float``, ``bool``, ``None`` or enum members.
        batch_size, device: the data fields' leading dims (None is ``()``), and a device to move them to.

    Raises:
        FieldError: an unknown or missing field, or a value whose type does not fit the
            field's annotation (the message names the field).
        BatchSizeError: a data field's shape does not start with ``batch_size``.

    >>> import torch, tdtree as tt
    >>> class Step(tt.TensorClass):
    ...     obs: torch.Tensor
    ...     phase: str = "train"
    >>> s = Step(torch.zeros(4, 3), batch_size=[4])
    >>> s[1:].batch_size, (s + 1).obs[0], s.replace(phase="eval").phase
    (torch.Size([3]), tensor([1., 1., 1.]), 'eval')
    """

    __slots__ = ("_td", "_static")

    if TYPE_CHECKING:
        batch_size: _BatchSizeField = _field(default=None, kw_only=True)
        device: _DeviceField = _field(default=None, kw_only=True)
    else:

        def __init__(self, *args: Any, batch_size: Any = None, device: Any = None, **kwargs: Any) -> None:
            # every check is _fields.record's, the class's own checks made by _checks on first use
            record(self, TensorDict, _checks, args, kwargs, batch_size, device)

        @property
        def batch_size(self) -> torch.Size:
            return self._td._meta[1]

        @property
        def device(self) -> torch.device | None:
            return self._td._meta[2]

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError(
            f"{type(self).__name__} is frozen: obj = obj.replace({name}=...) for a new instance, "
            "or the in-place writers copy_() / zero_()"
        )

    def __delattr__(self, name: str) -> None:
        raise TypeError(f"{type(self).__name__} is frozen: fields cannot be deleted")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _unpickle, (layout(self), self._td)

    def __repr__(self) -> str:
        return record_repr(self)

    def replace(self, **fields: Any) -> typing.Self:
        """A new instance with ``fields`` replaced, checked as in the constructor; the others shared.

        Args:
            **fields: the new values, by field name.

        Returns:
            An instance of this class. Tags by the rule (kept when every leaf is one this instance had).

        Raises:
            LockedError: the instance is ``Locked`` (write in place with ``copy_`` or ``unlock()``).
            FieldError: an unknown field, or a value of the wrong type.
            BatchSizeError: a new value does not start with the batch size.
        """
        return replaced(self, fields)  # type: ignore[no-any-return]

    def _wrap(self, out: TensorDict) -> typing.Self:
        return rewrap(self, out)  # type: ignore[no-any-return]

    @classmethod
    def from_node(cls, td: TensorDict, **static: Any) -> typing.Self:
        """An instance whose data fields are ``td``'s entries (same leaves, same tags) and whose other
        fields are given by name (or defaults); the inverse of :meth:`to_node <tdtree.TensorClass.to_node>`.

        ``td`` is a tdtree :class:`TensorDict`; :func:`tdtree.from_tensordict` (``cls=``) converts from
        the tensordict package.

        Raises:
            TypeError: ``td`` is not a tdtree TensorDict (the message names ``tdtree.from_tensordict``).
            FieldError: a key of ``td`` is no field, a field is given twice or missing, or a value
                does not fit its field.
        """
        return from_node(cls, td, static)  # type: ignore[no-any-return]


TensorClass.__module__ = "tdtree"
__test__ = {"TensorClass": TensorClass}  # doctest finds its examples here (the class's module is "tdtree")


@dataclass_transform(frozen_default=True)
def tensorclass(cls: type) -> Any:
    """``@tensorclass`` on a class with annotated fields: the same class made a :class:`TensorClass`.

    Args:
        cls: a class with annotated fields, declared as for a :class:`TensorClass` subclass.

    Returns:
        A :class:`TensorClass` subclass with ``cls``'s name and body (``cls`` itself when it is one).

    Raises:
        FieldError: the class declares a field a tensorclass cannot have (the message names it).

    Untyped spelling: type checkers see the fields and the constructor, but not the methods
    the class gains; subclass :class:`TensorClass` for those.
    """
    if isinstance(cls, TensorClassMeta):
        return cls
    ns = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    bases = tuple(b for b in cls.__bases__ if b is not object)
    return TensorClassMeta(cls.__name__, (*bases, TensorClass), ns)
