"""Modules that read and write nodes: :class:`TDModule` and :class:`TDSequential`.

Both are ordinary ``nn.Module``s: they nest in other models, their
parameters show in ``from_module`` under the attribute path (``"module"`` for
a TDModule, ``"0"``, ``"1"``, ... for the members of a TDSequential), and
``functional_call`` / ``torch.func`` / ``torch.compile`` see through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from .._base import Node

# the functions, not the module: compiled code reaching _keyops both as this module's global and
# as the globals of the functions it inlines pays a Python guard on every call
from .._keyops import set_path
from .._keys import NestedKey, as_path, display, is_key
from .._lookup import exclude, get
from ..errors import KeyNotFoundError, OutKeysError

__all__ = ["TDModule", "TDSequential"]


def _paths(keys: NestedKey | Sequence[NestedKey], what: str, repeats: bool = False) -> tuple[tuple[str, ...], ...]:
    """``keys`` as paths; a key named twice is a ValueError unless ``repeats`` (in keys: a module may
    read one entry as several arguments, as self-attention reads one key as query, key and value)."""
    if is_key(keys):
        return (as_path(keys),)
    paths = tuple(as_path(k) for k in keys)
    if not repeats and len(set(paths)) != len(paths):
        raise ValueError(f"{what} {[display(p) for p in paths]} name a key twice")
    return paths


class TDModule(nn.Module):
    """``module`` reading its inputs from a node and writing its outputs into it.

    Args:
        module: any callable ``nn.Module``; it is called with the entries at
            ``in_keys`` as positional arguments.
        in_keys: a key (a str, or a tuple of str for a nested key) or a list
            of keys, as in tensordict: ``("obs", "pixels")`` is one nested key.
            A key may be named more than once: the entry is passed once per
            name (self-attention: ``in_keys=["x", "x", "x"]``).
        out_keys: a key or a list of keys, each named once; a module that
            returns a tuple fills one key per element, in order.

    Calling it on a node returns ``node.set(out_key, output)`` for every out
    key (the input is not changed). Tags follow the rule of ``set``: a new
    output tensor drops them, and a Locked node refuses (LockedError).

    Raises:
        ValueError: no out key, or a key given twice in ``out_keys``.
        TypeError: a key is not a str or tuple of str.

    Calling it raises as :meth:`forward`.
    """

    def __init__(
        self,
        module: nn.Module,
        in_keys: NestedKey | Sequence[NestedKey],
        out_keys: NestedKey | Sequence[NestedKey],
    ) -> None:
        """Wrap ``module`` (Args and Raises: see the class docstring)."""
        super().__init__()
        self.module = module
        self._in = _paths(in_keys, "in_keys", repeats=True)
        self._out = _paths(out_keys, "out_keys")
        if not self._out:
            raise ValueError("TDModule needs at least one out key to write the module's output to")
        self.in_keys: list[NestedKey] = [display(p) for p in self._in]
        self.out_keys: list[NestedKey] = [display(p) for p in self._out]

    def forward(self, td: Node) -> Node:
        """The node with the module's output written at each out key (what ``tdmodule(td)`` runs).

        Args:
            td: a node holding the ``in_keys``.

        Returns:
            ``td.set(out_key, output)`` for every out key: a new node (``td`` is unchanged); tags
            by the rule of ``set``, so a new output tensor drops them.

        Raises:
            KeyNotFoundError: an in key is not in the node.
            OutKeysError: the module returned a number of outputs that differs from the number of out keys.
            LockedError: ``td`` is Locked.

        >>> import torch, tdtree as tt
        >>> from tdtree.nn import TDModule
        >>> policy = TDModule(torch.nn.Linear(3, 2), in_keys="obs", out_keys=("action", "logits"))
        >>> policy(tt.TensorDict({"obs": torch.zeros(4, 3)}, batch_size=[4]))["action", "logits"].shape
        torch.Size([4, 2])
        """
        # _modules directly: nn.Module.__getattr__'s fallback costs a microsecond per call
        module: Any = self._modules["module"]
        ins = self._in
        # one in key (the usual case) skips building an argument list
        out = module(get(td, ins[0])) if len(ins) == 1 else module(*[get(td, p) for p in ins])
        keys = self._out
        if len(keys) == 1:
            # isinstance first: for a tensor output, compiled code then never builds type(out), a second
            # path to torch.Tensor that dynamo checks against the first with a Python guard on every call
            if isinstance(out, tuple) and type(out) is tuple:
                raise OutKeysError(
                    f"{type(self.module).__name__} returned a tuple of {len(out)} outputs for the one "
                    f"out key {self.out_keys[0]!r}; give one out key per output"
                )
            return set_path(td, keys[0], out)
        if type(out) not in (tuple, list) or len(out) != len(keys):
            got = f"{len(out)} outputs" if type(out) in (tuple, list) else f"one {type(out).__name__}"
            raise OutKeysError(
                f"{type(self.module).__name__} returned {got} for the {len(keys)} out keys {self.out_keys}"
            )
        for path, value in zip(keys, out):
            td = set_path(td, path, value)
        return td

    def extra_repr(self) -> str:
        """The keys, for ``repr``."""
        return f"in_keys={self.in_keys}, out_keys={self.out_keys}"


def _written(path: tuple[str, ...], written: set[tuple[str, ...]]) -> bool:
    return any(path[:i] in written for i in range(1, len(path) + 1))


def _tops(path: tuple[str, ...], keep: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...] | None, ...]:
    """For each depth ``i`` at which an input may first lack ``path``, the highest key from ``path[:i + 1]``
    down that holds no kept key (None when every one does): what the chain created for ``path`` and can
    drop without leaving an empty sub-node behind. Fixed by the keys, so found once at construction."""
    tops: list[tuple[str, ...] | None] = []
    for i in range(len(path)):
        top = None
        for j in range(i + 1, len(path) + 1):
            if not any(k[:j] == path[:j] for k in keep):
                top = path[:j]
                break
        tops.append(top)
    return tuple(tops)


def _dropped(path: tuple[str, ...], tops: tuple[tuple[str, ...] | None, ...], td: Node) -> tuple[str, ...] | None:
    # The input ``td`` decides how much of ``path`` the chain created: from the first part it lacks
    # down (a part below a tensor counts as lacking: get() returns the default there); what the
    # input had is kept. Through get(), not a walk here: compiled code that reaches Node both from
    # this module and from _keyops pays a Python guard on every call.
    for i in range(len(path)):
        if get(td, path[: i + 1], None) is None:
            return tops[i]
    return None


class TDSequential(nn.Module):
    """TDModules (or TDSequentials) applied one after the other to a node.

    Args:
        modules: modules with ``in_keys`` and ``out_keys`` (TDModule,
            TDSequential); they become children ``"0"``, ``"1"``, ...
        selected_out_keys: when given, the output keeps only these of the keys
            written by the chain, plus every key the input already had; the
            other intermediate keys are dropped.

    ``in_keys`` are the keys read before any module writes them (a key counts
    as written when it or a key above it was written); ``out_keys`` are all the
    keys written, in order of first write (for a member TDSequential with
    selected keys, only those it keeps).

    Raises:
        KeyNotFoundError: a selected key is not among ``out_keys``.
        TypeError: a member has no ``in_keys`` / ``out_keys`` (wrap it in a TDModule).
        ValueError: ``selected_out_keys`` names a key twice.
    """

    def __init__(self, *modules: nn.Module, selected_out_keys: Sequence[NestedKey] | None = None) -> None:
        """Chain ``modules`` (Args and Raises: see the class docstring)."""
        super().__init__()
        ins: list[tuple[str, ...]] = []
        outs: list[tuple[str, ...]] = []
        written: set[tuple[str, ...]] = set()
        for i, module in enumerate(modules):
            if not isinstance(module, nn.Module) or not hasattr(module, "in_keys") or not hasattr(module, "out_keys"):
                raise TypeError(
                    f"TDSequential member {i} is a {type(module).__name__}; members are TDModule or "
                    "TDSequential (wrap a plain module with TDModule(module, in_keys, out_keys))"
                )
            self.add_module(str(i), module)
            reads: Any = module.in_keys
            for path in map(as_path, reads):
                if not _written(path, written) and path not in ins:
                    ins.append(path)
            writes: Any = getattr(module, "selected_out_keys", None)
            if writes is None:
                writes = module.out_keys
            for path in map(as_path, writes):
                if path not in written:
                    outs.append(path)
                    written.add(path)
        self.in_keys: list[NestedKey] = [display(p) for p in ins]
        self.out_keys: list[NestedKey] = [display(p) for p in outs]
        self.selected_out_keys: list[NestedKey] | None = None
        # per dropped path, what to drop given the depth at which the input lacks it (see _dropped)
        self._drop: tuple[tuple[tuple[str, ...], tuple[tuple[str, ...] | None, ...]], ...] = ()
        if selected_out_keys is not None:
            selected = _paths(selected_out_keys, "selected_out_keys")
            for path in selected:
                if path not in written:
                    raise KeyNotFoundError(display(path), self.out_keys)
            self.selected_out_keys = [display(p) for p in selected]
            self._drop = tuple((p, _tops(p, selected)) for p in outs if p not in selected)

    def forward(self, td: Node) -> Node:
        """The node after every member, in order (what ``tdsequential(td)`` runs).

        Args:
            td: a node holding the ``in_keys``.

        Returns:
            A new node (``td`` is unchanged) with the members' outputs, less the intermediate keys
            when ``selected_out_keys`` is set; tags by the rule of ``set`` and ``exclude``.

        Raises:
            KeyNotFoundError, OutKeysError, LockedError: as :meth:`TDModule.forward`.
        """
        out = td
        for module in self._modules.values():
            if module is not None:  # torch allows None children; the constructor adds none
                out = module(out)
        if self._drop:
            dropped = [_dropped(path, tops, td) for path, tops in self._drop]
            drop = [q for q in dropped if q is not None]
            if drop:
                out = exclude(out, *drop, strict=False)
        return out

    def _members(self) -> list[nn.Module]:
        # a comprehension, not cast(list(...)): compiled code would guard on typing.cast
        return [m for m in self._modules.values() if m is not None]

    def __getitem__(self, index: int) -> nn.Module:
        """The member at position ``index``."""
        return self._members()[index]

    def __len__(self) -> int:
        """The number of members."""
        return len(self._modules)

    def select_out_keys(self, *keys: NestedKey) -> TDSequential:
        """A TDSequential of the same members whose output keeps only ``keys`` of the written ones.

        Args:
            *keys: keys among ``out_keys`` (str or tuple of str).

        Returns:
            A new TDSequential sharing the members (and so their parameters); this one is unchanged.

        Raises:
            KeyNotFoundError: a key is not among ``out_keys``.
            ValueError: a key is named twice.
        """
        return TDSequential(*self._members(), selected_out_keys=keys)

    def extra_repr(self) -> str:
        """The keys, for ``repr``."""
        selected = "" if self.selected_out_keys is None else f", selected_out_keys={self.selected_out_keys}"
        return f"in_keys={self.in_keys}, out_keys={self.out_keys}{selected}"
