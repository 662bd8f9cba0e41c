"""Random sequences of operations on shared, locked and plain nodes, with the tag rule checked at every step.

After every step, for every node made so far:

* soundness: a ``Shared`` node's leaves that hold data are in shared memory,
  and every sub-node carries the root's tags;
* nothing changed: no functional operation wrote into any earlier node (same
  leaf objects, ``_version`` and values); only the in-place writers change
  contents, and the machine re-reads every node after one.

For every result, the tags are what the rule says, computed here independently
of the engine: the common tags of the node inputs when every leaf of the result
that holds data uses a storage of an input (completeness), else none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule

import tdtree as tt
from tdtree.errors import LockedError, WriteError
from tdtree.testing import batch_sizes, tensordicts

Snapshot = list[tuple[torch.Tensor, int, torch.Tensor]]
KEEP_NODES = 24


def _leaves(td: tt.TensorDict) -> list[torch.Tensor]:
    return [t for _, t in td.items(include_nested=True, leaves_only=True)]


def _subnodes(td: tt.TensorDict) -> list[tt.TensorDict]:
    return [td] + [v for _, v in td.items(include_nested=True) if isinstance(v, tt.TensorDict)]


def _data_storages(td: tt.TensorDict) -> set[tuple[torch.device, int]]:
    found = set()
    for t in _leaves(td):
        storage = t.untyped_storage()
        if storage.nbytes():
            found.add((t.device, storage.data_ptr()))
    return found


def _expected_tags(result: tt.TensorDict, inputs: list[tt.TensorDict]) -> frozenset:
    common = frozenset.intersection(*(n.tags for n in inputs))
    known = set().union(*(_data_storages(n) for n in inputs))
    return common if _data_storages(result) <= known else frozenset()


def _first_leaf(td: tt.TensorDict) -> torch.Tensor | None:
    leaves = _leaves(td)
    return leaves[0] if leaves else None


def _first_key(td: tt.TensorDict) -> list[str]:
    return list(td.keys())[:1]


def _fresh(td: tt.TensorDict) -> str:
    """A key not in ``td`` (the strategies draw names from "abcdefgh")."""
    name = "z"
    while name in td:
        name += "z"
    return name


def _zeros_like_batch(td: tt.TensorDict) -> torch.Tensor:
    return torch.zeros(td.batch_size)


def _batched(fn: Callable[[tt.TensorDict], Any]) -> Callable[[tt.TensorDict], Any]:
    """``fn`` for nodes with at least one batch dim; None (the step is void) for the others."""
    return lambda td: fn(td) if td.ndim else None


def _overlapping(td: tt.TensorDict) -> bool:
    # a leaf where two elements share a memory cell; an empty leaf has none, whatever its strides
    return any(t.numel() > 0 and any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)) for t in _leaves(td))


# Operations of one node that return nodes. Each entry: name -> fn(td) -> node, sequence of nodes, or None.
UNARY: dict[str, Callable[[tt.TensorDict], Any]] = {
    "view": lambda td: td.view(*td.batch_size, 1),
    "reshape": lambda td: td.reshape(-1),
    "flatten": lambda td: td.flatten(),
    "transpose": _batched(lambda td: td.transpose(0, -1)),
    "permute": _batched(lambda td: td.permute(*reversed(range(td.ndim)))),
    "unsqueeze": lambda td: td.unsqueeze(0),
    "squeeze": lambda td: td.squeeze(),
    "expand": lambda td: td.expand(2, *td.batch_size),
    "index_int": _batched(lambda td: td[0] if td.batch_size[0] else td[:0]),
    "index_slice": _batched(lambda td: td[1:]),
    "index_step": _batched(lambda td: td[::2]),
    "index_mask": _batched(lambda td: td[torch.arange(td.batch_size[0]) % 2 == 0]),
    "index_tensor": _batched(lambda td: td[torch.arange(td.batch_size[0]).flip(0)]),
    "unbind": _batched(lambda td: td.unbind(0)),
    "split": _batched(lambda td: td.split(1)),
    "chunk": _batched(lambda td: td.chunk(2)),
    "add": lambda td: td + 1,
    "apply_same": lambda td: td.apply(lambda x: x),
    "apply_view": lambda td: td.apply(lambda x: x[...]),
    "contiguous": lambda td: td.contiguous(),
    "to_same_device": lambda td: td.to("cpu"),
    "zeros_like": lambda td: torch.zeros_like(td),
    "select_first": lambda td: td.select(*_first_key(td)),
    "select_none": lambda td: td.select(),
    "exclude_first": lambda td: td.exclude(*_first_key(td)),
    "flatten_keys": lambda td: td.flatten_keys(),
    "unflatten_keys": lambda td: td.flatten_keys("/").unflatten_keys("/"),
    "clone": lambda td: td.clone(),
    "clone_shallow": lambda td: td.clone(recurse=False),
    "sub_nodes": lambda td: tuple(_subnodes(td)[1:2]),
}

# The functional editors: refused on Locked nodes, decided by the rule otherwise.
EDITORS: dict[str, Callable[[tt.TensorDict], Any]] = {
    "set_new": lambda td: td.set("zz", _zeros_like_batch(td)),
    "set_alias": lambda td: td.set("zz", _first_leaf(td) if _first_leaf(td) is not None else _zeros_like_batch(td)),
    "update_alias": lambda td: td.update({"zz": td.select(*_first_key(td))}),
    "rename": lambda td: td.rename({k: _fresh(td) for k in _first_key(td)}),
    "setdefault": lambda td: td.setdefault("zz", _zeros_like_batch(td)),
}

# Operations of two nodes of the same structure: the second is always derived from the first.
BINARY: dict[str, Callable[[tt.TensorDict, tt.TensorDict], Any]] = {
    "update_other": lambda a, b: a.update(b),
    "add_nodes": lambda a, b: a + b,
    "stack": lambda a, b: tt.stack([a, b]),
    "torch_stack": lambda a, b: torch.stack([a, b], 0),
    "cat": lambda a, b: tt.cat([a, b]) if a.ndim else None,
}

# The second input of a binary operation: the same structure, with the same, fewer, more or other storages and tags.
PARTNERS: dict[str, Callable[[tt.TensorDict], tt.TensorDict]] = {
    "shallow_copy": lambda td: td.clone(recurse=False),
    "unlocked": lambda td: td.unlock(),
    "locked": lambda td: td.lock(),
    "shared_copy": lambda td: td.share_memory(),
}

# In-place writers, given the node and a clone of it to take values from.
WRITERS: dict[str, Callable[[tt.TensorDict, tt.TensorDict], Any]] = {
    "update_": lambda td, src: td.update_(src),
    "copy_": lambda td, src: td.copy_(src),
    "zero_": lambda td, src: td.zero_(),
    "fill_": lambda td, src: td.fill_(_first_key(td)[0], True) if _first_key(td) else td,
    "at_set_": lambda td, src: td.at[:1].set_(True) if td.ndim else td.at[...].set_(True),
}

NODES = tensordicts(
    batch_size=batch_sizes(min_dims=1, max_dims=2, min_side=0, max_side=3),
    min_keys=1,
    max_keys=3,
    noncontiguous=True,
)


class TagRuleMachine(RuleBasedStateMachine):
    nodes = Bundle("nodes")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[tt.TensorDict, Snapshot]] = []

    def _record(self, td: tt.TensorDict) -> None:
        self.seen.append((td, [(t, t._version, t.clone()) for t in _leaves(td)]))
        del self.seen[:-KEEP_NODES]

    def _reread(self) -> None:
        self.seen = [(td, [(t, t._version, t.clone()) for t in _leaves(td)]) for td, _ in self.seen]

    def _results(self, out: Any, inputs: list[tt.TensorDict]) -> Any:
        if out is None:
            return multiple()
        results = list(out) if isinstance(out, (list, tuple)) else [out]
        for result in results:
            assert isinstance(result, tt.TensorDict)
            expected = _expected_tags(result, inputs)
            assert result.tags == expected, f"tags {set(result.tags)}, the rule says {set(expected)}"
            self._record(result)
        return multiple(*results)

    @initialize(target=nodes, td=NODES)
    def start(self, td: tt.TensorDict) -> Any:
        shared = td.share_memory()
        assert shared.tags == frozenset({tt.Shared, tt.Locked})
        for node in (td, shared, td.lock(), shared.unlock()):
            self._record(node)
        return multiple(td, shared, td.lock(), shared.unlock())

    @rule(target=nodes, td=nodes, name=st.sampled_from(sorted(UNARY)))
    def unary(self, td: tt.TensorDict, name: str) -> Any:
        return self._results(UNARY[name](td), [td])

    @rule(target=nodes, td=nodes, name=st.sampled_from(sorted(EDITORS)))
    def edit(self, td: tt.TensorDict, name: str) -> Any:
        if td.is_locked:
            try:
                EDITORS[name](td)
            except LockedError as err:
                assert "unlock()" in str(err) and "update_()" in str(err)
                return multiple()
            raise AssertionError(f"{name} on a locked node did not raise LockedError")
        return self._results(EDITORS[name](td), [td])

    @rule(target=nodes, td=nodes, name=st.sampled_from(sorted(BINARY)), partner=st.sampled_from(sorted(PARTNERS)))
    def binary(self, td: tt.TensorDict, name: str, partner: str) -> Any:
        other = PARTNERS[partner](td)
        if td.is_locked and name == "update_other":
            return multiple()
        return self._results(BINARY[name](td, other), [td, other])

    @rule(td=nodes)
    def retag_by_hand(self, td: tt.TensorDict) -> None:
        assert td.lock().tags == td.tags | {tt.Locked}
        assert td.unlock().tags == td.tags - {tt.Locked}
        assert _data_storages(td.lock()) == _data_storages(td)
        shared = td.share_memory()
        assert shared.tags == frozenset({tt.Shared, tt.Locked})
        self._record(shared)

    @rule(td=nodes, name=st.sampled_from(sorted(WRITERS)))
    def write(self, td: tt.TensorDict, name: str) -> None:
        before = [(t, t.shape, t.dtype) for t in _leaves(td)]
        keys = list(td.keys(include_nested=True))
        source = td.clone()
        if name in ("update_", "copy_", "at_set_") and _overlapping(td):
            # at[...].set_ too: a part of an expanded leaf shares its memory cells with the rest
            try:
                WRITERS[name](td, source)
            except WriteError as err:
                assert "expanded tensor" in str(err)
                return
            raise AssertionError(f"{name} into an expanded leaf did not raise WriteError")
        assert WRITERS[name](td, source) is td
        assert [(t, t.shape, t.dtype) for t in _leaves(td)] == before
        assert list(td.keys(include_nested=True)) == keys
        if name in ("update_", "copy_"):
            for t, s in zip(_leaves(td), _leaves(source)):
                assert torch.equal(t, s)
        self._reread()

    @invariant()
    def sound(self) -> None:
        for td, _ in self.seen:
            for sub in _subnodes(td):
                assert sub.tags == td.tags, f"a sub-node carries {set(sub.tags)}, the root {set(td.tags)}"
            if td.is_shared:
                for t in _leaves(td):
                    assert t.untyped_storage().nbytes() == 0 or t.is_shared()

    @invariant()
    def nothing_changed(self) -> None:
        for _, snapshot in self.seen:
            for t, version, values in snapshot:
                assert t._version == version, "a functional operation wrote into an earlier node"
                assert torch.equal(t, values), "a functional operation changed an earlier node's values"


TagRuleMachine.TestCase.settings = settings(stateful_step_count=50)
test_tag_rule_machine = TagRuleMachine.TestCase
