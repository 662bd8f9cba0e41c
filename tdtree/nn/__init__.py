"""Functional training with nodes: parameters as nodes, modules that read and write nodes.

``from_module(module)`` gives a module's parameters and buffers as a node,
``functional_call(module, params, *args)`` runs the module with them, and
``torch.func.grad`` / ``vmap`` / ``torch.compile`` work over both;
``to_module(params, module)`` writes a node back into a module and
``state_dict(params)`` gives the flat dict of dotted names torch's own
functions ask for.
``TDModule`` and ``TDSequential`` wrap modules to read and write node keys.
"""

from ._modules import TDModule as TDModule
from ._modules import TDSequential as TDSequential
from ._params import from_module as from_module
from ._params import functional_call as functional_call
from ._params import state_dict as state_dict
from ._params import to_module as to_module

__all__ = ["TDModule", "TDSequential", "from_module", "functional_call", "state_dict", "to_module"]
