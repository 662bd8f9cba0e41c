"""Parameters as nodes: :func:`from_module` and :func:`functional_call`.

A module's state becomes a node nested by sub-module path, so
``nn.Sequential(nn.Linear(3, 4))`` gives ``{"0": {"weight": ..., "bias": ...}}``
with batch_size ``()``. The node holds the module's own tensors (parameters
stay ``nn.Parameter``, buffers stay plain tensors), so nothing is copied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._base import Node, make
from .._node import TensorDict
from .._torch_private import is_compiling
from .._validate import CPU
from ..errors import KeyMismatchError, KeyNotFoundError, WriteShapeError

__all__ = ["from_module", "functional_call", "state_dict", "to_module"]

# modules torch's functional_call refuses (with its own error): they take its path
_REFUSED = (torch.jit.ScriptModule, nn.DataParallel)


_NO_BATCH = torch.Size(())


def _collect(module: nn.Module, params: bool, buffers: bool) -> TensorDict | None:
    """The node of ``module``'s tensors, or None when it and its sub-modules hold none.

    Built with ``make``, not the validating constructor: a module's tensors
    always fit batch size ``()`` and its attribute names are distinct strs. The
    device is found as ``build`` finds it (:func:`tdtree._validate.common_device`: the one
    every entry has, else None; a sub-node's None means its own leaves disagree), inline:
    a call of that helper per sub-module costs from_module about a tenth. This keeps
    ``from_module`` at a walk over the module's dicts.
    """
    data: dict[str, Any] = {}
    if params:
        for k, v in module._parameters.items():
            if v is not None:
                data[k] = v
    if buffers:
        for k, b in module._buffers.items():
            if b is not None:
                data[k] = b
    device: torch.device | None = None
    first = True
    cpu = False  # every leaf so far on the cpu: told by is_cpu, which costs less than reading a device
    for v in data.values():
        if cpu:
            if not v.is_cpu:
                device, cpu = None, False  # and None from here on: no later device equals it
        elif first:
            first = False
            cpu = v.is_cpu
            device = CPU if cpu else v.device
        elif v.device != device:
            device = None
    for name, sub in module._modules.items():
        if sub is not None:
            child = _collect(sub, params, buffers)
            if child is not None:
                data[name] = child
                if first:
                    device, first = child._meta[2], False
                elif child._meta[2] != device:
                    device = None
    if first:
        return None
    ordered = {}  # a loop, not a dict comprehension: the comprehension is a call of its own (before Python 3.12)
    for k in sorted(data):
        ordered[k] = data[k]
    return make(TensorDict, ordered, _NO_BATCH, device)


def _node(module: nn.Module, params: bool, buffers: bool) -> TensorDict:
    node = _collect(module, params, buffers)
    return make(TensorDict, {}, _NO_BATCH, None) if node is None else node


# no tag_rule wrapper: a module is not a node, so there are no input tags to follow and the
# result is untagged; the wrapper would only scan the arguments for nodes on every call
def from_module(module: nn.Module, *, split: bool = False) -> TensorDict | tuple[TensorDict, TensorDict]:
    """The module's parameters and buffers as a node nested by sub-module path.

    Args:
        module: any ``nn.Module``.
        split: when True, return ``(params, buffers)``, two nodes of the same
            layout, the first with the parameters only and the second with the
            buffers only (an empty node when the module has none). This is the
            form for training: take gradients with respect to ``params`` alone.

    Returns:
        One node holding parameters and buffers (``split=False``), or the pair
        ``(params, buffers)``. Batch size ``()``; untagged. The leaves are the
        module's own tensors: in the single node, parameters are the
        ``nn.Parameter`` leaves and buffers the others. Sub-modules without
        tensors (``nn.ReLU``) do not appear. Tied weights and shared
        sub-modules appear once per path, holding the same tensor object.

    >>> from_module(nn.Sequential(nn.Linear(3, 4))).keys(include_nested=True)
    NestedKeysView(['0', ('0', 'bias'), ('0', 'weight')])
    """
    if split:
        return _node(module, True, False), _node(module, False, True)
    return _node(module, True, True)


def _flat(node: Node, prefix: str, out: dict[str, torch.Tensor]) -> None:
    for k, v in node._data.items():
        if isinstance(v, Node):
            _flat(v, prefix + k + ".", out)
        else:
            out[prefix + k] = v


def _paths(module: nn.Module, kind: str, prefix: str, groups: dict[torch.Tensor, list[str]]) -> None:
    # named_parameters(remove_duplicate=False) in pre-order, without its generators:
    # functional_call walks the module on every call, so the walk is kept lean.
    for name, tensor in getattr(module, kind).items():
        if tensor is not None:
            groups.setdefault(tensor, []).append(prefix + name)
    for name, sub in module._modules.items():
        if sub is not None:
            _paths(sub, kind, prefix + name + ".", groups)


def _ids(module: nn.Module, out: list[int]) -> None:
    # id(), not the tensor: Tensor.__hash__ is a Python method, id() a builtin.
    for tensor in module._parameters.values():
        if tensor is not None:
            out.append(id(tensor))
    for buffer in module._buffers.values():
        if buffer is not None:
            out.append(id(buffer))
    for sub in module._modules.values():
        if sub is not None:
            _ids(sub, out)


def _untied(module: nn.Module) -> bool:
    """Whether no tensor of ``module`` sits at two paths (tied weights, a shared sub-module)."""
    ids: list[int] = []
    _ids(module, ids)
    return len(set(ids)) == len(ids)


def _swap(module: nn.Module, node: Node, saved: list[tuple[dict[str, Any], str, Any]]) -> bool:
    """Put ``node``'s tensors in ``module``'s parameter and buffer dicts, each replaced entry noted in ``saved``
    (its dict, key and old value); False, at the first entry that is not a parameter, buffer or sub-module
    of the module, for torch's functional_call to handle."""
    params, buffers, subs = module._parameters, module._buffers, module._modules
    for k, v in node._data.items():
        if isinstance(v, Node):
            sub = subs.get(k)
            if sub is None or not _swap(sub, v, saved):
                return False
        elif k in params:
            saved.append((params, k, params[k]))
            params[k] = v
        elif k in buffers:
            saved.append((buffers, k, buffers[k]))
            buffers[k] = v
        else:
            return False
    return True


def _tie(module: nn.Module, flat: dict[str, torch.Tensor]) -> None:
    # Tied paths share one tensor in the module; every path of a tied group
    # takes the value given for its first path (module order: parameters, then
    # buffers), so a gradient or an optimiser step never unties them. Called for a module
    # _untied found tied only.
    groups: dict[torch.Tensor, list[str]] = {}
    _paths(module, "_parameters", "", groups)
    _paths(module, "_buffers", "", groups)
    for names in groups.values():
        if len(names) > 1:
            given = [n for n in names if n in flat]
            if given:
                value = flat[given[0]]
                for n in names:
                    flat[n] = value


def functional_call(module: nn.Module, params: Node | tuple[Node, ...], *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` computed with the tensors of ``params`` in place of its own.

    Args:
        module: any ``nn.Module``; it is not changed.
        params: a node laid out as :func:`from_module` returns it, or a tuple of such nodes
            (``(params, buffers)``). Entries it lacks fall back to the module's own tensors
            (torch's ``strict=False``).
        *args: the module's positional arguments.
        **kwargs: its keyword arguments.

    For the call the node's tensors take the place of the module's own in its
    parameter and buffer dicts, as ``torch.func.functional_call`` puts them
    there, and its own are put back after it, also when it raises. Compiled
    code, modules with tied weights, and nodes with an entry that is no
    parameter, buffer or sub-module of the module go through
    ``torch.func.functional_call`` itself. ``torch.func.grad``, ``vmap`` and
    ``torch.compile`` see through it; gradients come back as a node of the
    same layout.

    Tied weights: a tied group takes the value of its first path (the order
    of ``module.named_parameters()``); values at the group's other paths are
    ignored and get zero gradient, so the model stays tied through training.

    Returns:
        Whatever the module returns (a TDModule returns a node; tags follow the
        rule inside it).

    >>> import torch, tdtree as tt
    >>> m = nn.Linear(2, 1)
    >>> p = from_module(m).apply(torch.zeros_like)
    >>> functional_call(m, p, torch.ones(3, 2)).flatten().tolist()
    [0.0, 0.0, 0.0]
    """
    nodes = params if isinstance(params, tuple) else (params,)
    # the swap done here, not by torch: its functional_call names every entry by its dotted path and
    # finds the sub-module again for each (dynamo traces it as a special case, so compiled code keeps it)
    # one walk that builds no names tells the common case (no tensor at two paths) from a tied module
    untied = _untied(module)
    if untied and not (is_compiling() or torch.jit.is_tracing()) and not isinstance(module, _REFUSED):
        saved: list[tuple[dict[str, Any], str, Any]] = []
        try:
            if all(_swap(module, node, saved) for node in nodes):
                return module(*args, **kwargs)
        finally:
            for entries, key, value in reversed(saved):
                entries[key] = value
    flat: dict[str, torch.Tensor] = {}
    for node in nodes:
        _flat(node, "", flat)
    if not untied:
        _tie(module, flat)
    return torch.func.functional_call(module, flat, args, kwargs, tie_weights=False, strict=False)


def state_dict(params: Node) -> dict[str, torch.Tensor]:
    """The node as a flat dict of the module's names (``"0.weight"``), as ``module.state_dict()`` names them.

    The one conversion for torch's entry points that ask for a real ``dict``:
    ``torch.func.functional_call(module, state_dict(params), x)`` (a node is a Mapping, so
    ``module.load_state_dict(params.flatten_keys("."))`` works without it, as does this).

    Args:
        params: a node laid out as :func:`from_module` returns it.

    Returns:
        A new dict from dotted names to the node's own tensors (not copied, not detached, so
        gradients flow through it), in the node's key order. A dict holds no tags.

    >>> m = nn.Sequential(nn.Linear(2, 1))
    >>> sorted(state_dict(from_module(m))) == sorted(m.state_dict())
    True
    """
    out: dict[str, torch.Tensor] = {}
    _flat(params, "", out)
    return out


def to_module(params: Node, module: nn.Module, *, strict: bool = True) -> nn.Module:
    """Write the node's values into ``module``'s parameters and buffers, in place (tensordict's ``to_module``).

    The module keeps its own tensor objects (optimisers and hooks holding them still see
    them): each is written with ``copy_`` under ``torch.no_grad()``, casting the dtype and
    moving the device as ``load_state_dict`` does. Every key and shape is checked before the
    first write, so a refused call leaves the module unchanged.

    Args:
        params: a node laid out as :func:`from_module` returns it (nested by sub-module path),
            or a flat node of dotted names (``params.flatten_keys(".")``) as well.
        module: the module to write into.
        strict: the node must hold every parameter and buffer of the module (as
            ``load_state_dict(strict=True)``); False writes what the node holds.

    Returns:
        ``module`` itself.

    Raises:
        KeyNotFoundError: a key of the node is no parameter or buffer of the module (the
            message names it and lists the module's names).
        KeyMismatchError: ``strict`` and the module has entries the node lacks.
        WriteShapeError: a value's shape differs from the module's tensor (both shapes named).

    >>> m = nn.Linear(2, 1)
    >>> _ = to_module(from_module(m).apply(torch.zeros_like), m)
    >>> m.weight.abs().sum().item()
    0.0
    """
    given = state_dict(params)
    own: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    own.update(module.named_buffers(remove_duplicate=False))
    pairs = []
    for name, value in given.items():
        target = own.get(name)
        if target is None:
            raise KeyNotFoundError(name, own)
        if value.shape != target.shape:
            raise WriteShapeError(
                f"to_module: {name!r} has shape {tuple(value.shape)} in the node and {tuple(target.shape)} in "
                f"the {type(module).__name__}; nothing was written"
            )
        pairs.append((target, value))
    if strict and len(given) != len(own):
        raise KeyMismatchError("to_module (strict)", given, own)
    with torch.no_grad():
        for target, value in pairs:
            target.copy_(value)
    return module
