"""tdtree: a functional, immutable TensorDict for PyTorch, built on optree.

``tdtree.nn``, ``tdtree.optim``, ``tdtree.data``, ``tdtree.testing`` and ``tdtree.distributed`` are
imported on first use (PEP 562), so ``import tdtree`` alone reaches them and does
not pay for them.
"""

import importlib
import sys
from typing import Any

from . import control as control
from . import errors as errors
from . import tree as tree

# operations (issue 3); tdtree.stack / cat take tensorclass instances too
from ._combine import cat as cat
from ._combine import stack as stack
from ._keys import NestedKey as NestedKey
from ._node import TensorDict as TensorDict
from ._ops import where as where

# registers AdamState's rebuild with torch's safe globals, so that torch.load(weights_only=True) of an
# optimiser state works in a process that has not imported tdtree.optim (imported on first use)
from ._optstate import AdamState as _AdamState  # noqa: F401
from ._serialize import load as load
from ._serialize import save as save
from ._tags import Locked as Locked
from ._tags import Memmap as Memmap
from ._tags import Shared as Shared
from ._tags import Tag as Tag

# tensorclass (issue 7)
from ._tensorclass import TensorClass as TensorClass

# memmap and serialization (issue 5)
from ._tensorclass import load_memmap as load_memmap
from ._tensorclass import tensorclass as tensorclass

# vmap
from ._vmap import vmap as vmap
from .errors import FieldError as FieldError
from .errors import LockedError as LockedError

# tags and shared memory (issue 4)
from .errors import WriteError as WriteError

# interop with tensordict and records (issue 10)
from .interop import from_tensordict as from_tensordict
from .interop import to_tensordict as to_tensordict

__version__ = "0.1.0"

# the public names: `from tdtree import *` and the API reference (docs/api.rst) take these
__all__ = [
    "TensorDict",
    "TensorClass",
    "tensorclass",
    "NestedKey",
    "Tag",
    "Locked",
    "Shared",
    "Memmap",
    "stack",
    "cat",
    "where",
    "vmap",
    "save",
    "load",
    "load_memmap",
    "from_tensordict",
    "to_tensordict",
    "FieldError",
    "LockedError",
    "WriteError",
]

_SUBPACKAGES = ("data", "distributed", "func", "nn", "optim", "testing")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")  # binds tdtree.<name>: asked once
    raise AttributeError(f"module 'tdtree' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBPACKAGES})


# hypothesis imported first: tdtree.testing registers the strategies with it now (st.from_type(tt.TensorDict));
# imported after, hypothesis's entry-point hook registers them. Without hypothesis, nothing is imported.
if sys.modules.get("hypothesis") is not None:
    from . import testing as testing
