"""Testing node code: assertions, hypothesis strategies, laws and pytest fixtures.

* ``assert_equal`` / ``assert_close``: compare nodes, tensorclasses and tensors; messages name the key.
* strategies: ``tensordicts``, ``tensorclasses``, ``same_structure``, ``batch_sizes``, ``nested_keys``;
  ``st.from_type(tt.TensorDict)`` and ``st.from_type(MyTensorClass)`` work once they are registered
  (by hypothesis's entry point when tdtree is installed, or on first use of a strategy here).
* laws: ``check_pure``, ``check_tags``, ``check_compiles``, ``check_vmap``, ``check_grad`` run a
  hypothesis test over a user's function; :mod:`tdtree.testing.laws` also has one-example forms.
* fixtures: :mod:`tdtree.testing.fixtures` (the ``pytest11`` entry point).
* constants: ``DEFAULT_DTYPES`` (float32, int64, bool: what ``tensordicts`` draws by default),
  ``ALL_DTYPES`` (those and float16, bfloat16, float64, complex64, int8, uint8) and ``TAG_SETS``
  (every tag set a node reaches through the public API).

hypothesis is needed only by the strategies and laws, imported on first use,
so the assertions work without it (``pip install 'tdtree[testing]'`` installs it). When hypothesis is already imported, importing
this package registers the strategies at once (for checkouts whose entry points
are not installed).
"""

import importlib
import sys
from typing import Any

from ._assert import assert_close as assert_close
from ._assert import assert_equal as assert_equal
from ._values import ALL_DTYPES as ALL_DTYPES
from ._values import DEFAULT_DTYPES as DEFAULT_DTYPES
from ._values import available_devices as available_devices

__all__ = [
    "assert_close",
    "assert_equal",
    "ALL_DTYPES",
    "DEFAULT_DTYPES",
    "available_devices",
    "batch_sizes",
    "nested_keys",
    "tensordicts",
    "same_structure",
    "tensorclasses",
    "TAG_SETS",
    "register_strategies",
    "check_pure",
    "check_tags",
    "check_compiles",
    "check_vmap",
    "check_grad",
]

_LAZY = {
    "batch_sizes": "_strategies",
    "nested_keys": "_strategies",
    "tensordicts": "_strategies",
    "same_structure": "_strategies",
    "tensorclasses": "_tcstrategies",
    "TAG_SETS": "_tagsets",
    "register_strategies": "_register",
    "check_pure": "laws",
    "check_tags": "laws",
    "check_compiles": "laws",
    "check_vmap": "laws",
    "check_grad": "laws",
}


def _with_strategies() -> None:
    """Import the strategies and register them with hypothesis (once); without hypothesis, an ImportError
    that says ``pip install 'tdtree[testing]'``."""
    # imported on first use, as the lazy names below: these modules import hypothesis, an optional dependency
    importlib.import_module(f"{__name__}._requires")
    importlib.import_module(f"{__name__}._register").register_strategies()


if sys.modules.get("hypothesis") is not None:
    _with_strategies()


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tdtree.testing' has no attribute {name!r}")
    _with_strategies()
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
