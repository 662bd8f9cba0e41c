"""Registration with hypothesis: ``st.from_type(tt.TensorDict)`` and ``st.from_type(MyTensorClass)``.

hypothesis runs every function of the ``hypothesis`` entry-point group when it
is imported; tdtree's (in pyproject.toml) is ``_tdtree_plugins.strategies.setup``,
which registers when tdtree is imported already; ``import tdtree`` registers when
hypothesis is (so installing tdtree is enough, in either order). Importing
``tdtree.testing``'s strategies registers too, for checkouts not installed.

The registration may run while hypothesis is finishing its import, started by one
of the strategy modules (``import tdtree.testing._strategies`` before hypothesis):
so this module imports none of them, and each registered strategy is resolved
when hypothesis first draws from the type (``st.register_type_strategy`` with a
function of the type).

What each type draws:

* ``TensorDict``: any node, tagged or not (``tensordicts(tags=True)``): an
  annotation ``tt.TensorDict`` accepts every tagged node too.
* ``TensorDict[Shared]`` and the other reachable tagged types: nodes carrying
  at least those tags, as ``isinstance`` reads the type.
* each tensorclass, the moment its class is made: ``tensorclasses(cls)``
  (untagged). A strategy the user registers later for the class wins.
"""

from __future__ import annotations

import importlib
from typing import Any

from hypothesis import strategies as st

from .. import TensorDict
from .._tensorclass._pytree import watch
from ._tagsets import TAG_SETS

__all__ = ["register_strategies"]

_done: list[bool] = []


def _module(name: str) -> Any:
    # imported when hypothesis first draws a registered type, not here (see the module doc)
    return importlib.import_module(f"{__package__}.{name}")


def _at_least(tags: frozenset) -> Any:
    sets = [s for s in TAG_SETS if s >= tags]
    return lambda _: _module("_strategies").tensordicts(tags=sets)


def _tensorclasses(cls: type) -> Any:
    return _module("_tcstrategies").tensorclasses(cls)


def register_strategies() -> None:
    """Register the strategies with ``st.register_type_strategy`` (once per process; later calls return).

    Afterwards ``st.from_type(tt.TensorDict)`` draws :func:`tensordicts`, ``st.from_type(TensorDict[Locked])``
    nodes carrying at least those tags, and ``st.from_type(MyTensorClass)`` :func:`tensorclasses` (also for
    tensorclasses defined later). Returns None.
    """
    if _done:
        return
    _done.append(True)
    st.register_type_strategy(TensorDict, _at_least(frozenset()))
    for tags in TAG_SETS:
        if tags:
            st.register_type_strategy(TensorDict[tuple(tags)], _at_least(tags))  # type: ignore[misc]
    watch(lambda cls: st.register_type_strategy(cls, _tensorclasses))
