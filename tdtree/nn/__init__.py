"""Functional training with nodes: parameters as nodes, modules that read and write nodes.

``from_module(module)`` gives a module's parameters and buffers as a node,
``functional_call(module, params, *args)`` runs the module with them, and
``torch.func.grad`` / ``vmap`` / ``torch.compile`` work over both.
``TDModule`` and ``TDSequential`` wrap modules to read and write node keys.
"""

from ._modules import TDModule as TDModule
from ._modules import TDSequential as TDSequential
from ._params import from_module as from_module
from ._params import functional_call as functional_call

__all__ = ["TDModule", "TDSequential", "from_module", "functional_call"]
