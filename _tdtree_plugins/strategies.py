"""hypothesis's entry point for tdtree: registers tdtree's strategies if tdtree is imported, else nothing.

hypothesis runs its entry-point hooks at the end of its own import. Registering
needs tdtree, so the hook registers only when tdtree is imported already; when
hypothesis comes first, ``import tdtree`` registers (it imports ``tdtree.testing``
when hypothesis is imported). Either way ``st.from_type(tt.TensorDict)`` works
once both are imported, and a process that imports only hypothesis pays nothing.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["setup"]

_REGISTER = "tdtree.testing._register"


def _initializing(name: str) -> bool:
    spec = getattr(sys.modules[name], "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def setup() -> None:
    """Register tdtree's strategies with hypothesis (``st.from_type(tt.TensorDict)``) when tdtree is
    imported; returns None."""
    if "tdtree" not in sys.modules or _initializing("tdtree"):
        return  # tdtree registers at the end of its import, hypothesis being imported
    if _REGISTER in sys.modules and _initializing(_REGISTER):
        return  # _register is importing hypothesis right now; it registers once that import is done
    # imported here: the registration imports hypothesis, whose import is what runs this hook
    importlib.import_module(_REGISTER).register_strategies()
