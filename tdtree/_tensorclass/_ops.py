"""The operations of a tensorclass: thin methods over the TensorDict operations of its inner node
(``tdtree.stack`` / ``cat`` of instances are :mod:`tdtree._combine`'s).

Each method runs the TensorDict method on ``self._td`` (tensorclass operands
unwrapped to their inner nodes) and rewraps the node it returns as the same
class, with the same static fields (a tuple of nodes: each one). Tags, errors,
and what keeps storage are therefore exactly the TensorDict's; the docstrings
say what the result keeps.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import torch

from .._base import Holder, Node, layout
from .._combine import COMBINING
from .._dataset import rows
from .._memmap import memmap
from .._tags import Locked, Memmap, Shared, Tag
from .._torch_private import through_higher_order
from ._layout import record

if TYPE_CHECKING:
    from .._node import TensorDict

__all__ = ["RecordOps"]


def _unwrap(x: Any) -> Any:
    return x._td if isinstance(x, RecordOps) else x


class RecordOps(Holder):
    """Operations of :class:`tdtree.TensorClass` (mixed in; every result is the instance's class).

    Each method takes the arguments of the :class:`TensorDict` method of the same name (instances in
    place of nodes), raises its errors and keeps or drops tags as it does; where that method returns
    a node (or a tuple of nodes), this one returns an instance (or a tuple of instances) of the class.
    """

    __slots__ = ()
    _td: TensorDict
    _static: tuple[tuple[str, Any], ...]

    def _wrap(self, out: TensorDict) -> Self:
        """``out`` (a result of an operation on the inner node) as this instance's class."""
        raise NotImplementedError

    def _wrap_each(self, outs: tuple[TensorDict, ...]) -> tuple[Self, ...]:
        return tuple(self._wrap(out) for out in outs)

    def _wrap_any(self, out: Any) -> Any:
        """A node rewrapped, a tuple of nodes each, anything else (a tensor, NotImplemented) as is."""
        if isinstance(out, Node):
            return self._wrap(out)  # type: ignore[arg-type]
        if type(out) is tuple:
            return self._wrap_each(out)
        return out

    # -- metadata and conversion ----------------------------------------------------------------

    @property
    def shape(self) -> torch.Size:
        """The batch size (``batch_size``)."""
        return self._td._meta[1]

    @property
    def ndim(self) -> int:
        """The number of batch dims."""
        return len(self._td._meta[1])

    def dim(self) -> int:
        """The number of batch dims, as ``ndim``."""
        return len(self._td._meta[1])

    def numel(self) -> int:
        """The number of batch elements (the product of ``batch_size``)."""
        return self._td._meta[1].numel()

    @property
    def tags(self) -> frozenset[Tag]:
        """The inner node's tags (``Locked``, ``Shared``, ``Memmap``)."""
        return self._td._meta[3]

    @property
    def is_locked(self) -> bool:
        """Whether the instance is tagged ``Locked``."""
        return Locked in self._td._meta[3]

    @property
    def is_shared(self) -> bool:
        """Whether the instance is tagged ``Shared``."""
        return Shared in self._td._meta[3]

    @property
    def is_memmap(self) -> bool:
        """Whether the instance is tagged ``Memmap``."""
        return Memmap in self._td._meta[3]

    @property
    def nbytes(self) -> int:
        """The bytes of the distinct storages the data fields use."""
        return self._td.nbytes

    def to_node(self) -> TensorDict:
        """The inner node: the data fields (nested tensorclasses as nodes), same leaves and tags;
        static fields are not in it. ``type(self).from_node(node, **static fields)`` gives the
        instance back; :func:`tdtree.to_tensordict` converts to the tensordict package."""
        return self._td

    def __bool__(self) -> bool:
        """Always raises RuntimeError: an instance has no single truth value (use ``all()`` / ``any()``)."""
        raise RuntimeError(
            f"the truth value of a {type(self).__name__} is ambiguous: use .all() or .any() on an instance of bools"
        )

    # -- indexing and shapes (batch dims; views keep tags) ----------------------------------------

    def __len__(self) -> builtins.int:
        """The first batch dim: a tensorclass is a record, not a mapping, and a map-style dataset of its
        rows (as tensordict's). TypeError when there are no batch dims, as ``len`` of a 0-d tensor."""
        return rows(self)

    def __getitems__(self, indices: Sequence[builtins.int]) -> Self:
        """The rows ``indices`` in one index operation (torch's ``DataLoader`` asks a dataset for a batch
        so): ``obj[indices]``, new storage, untagged."""
        return self._wrap(self._td[indices])

    def __getitem__(self, index: Any) -> Self:
        """The batch elements at ``index`` (torch's indexing on the batch dims); views keep tags,
        index tensors and masks copy and drop them. Fields are read as attributes."""
        if type(index) is str or (type(index) is tuple and index and type(index[0]) is str):
            raise TypeError(f"{type(self).__name__} is indexed over its batch dims; read a field as obj.{index!s}")
        return self._wrap(self._td[index])

    def view(self, *shape: Any) -> Self:
        """The batch dims viewed as ``shape``; keeps tags."""
        return self._wrap(self._td.view(*shape))

    def reshape(self, *shape: Any) -> Self:
        """The batch dims reshaped to ``shape``; keeps tags exactly when every leaf is a view."""
        return self._wrap(self._td.reshape(*shape))

    def permute(self, *dims: Any) -> Self:
        """The batch dims reordered; keeps tags."""
        return self._wrap(self._td.permute(*dims))

    def transpose(self, dim0: int, dim1: int) -> Self:
        """Batch dims ``dim0`` and ``dim1`` swapped; keeps tags."""
        return self._wrap(self._td.transpose(dim0, dim1))

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Self:
        """Without batch dims of size 1; keeps tags."""
        return self._wrap(self._td.squeeze(dim))

    def unsqueeze(self, dim: int) -> Self:
        """With a batch dim of size 1 at ``dim``; keeps tags."""
        return self._wrap(self._td.unsqueeze(dim))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Self:
        """Batch dims ``start_dim``..``end_dim`` merged; keeps tags when the leaves are views."""
        return self._wrap(self._td.flatten(start_dim, end_dim))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Self:
        """Batch dim ``dim`` split into ``sizes``; keeps tags."""
        return self._wrap(self._td.unflatten(dim, sizes))

    def expand(self, *shape: Any) -> Self:
        """The batch dims broadcast to ``shape``; keeps tags."""
        return self._wrap(self._td.expand(*shape))

    def unbind(self, dim: int = 0) -> tuple[Self, ...]:
        """One instance per index along batch dim ``dim``; keeps tags."""
        return self._wrap_each(self._td.unbind(dim))

    def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Self, ...]:
        """Instances cut along batch dim ``dim`` as ``torch.split`` does; keeps tags."""
        return self._wrap_each(self._td.split(split_size_or_sections, dim))

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]:
        """At most ``chunks`` instances along batch dim ``dim``; keeps tags."""
        return self._wrap_each(self._td.chunk(chunks, dim))

    # -- maps, arithmetic and reductions (new storage: tags dropped) ------------------------------

    def apply(self, fn: Callable[..., torch.Tensor], *others: Any, batch_size: Any = None) -> Self:
        """``fn(leaf, *others' leaves)`` at every leaf (others: instances or nodes, paired by key);
        tags by the rule."""
        out = self._td.apply(fn, *map(_unwrap, others), batch_size=batch_size)
        return self._wrap(out)

    def named_apply(self, fn: Callable[..., torch.Tensor], *others: Any, batch_size: Any = None) -> Self:
        """``fn(key, leaf, *others' leaves)`` at every leaf, key as the inner node's nested key (a field
        name, then the keys below it); tags by the rule."""
        out = self._td.named_apply(fn, *map(_unwrap, others), batch_size=batch_size)
        return self._wrap(out)

    def __add__(self, other: Any) -> Self:
        """``self + other`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap_any(self._td.__add__(_unwrap(other)))

    def __radd__(self, other: Any) -> Self:
        """``other + self`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__radd__(_unwrap(other)))

    def __sub__(self, other: Any) -> Self:
        """``self - other`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap_any(self._td.__sub__(_unwrap(other)))

    def __rsub__(self, other: Any) -> Self:
        """``other - self`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__rsub__(_unwrap(other)))

    def __mul__(self, other: Any) -> Self:
        """``self * other`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap_any(self._td.__mul__(_unwrap(other)))

    def __rmul__(self, other: Any) -> Self:
        """``other * self`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__rmul__(_unwrap(other)))

    def __truediv__(self, other: Any) -> Self:
        """``self / other`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap_any(self._td.__truediv__(_unwrap(other)))

    def __rtruediv__(self, other: Any) -> Self:
        """``other / self`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__rtruediv__(_unwrap(other)))

    def __floordiv__(self, other: Any) -> Self:
        """``self // other`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap_any(self._td.__floordiv__(_unwrap(other)))

    def __rfloordiv__(self, other: Any) -> Self:
        """``other // self`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__rfloordiv__(_unwrap(other)))

    def __mod__(self, other: Any) -> Self:
        """``self % other`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap_any(self._td.__mod__(_unwrap(other)))

    def __rmod__(self, other: Any) -> Self:
        """``other % self`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__rmod__(_unwrap(other)))

    def __rpow__(self, other: Any) -> Self:
        """``other ** self`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__rpow__(_unwrap(other)))

    def __pow__(self, other: Any) -> Self:
        """``self ** other`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap_any(self._td.__pow__(_unwrap(other)))

    def __neg__(self) -> Self:
        """``-self`` leaf by leaf; drops tags."""
        return self._wrap(self._td.__neg__())

    def __abs__(self) -> Self:
        """``abs(self)`` leaf by leaf; drops tags."""
        return self._wrap(self._td.__abs__())

    # Comparisons return instances of bools, as the node's do; hashing stays by identity.
    __hash__ = object.__hash__

    def __eq__(self, other: Any) -> Self:  # type: ignore[override]
        """An instance of bools, ``self == other`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__eq__(_unwrap(other)))

    def __ne__(self, other: Any) -> Self:  # type: ignore[override]
        """An instance of bools, ``self != other`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__ne__(_unwrap(other)))

    def __lt__(self, other: Any) -> Self:
        """An instance of bools, ``self < other`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__lt__(_unwrap(other)))

    def __le__(self, other: Any) -> Self:
        """An instance of bools, ``self <= other`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__le__(_unwrap(other)))

    def __gt__(self, other: Any) -> Self:
        """An instance of bools, ``self > other`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__gt__(_unwrap(other)))

    def __ge__(self, other: Any) -> Self:
        """An instance of bools, ``self >= other`` leaf by leaf; drops tags."""
        return self._wrap_any(self._td.__ge__(_unwrap(other)))

    def exp(self) -> Self:
        """``torch.exp`` of every leaf; drops tags."""
        return self._wrap(self._td.exp())

    def log(self) -> Self:
        """``torch.log`` of every leaf; drops tags."""
        return self._wrap(self._td.log())

    def sqrt(self) -> Self:
        """``torch.sqrt`` of every leaf; drops tags."""
        return self._wrap(self._td.sqrt())

    def neg(self) -> Self:
        """``torch.neg`` of every leaf; drops tags."""
        return self._wrap(self._td.neg())

    def abs(self) -> Self:
        """``torch.abs`` of every leaf; drops tags."""
        return self._wrap(self._td.abs())

    def sigmoid(self) -> Self:
        """``torch.sigmoid`` of every leaf; drops tags."""
        return self._wrap(self._td.sigmoid())

    def tanh(self) -> Self:
        """``torch.tanh`` of every leaf; drops tags."""
        return self._wrap(self._td.tanh())

    def sign(self) -> Self:
        """``torch.sign`` of every leaf; drops tags."""
        return self._wrap(self._td.sign())

    def pow(self, exponent: Any) -> Self:
        """``self ** exponent`` leaf by leaf (an instance, node, tensor or number); drops tags."""
        return self._wrap(self._td.pow(_unwrap(exponent)))

    def clamp(self, min: Any = None, max: Any = None) -> Self:  # noqa: A002
        """``torch.clamp(leaf, min, max)`` for every leaf; drops tags."""
        return self._wrap(self._td.clamp(min, max))

    def detach(self) -> Self:
        """Every leaf detached from autograd (``Tensor.detach``); the storage is kept, and so are the tags."""
        return self._wrap(self._td.detach())

    def where(self, condition: Any, other: Any) -> Self:
        """Self where ``condition`` holds, else ``other`` (an instance, node, tensor or number)."""
        return self._wrap(self._td.where(_unwrap(condition), _unwrap(other)))

    def sum(self, dim: Any = None, keepdim: builtins.bool = False) -> Self:
        """Sums over batch dims ``dim`` (None: all); drops tags."""
        return self._wrap(self._td.sum(dim, keepdim))

    def mean(self, dim: Any = None, keepdim: builtins.bool = False) -> Self:
        """Means over batch dims ``dim`` (None: all); drops tags."""
        return self._wrap(self._td.mean(dim, keepdim))

    def amax(self, dim: Any = None, keepdim: builtins.bool = False) -> Self:
        """Maxima over batch dims ``dim`` (None: all); drops tags."""
        return self._wrap(self._td.amax(dim, keepdim))

    def amin(self, dim: Any = None, keepdim: builtins.bool = False) -> Self:
        """Minima over batch dims ``dim`` (None: all); drops tags."""
        return self._wrap(self._td.amin(dim, keepdim))

    def max(self, dim: Any = None, keepdim: builtins.bool = False) -> Any:
        """No dim: maxima over all batch dims (as amax); with dim: ``torch.return_types.max`` of two instances."""
        return self._extreme(self._td.max(dim, keepdim))

    def min(self, dim: Any = None, keepdim: builtins.bool = False) -> Any:
        """No dim: minima over all batch dims (as amin); with dim: ``torch.return_types.min`` of two instances."""
        return self._extreme(self._td.min(dim, keepdim))

    def _extreme(self, out: Any) -> Any:
        return type(out)(self._wrap_each(out)) if isinstance(out, tuple) else self._wrap(out)

    def norm(self, p: builtins.float = 2.0) -> Self:
        """Each leaf's vector p-norm over all its elements, 0-dim fields, batch_size (); drops tags."""
        return self._wrap(self._td.norm(p))

    def all(self, dim: Any = None, keepdim: builtins.bool = False) -> Any:
        """No di: one 0-dim bool tensor; with dim: an instance of bools."""
        return self._wrap_any(self._td.all(dim, keepdim))

    def any(self, dim: Any = None, keepdim: builtins.bool = False) -> Any:
        """No dim: one 0-dim bool tensor; with dim: an instance of bools."""
        return self._wrap_any(self._td.any(dim, keepdim))

    # -- devices, copies, memory, tags --------------------------------------------------------------

    def to(self, *args: Any, **kwargs: Any) -> Self:
        """Every leaf through ``Tensor.to``; keeps tags when nothing changes."""
        return self._wrap(self._td.to(*args, **kwargs))

    def cpu(self) -> Self:
        """``to("cpu")``; keeps tags when already there."""
        return self._wrap(self._td.cpu())

    def cuda(self, device: Any = None, non_blocking: builtins.bool = False) -> Self:
        """``to(CUDA device)``; keeps tags when already there."""
        return self._wrap(self._td.cuda(device, non_blocking))

    def pin_memory(self) -> Self:
        """Every leaf in page-locked memory (needs an accelerator); drops tags unless already pinned."""
        return self._wrap(self._td.pin_memory())

    def clone(self, recurse: builtins.bool = True) -> Self:
        """A copy (new storage, no tags); ``recurse=False`` shares the leaves and keeps tags."""
        return self._wrap(self._td.clone(recurse))

    def contiguous(self) -> Self:
        """Every leaf contiguous; keeps tags when every leaf already is."""
        return self._wrap(self._td.contiguous())

    def share_memory(self) -> Self:
        """A copy in shared memory, tagged ``{Shared, Locked}`` (the input is unchanged)."""
        return self._wrap(self._td.share_memory())

    def memmap(self, prefix: Any, existsok: builtins.bool = False) -> Self:
        """An equal instance with leaves mapped from files under ``prefix``, tagged ``{Memmap, Locked}``.
        The directory records the class and static fields: ``tdtree.load_memmap(prefix)`` gives this
        class back (only a tensorclass made in this process is accepted; nothing is imported)."""
        out = memmap(self._td, prefix, existsok, record=record(layout(self)))
        return self._wrap(out)

    def memmap_like(self, prefix: Any, existsok: builtins.bool = False) -> Self:
        """An instance of this one's class, static fields and data shapes and dtypes, memmapped under
        ``prefix`` and holding zeros: the files are created at their final size, no value passing
        through memory (data fields may be meta tensors or expanded views). Tagged ``{Memmap, Locked}``;
        fill it in place with ``obj.at[i:j].set_(chunk)``; ``tdtree.load_memmap(prefix)`` gives the
        class back."""
        out = memmap(self._td, prefix, existsok, record=record(layout(self)), values=False)
        return self._wrap(out)

    def lock(self) -> Self:
        """The same leaves, tagged ``Locked`` too."""
        return self._wrap(self._td.lock())

    def unlock(self) -> Self:
        """The same leaves without ``Locked``."""
        return self._wrap(self._td.unlock())

    def zero_(self) -> Self:
        """This instance, after zeroing every leaf in place."""
        self._td.zero_()
        return self

    def copy_(self, other: Any) -> Self:
        """This instance, after copying every leaf of ``other`` (an instance or node with the same keys) in."""
        self._td.copy_(_unwrap(other))
        return self

    def update_(self, other: Any) -> Self:
        """This instance, after writing ``other``'s values (an instance, node or mapping by field and
        key) into the existing leaves, broadcast; tags kept."""
        self._td.update_(_unwrap(other))
        return self

    def state_dict(self) -> dict[str, Any]:
        """Nested plain dicts of the tensor fields' own leaves (torch's ``Stateful`` protocol, as a node's)."""
        return self._td.state_dict()

    def load_state_dict(self, state_dict: Any) -> Self:
        """This instance, after writing ``state_dict`` (every tensor field, nested as :meth:`state_dict`
        gives it) into the leaves in place; tags kept."""
        self._td.load_state_dict(state_dict)
        return self

    def fill_(self, key: Any, value: Any) -> Self:
        """This instance, after filling the data field (or the leaf below it) at ``key`` with ``value``."""
        self._td.fill_(key, value)
        return self

    @property
    def at(self) -> RecordAt[Self]:
        """``obj.at[idx].set(v)``: a new instance with ``v`` (an instance or node) written at batch index
        ``idx`` (drops tags; refused when Locked); ``obj.at[idx].set_(v)``: writes in place and returns
        ``obj`` (keeps tags); ``obj.at[idx].get()``: ``obj[idx]``."""
        return RecordAt(self)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """``torch.stack``/``cat`` of instances, ``torch.zeros_like`` & co., and ``tensor OP instance``:
        the node's answer rewrapped; a higher-order operator (only dynamo hands one here) goes back to
        torch with the instances themselves; other functions decline."""
        combine = COMBINING.get(func)
        if combine is not None:
            return combine(*args, **(kwargs or {}))
        passed = through_higher_order(func, args, kwargs)  # the operator calls its body with the instances
        if passed is not NotImplemented:
            return passed
        template = next((a for a in args if isinstance(a, RecordOps)), None)
        if template is None:
            return NotImplemented
        out = func(*(_unwrap(a) for a in args), **(kwargs or {}))
        return template._wrap_any(out)

    # float/int/bool shadow the builtins for annotations below them, so they come last.
    def double(self) -> Self:
        """``to(torch.float64)``; keeps tags when already so."""
        return self._wrap(self._td.double())

    def bfloat16(self) -> Self:
        """``to(torch.bfloat16)``; keeps tags when already so."""
        return self._wrap(self._td.bfloat16())

    def half(self) -> Self:
        """``to(torch.float16)``; keeps tags when already so."""
        return self._wrap(self._td.half())

    def long(self) -> Self:
        """``to(torch.int64)``; keeps tags when already so."""
        return self._wrap(self._td.long())

    def float(self) -> Self:
        """``to(torch.float32)``; keeps tags when already so."""
        return self._wrap(self._td.float())

    def int(self) -> Self:
        """``to(torch.int32)``; keeps tags when already so."""
        return self._wrap(self._td.int())

    def bool(self) -> Self:
        """``to(torch.bool)``; keeps tags when already so."""
        return self._wrap(self._td.bool())


R = TypeVar("R", bound=RecordOps)


class RecordAtIndex(Generic[R]):
    """``obj.at[idx]`` of a tensorclass instance: the node's scatter operations on its inner node."""

    __slots__ = ("_obj", "_index")

    def __init__(self, obj: R, index: Any) -> None:
        self._obj = obj
        self._index = index

    def get(self) -> R:
        """``obj[idx]``."""
        return self._obj[self._index]

    def set(self, value: Any) -> R:
        """A new instance with ``value`` at ``idx``; refused on Locked instances; tags dropped."""
        return self._obj._wrap(self._obj._td.at[self._index].set(_unwrap(value)))

    def set_(self, value: Any) -> R:
        """Write ``value`` at ``idx`` in place; returns the instance."""
        self._obj._td.at[self._index].set_(_unwrap(value))
        return self._obj


class RecordAt(Generic[R]):
    """``obj.at`` of a tensorclass instance: index it (``obj.at[idx]``) for the scatter operations."""

    __slots__ = ("_obj",)

    def __init__(self, obj: R) -> None:
        self._obj = obj

    def __getitem__(self, index: Any) -> RecordAtIndex[R]:
        """The scatter operations at batch index ``index``."""
        return RecordAtIndex(self._obj, index)
