"""What the tag rule's gate tells an argument by: its type.

``NODELESS_TYPES`` (numbers, strings, slices, functions, tensors: values that hold no node),
``UNTAGGED_TYPES`` (those and the untagged node types) and ``TAGGED_TYPES`` (the tagged variants);
a node type adds itself to one of the last two when it is made (:class:`tdtree._base.Node`). The
rule asks through ``is_untagged_type`` / ``is_tagged_type`` / ``is_nodeless_type``, which compiled
code answers once per type while tracing (a set lookup there would guard every type in the set on
every call).
"""

from __future__ import annotations

import functools
import types

import torch

from ._torch_private import substitute_in_graph

__all__ = ["UNTAGGED_TYPES", "NODELESS_TYPES", "TAGGED_TYPES", "is_untagged_type", "is_tagged_type", "is_nodeless_type"]

# The gate lets an argument pass on one lookup of its type: values that hold no node and the untagged
# node types pass, tagged node types stop it. NODELESS_TYPES are fixed: an argument of one of them is
# no node input at all.
NODELESS_TYPES: frozenset[type] = frozenset(
    {
        torch.Tensor,
        str,
        int,
        float,
        bool,
        type(None),
        torch.device,
        torch.dtype,
        torch.Size,
        slice,
        range,
        type(...),
        complex,
        types.FunctionType,
        types.BuiltinFunctionType,
        types.MethodType,
        functools.partial,
    }
)
UNTAGGED_TYPES: set[type] = set(NODELESS_TYPES)
TAGGED_TYPES: set[type] = set()

# The membership tests of the three sets: bound C methods (a set lookup's cost in eager), which
# compiled code folds to a constant per type (below). Dynamo guards a set it reads item by item, each
# item through a list made of the whole set, so a lookup's guards grow with the square of its size.
is_untagged_type = UNTAGGED_TYPES.__contains__
is_tagged_type = TAGGED_TYPES.__contains__
is_nodeless_type = NODELESS_TYPES.__contains__


# Folding is sound: a set only gains types (node types as they are made), and the type asked about
# is one dynamo guards by identity. The twins run only when a type is not known at trace time.
@substitute_in_graph(is_untagged_type, can_constant_fold_through=True)
def _is_untagged_type_traced(t: object, /) -> bool:
    return t in UNTAGGED_TYPES


@substitute_in_graph(is_tagged_type, can_constant_fold_through=True)
def _is_tagged_type_traced(t: object, /) -> bool:
    return t in TAGGED_TYPES


@substitute_in_graph(is_nodeless_type, can_constant_fold_through=True)
def _is_nodeless_type_traced(t: object, /) -> bool:
    return t in NODELESS_TYPES
