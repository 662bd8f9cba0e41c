"""Registration with hypothesis: ``st.from_type(tt.TensorDict)`` and ``st.from_type(MyTensorClass)``.

hypothesis runs every function of the ``hypothesis`` entry-point group when it
is imported; tdtree's (in pyproject.toml) is :func:`tdtree.testing._hook._hypothesis_setup_hook`, so
installing tdtree is enough. Importing ``tdtree.testing``'s strategies
registers too, for installs whose entry points are stale.

What each type draws:

* ``TensorDict``: any node, tagged or not (``tensordicts(tags=True)``): an
  annotation ``tt.TensorDict`` accepts every tagged node too.
* ``TensorDict[Shared]`` and the other reachable tagged types: nodes carrying
  at least those tags, as ``isinstance`` reads the type.
* each tensorclass, the moment its class is made: ``tensorclasses(cls)``
  (untagged). A strategy the user registers later for the class wins.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .. import TensorDict
from .._tensorclass._pytree import watch
from ._strategies import tensordicts
from ._tagging import TAG_SETS
from ._tcstrategies import tensorclasses

__all__ = ["register_strategies"]

_done: list[bool] = []


def _at_least(tags: frozenset) -> Any:
    sets = [s for s in TAG_SETS if s >= tags]
    return lambda _: tensordicts(tags=sets)


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
    watch(lambda cls: st.register_type_strategy(cls, tensorclasses))
