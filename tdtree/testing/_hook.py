"""hypothesis's entry point for tdtree, in a module that does not import hypothesis.

hypothesis runs its entry-point hooks at the end of its own import. A hook in a
module that imports hypothesis at its top would run on that module half-imported
whenever the module was imported first (``import tdtree.testing._register``
before hypothesis), and fail.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["_hypothesis_setup_hook"]

_REGISTER = "tdtree.testing._register"


def _hypothesis_setup_hook() -> None:
    """Register tdtree's strategies with hypothesis (``st.from_type(tt.TensorDict)``); returns None."""
    module = sys.modules.get(_REGISTER)
    if module is not None and not hasattr(module, "register_strategies"):
        # _register is importing hypothesis right now; tdtree.testing registers once that import is done
        return
    # imported here: _register imports hypothesis, whose import is what runs this hook
    importlib.import_module(_REGISTER).register_strategies()
