"""The tensorclass: a typed, frozen record of tensors that behaves like a node.

One floor of tdtree, in its own floors (bottom first): ``_layout`` (what an
instance adds to its inner node as a JSON record), ``_ops`` (the operations, run
on the inner :class:`TensorDict`), ``_pytree`` (pytree registration and the name
of each class), ``_class`` (the class, its metaclass and its constructor),
``_record`` (``tdtree.load_memmap``, which gives a tensorclass back when one was
memmapped).
"""

from ._class import TensorClass, TensorClassMeta, _unpickle, from_layout, tensorclass
from ._ops import RecordOps
from ._record import load_memmap

__all__ = [
    "TensorClass",
    "TensorClassMeta",
    "tensorclass",
    "from_layout",
    "_unpickle",
    "RecordOps",
    "load_memmap",
]
