"""DESIGN section 3's list of consequences of the tag rule, as tests on a share_memory() node.

Nothing here is a table in the library: the rule decides by storage identity,
and these tests check that it gives the listed answers. Each test also checks
the storages directly, so a result keeps the tags because its leaves are the
input's storages, and drops them because one is new.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _tagsets import tag_sets

import tdtree as tt

SL = frozenset({tt.Shared, tt.Locked})


def _node() -> tt.TensorDict:
    """Batch (3, 2), with a zero-size leaf, an int leaf and a nested node; in shared memory."""
    return tt.TensorDict(
        {
            "a": torch.arange(24.0).reshape(3, 2, 4),
            "b": torch.arange(6).reshape(3, 2),
            "e": torch.zeros(3, 2, 0),
            "n": {"c": torch.ones(3, 2, 1, dtype=torch.bool)},
        },
        batch_size=[3, 2],
    ).share_memory()


def _results(out: Any) -> list[tt.TensorDict]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _data_storages(td: tt.TensorDict) -> set[int]:
    found = set()
    for _, t in td.items(include_nested=True, leaves_only=True):
        if t.untyped_storage().nbytes():
            found.add(t.untyped_storage().data_ptr())
    return found


KEEP: dict[str, Callable[[tt.TensorDict], Any]] = {
    "view": lambda td: td.view(-1),
    "view_split": lambda td: td.view(3, 2, 1),
    "transpose": lambda td: td.transpose(0, 1),
    "permute": lambda td: td.permute(1, 0),
    "squeeze": lambda td: td.view(3, 1, 2).squeeze(1),
    "unsqueeze": lambda td: td.unsqueeze(0),
    "unbind": lambda td: td.unbind(0),
    "split": lambda td: td.split(1),
    "select": lambda td: td.select("a", ("n", "c")),
    "exclude": lambda td: td.exclude("a"),
    "flatten_keys": lambda td: td.flatten_keys(),
    "unflatten_keys": lambda td: td.flatten_keys().unflatten_keys(),
    "index_int": lambda td: td[0],
    "index_slice": lambda td: td[1:3],
    "clone_shallow": lambda td: td.clone(recurse=False),
    "to_same_device": lambda td: td.to("cpu"),
    "reshape_view": lambda td: td.reshape(6),
    "contiguous_of_contiguous": lambda td: td.contiguous(),
}

DROP: dict[str, Callable[[tt.TensorDict], Any]] = {
    "clone": lambda td: td.clone(),
    "index_mask": lambda td: td[torch.tensor([True, False, True])],
    "index_tensor": lambda td: td[torch.tensor([0, 2])],
    "add": lambda td: td + 1,
    "stack": lambda td: tt.stack([td, td]),
    "cat": lambda td: tt.cat([td, td]),
    "contiguous_of_transposed": lambda td: td.transpose(0, 1).contiguous(),
    "reshape_copy": lambda td: td.transpose(0, 1).reshape(6),
}


@pytest.mark.parametrize("name", sorted(KEEP))
def test_ops_that_reuse_storage_keep_the_tags(name: str) -> None:
    td = _node()
    results = _results(KEEP[name](td))
    assert results
    for out in results:
        assert tag_sets(out) == {SL}, f"{name}: tags {tag_sets(out)}"
        assert _data_storages(out) <= _data_storages(td)


@pytest.mark.parametrize("name", sorted(DROP))
def test_ops_that_make_storage_drop_the_tags(name: str) -> None:
    td = _node()
    results = _results(DROP[name](td))
    assert results
    for out in results:
        assert tag_sets(out) == {frozenset()}, f"{name}: tags {tag_sets(out)}"
        assert not _data_storages(out) <= _data_storages(td)


def test_reshape_keeps_exactly_when_it_returned_a_view() -> None:
    td = _node()
    viewed = td.reshape(6)
    assert viewed["a"]._base is not None and type(viewed) is type(td)
    bent = td.transpose(0, 1)
    copied = bent.reshape(6)
    assert copied["a"].untyped_storage().data_ptr() != td["a"].untyped_storage().data_ptr()
    assert type(copied) is tt.TensorDict


def test_transposed_node_is_still_shared_and_locked() -> None:
    bent = _node().transpose(0, 1)
    assert type(bent) is tt.TensorDict[tt.Locked, tt.Shared]
    assert not bent["a"].is_contiguous()
    assert all(t.is_shared() for _, t in bent.items(include_nested=True, leaves_only=True))


def _no_data() -> tt.TensorDict:
    return tt.TensorDict(
        {"e": torch.zeros(3, 2, 0), "n": {"f": torch.zeros(3, 2, 0, 5)}}, batch_size=[3, 2]
    ).share_memory()


@pytest.mark.parametrize("name", sorted(DROP))
def test_results_without_data_keep_the_tags(name: str) -> None:
    for out in _results(DROP[name](_no_data())):
        assert tag_sets(out) == {SL}, f"{name} on a node without data: tags {tag_sets(out)}"


def test_zero_size_batch_keeps_the_tags_through_copies() -> None:
    td = tt.TensorDict({"a": torch.zeros(0, 4)}, batch_size=[0]).share_memory()
    assert type(td.clone()) is type(td)
    assert type(td + 1) is type(td)
