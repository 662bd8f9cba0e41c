"""A deeply nested node under torch.compile(fullgraph=True): the same values as the plain nested dict.

Dynamo reads a leaf ``DEPTH`` levels down a node by a path of ``2 * DEPTH`` links (``_data`` and
the key at each level), where a plain dict's path has ``DEPTH``; it writes such a path into the
code it emits by recursion, so a node reaches about half a plain dict's depth there (a little over
120 levels, a plain dict about 240). ``DEPTH`` is below that and past where tdtree's own
recursive walks ran out under dynamo (26 levels for ``tt.tree.map``, about 52 for ``td + 1``,
``apply`` and ``clone``); deeper trees cost minutes of compile time here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch

import tdtree as tt

DEPTH = 60


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: a fresh dynamo cache


def deep_dict() -> dict[str, Any]:
    """A chain of ``DEPTH`` nested dicts, one small tensor leaf at each level."""
    d: dict[str, Any] = {"x": torch.arange(2.0)}
    for i in range(1, DEPTH):
        d = {"a": d, "x": torch.arange(2.0) + i}
    return d


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, fullgraph=True, backend="eager")


def same_leaves(node: tt.TensorDict, tree: dict[str, Any]) -> None:
    assert isinstance(node, tt.TensorDict)
    assert node.to_dict().keys() == tree.keys()
    got, want = optree.tree_leaves(node.to_dict()), optree.tree_leaves(tree)
    assert len(got) == len(want) == DEPTH
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize(
    "op, on_dict",
    [
        (lambda x: tt.tree.map(lambda t: t + 1, x), lambda t: t + 1),
        (lambda x: x * 2 + 1, lambda t: t * 2 + 1),
        (lambda x: x.apply(lambda t, u: t - u, x + 1), lambda t: torch.full_like(t, -1)),
    ],
    ids=["tree.map", "arith", "apply-paired"],
)
def test_deep_node_compiles_as_dict(op: Callable[[Any], Any], on_dict: Callable[[torch.Tensor], Any]) -> None:
    d = deep_dict()
    td = tt.TensorDict(d)
    # the plain dict's floor: the same map, compiled over the dict
    want = compiled(lambda x: optree.tree_map(on_dict, x))(d)
    same_leaves(compiled(op)(td), want)
