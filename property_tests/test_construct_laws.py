"""Laws of the constructor on nested mappings: a tree of plain dicts gives the node (or the error) the
same tree of read-only mappings gives, level by level, and holds the source's leaves at their paths.

Plain dicts take the constructor's walk of plain dicts; any other mapping takes the general path,
which nests tuple keys, moves, converts and refuses entries: the two must agree on every node's keys,
batch size, device and tags, on every leaf, and on every error and its message. The trees mix the
cases the walk of plain dicts hands over: leaves on another device or of the wrong shape, sub-nodes
(tagged, on another device, of a longer batch), empty dicts, tuple keys and values that are no entry.
"""

from types import MappingProxyType
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

import tdtree as tt
from tdtree.testing import assert_equal

BATCHES = st.sampled_from([(), (2,), (2, 3)])
DEVICES = st.sampled_from([None, "cpu", torch.device("cpu"), "meta"])
# leaves, told by what the walk of plain dicts does with them; most fit
KINDS = st.sampled_from(["fit"] * 6 + ["extra", "meta", "short", "node", "node_meta", "node_wide", "locked", "float"])
NAMES = st.sampled_from(["a", "b", "n", "x", "z"])
KEYS = st.one_of(NAMES, NAMES, NAMES, st.tuples(NAMES, NAMES))
SPECS = st.recursive(KINDS, lambda inner: st.dictionaries(KEYS, inner, max_size=4), max_leaves=16)


def _value(kind: Any, batch: tuple[int, ...], count: list[int]) -> Any:
    """The source value a spec stands for: dicts of the values of their specs, new tensors for leaves
    (values told apart by ``count``)."""
    if isinstance(kind, dict):
        return {k: _value(v, batch, count) for k, v in kind.items()}
    count[0] += 1
    fill = float(count[0])
    if kind == "float":
        return fill
    if kind == "short":  # no batch dims (a shape error when the batch has some)
        return torch.full((5,), fill)
    if kind.startswith("node"):
        sub_batch = (*batch, 3) if kind == "node_wide" else batch
        device = "meta" if kind == "node_meta" else None
        return tt.TensorDict({"leaf": torch.full((*sub_batch, 2), fill)}, sub_batch, device)
    if kind == "locked":
        return tt.TensorDict({"leaf": torch.full((*batch, 2), fill)}, batch).lock()
    shape = (*batch, 2) if kind == "extra" else batch
    return torch.full(shape, fill, device="meta" if kind == "meta" else "cpu")


def _read_only(value: Any) -> Any:
    """``value`` with every dict in it a read-only mapping (which the walk of plain dicts hands over)."""
    if isinstance(value, dict):
        return MappingProxyType({k: _read_only(v) for k, v in value.items()})
    return value


def _outcome(source: Any, batch: tuple[int, ...], device: Any) -> Any:
    try:
        return tt.TensorDict(source, batch, device)
    except Exception as error:  # noqa: BLE001 - the error is the outcome compared
        return type(error), str(error)


def _shape(value: Any) -> Any:
    """The structure of a source: its keys, nested, the identity of each value that is no dict and
    each tensor's version (a write bumps it)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return id(value), value._version if isinstance(value, torch.Tensor) else None


def _same_node(got: Any, want: Any) -> None:
    assert type(got) is type(want) and got._meta == want._meta
    for key, value in want._data.items():
        if isinstance(value, tt.TensorDict):
            _same_node(got._data[key], value)
        elif value.device.type == "meta":
            assert got._data[key].device == value.device and got._data[key].shape == value.shape
        else:
            assert_equal(got._data[key], value)


def _source_leaves(value: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The leaves of a source without tuple keys, as (path, tensor): dicts and nodes walked."""
    if isinstance(value, tt.TensorDict):
        items = value.items(include_nested=True, leaves_only=True)
        return [((*path, *((key,) if type(key) is str else key)), v) for key, v in items]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _source_leaves(v, (*path, k))]
    return [(path, value)]


@given(SPECS.filter(lambda spec: isinstance(spec, dict)), BATCHES, DEVICES)
def test_plain_dicts_build_what_any_mapping_builds(spec, batch, device):
    source = _value(spec, batch, [0])
    before = _shape(source)
    got = _outcome(source, batch, device)
    want = _outcome(_read_only(source), batch, device)
    assert _shape(source) == before  # the caller's dicts are left as they were
    if isinstance(want, tuple):
        assert got == want
        return
    assert not isinstance(got, tuple), got
    _same_node(got, want)
    if any(type(k) is tuple for k in _walk_keys(source)):
        return  # tuple keys merge levels: the general path, compared above, says where leaves go
    for path, leaf in _source_leaves(source):
        held = got[path]
        if device is None or leaf.device == torch.device(device):
            assert held is leaf  # a leaf that fits is kept, not copied
        else:
            assert held.device == torch.device(device) and held.shape == leaf.shape


def _walk_keys(value: Any) -> list[Any]:
    if not isinstance(value, dict):
        return []
    return [k for k, v in value.items() for k in (k, *_walk_keys(v))]
