"""Tags and the one propagation rule.

A node's tags are part of its type: ``TensorDict[Shared]`` is a real, cached
subclass of ``TensorDict``, and ``TensorDict[Locked, Shared]`` subclasses both
``TensorDict[Locked]`` and ``TensorDict[Shared]``, so ``isinstance`` is true
when a node carries at least the tags asked for.

The rule, applied by :func:`tag_rule` to every operation that returns nodes:
a result carries the tags common to its node inputs if and only if every leaf
of the result that holds data uses a storage one of those inputs already used;
otherwise it carries none. Untagged inputs skip the check.

Tags come only from :func:`retag` (called by ``lock``, ``share_memory``,
``memmap``, ``load_memmap`` and the rule): a tagged type cannot be called, and
every other factory builds untagged nodes (DESIGN 3.1).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from itertools import compress, repeat
from operator import getitem, is_, not_
from typing import Any, TypeVar

import optree
import torch

from ._argtypes import is_nodeless_type, is_tagged_type, is_untagged_type
from ._base import (
    FEW,
    NO_TAGS,
    UNDECIDED,
    Holder,
    Node,
    all_plain,
    memo,
    retagged,
)
from ._known import Known, holds_new, scan, storage_key, untagged_throughout
from ._pytree import NAMESPACE, refuse_tagged, tagged_type, variant
from ._tagnames import Locked, Memmap, Shared, Tag, tag_named
from ._torch_private import (
    answered_while_tracing,
    holds_data,
    storage_id,
    storage_ids,
    storage_of,
    storages,
    substitute_in_graph,
    transforms_active,
)

__all__ = [
    "Tag",
    "Locked",
    "Shared",
    "Memmap",
    "tag_named",
    "tagged_type",
    "refuse_tagged",
    "retag",
    "tag_rule",
    "decide",
    "holds_tagged",
    "storage_key",
]

F = TypeVar("F", bound=Callable[..., Any])

_Tensor = torch.Tensor


def retag(node: Any, tags: frozenset) -> Any:
    """``node`` with every sub-node carrying exactly ``tags`` (leaves reused, node returned when it already does)."""
    if not isinstance(node, Node):
        return node
    root = type(node)._root
    if tags:
        cls = variant(root, tags)  # a tagged type, whose _tags mypy cannot see on a plain type
        tags = cls._tags
    else:
        cls, tags = root, NO_TAGS
    out = retagged(node, cls, tags, variant)
    return node if out is None else out


def _ruled_one(out: Node, node: Node) -> Any:
    """The node ``out`` with the rule applied for the one input node ``node``: what :func:`_ruled`
    does for one result, as most operations return it (one frame, the input's type reused)."""
    cls = type(node)
    common = cls._tags
    if not common or out is node:
        return retag(out, common)
    known: Known = memo(node, Known)
    ids = known.ids
    data = out._data
    values = data.values()
    # an entry that is not the input's own (a placeholder leaf may be None): on a few entries the first
    # tensor among them when there is one (a new sub-node may come first), else the first of them
    first = None
    own = True
    if len(data) < FEW:
        # a loop here costs less than the iterator chains below on a few entries
        for v in values:
            if id(v) not in ids:
                first = v
                own = False
                if isinstance(v, _Tensor):
                    break
    else:
        # a result of new entries (+, clone, an index) is told by its first one; one of the input's
        # own entries (select, exclude) by a test of them all in C
        first = next(iter(values))
        if id(first) not in ids:
            own = False
        elif all(map(is_, values, map(node._data.get, data))):
            first = None  # the input's entries at their own keys (select, exclude): no id() per entry
        else:
            own = ids.issuperset(map(id, values))
            first = None if own else next(compress(values, map(not_, map(ids.__contains__, map(id, values)))))
    shallow = own and known.uniform
    if not own and isinstance(first, _Tensor):  # isinstance costs more on None than on a tensor
        # a tensor on a new storage holding data decides, before any walk (the first new tensor of +,
        # clone, update)
        storage = storage_of(first)
        if storage not in known.storages and holds_data(storage):
            # a factory's node untagged at every level already (of tensors alone, or told by one walk
            # of its sub-nodes: a new tree holds new ones) is the result as it is
            if all_plain(values, len(data)) and not type(out)._tags or untagged_throughout(out):
                return out
            return retag(out, NO_TAGS)
        if not transforms_active():
            # views of the input's leaves (an index, a reshape): every level's storages tested in C,
            # in the one walk that builds the tagged tree; a level that fails (a new storage, or one of
            # zero bytes) leaves the decision to the walk below
            decided = retagged(out, cls, common, variant, 0, False, known.storages.issuperset)
            if decided is not UNDECIDED:
                return out if decided is None else decided
    if not shallow:
        leaves: list[torch.Tensor] = []
        subs: list[Node] = []
        uniform = scan(out, common, leaves, subs)
        # told already not to be all the input's own: a result with a new leaf among its entries, or
        # one without sub-nodes that is not all the input's own
        if holds_new(leaves, [known], mixed=isinstance(first, _Tensor) or (not own and not subs)):
            return out if not subs and not type(out)._tags else retag(out, NO_TAGS)
        if uniform:
            return out
    if type(out)._root is not cls._root:
        return retag(out, common)
    decided = retagged(out, cls, common, variant, 0, shallow)
    return out if decided is None else decided


def _new_storages(results: list[list[torch.Tensor]], inputs: list[Node]) -> list[bool]:
    """For each leaf list of ``results``: whether a leaf holds data (a ``storage_key``) none of the
    nodes ``inputs`` has.

    What the rule needs of an input node is worked out once per node and kept on it (``memo``: a
    node never changes), so an operation pays for the leaves of its result, not of its inputs.
    """
    known = [memo(n, Known) for n in inputs]
    return [holds_new(leaves, known) for leaves in results]


@answered_while_tracing
def _fresh_runs(known: list[torch.Tensor], leaves: list[torch.Tensor], counts: list[int]) -> torch.Size:
    """For each run of ``counts`` consecutive ``leaves``: 1 when one of them holds data on a storage
    none of ``known`` uses, else 0."""
    seen = set(storage_ids(known))
    out, start = [], 0
    for count in counts:
        run = storages(leaves[start : start + count])
        out.append(int(any(storage_id(s) not in seen and holds_data(s) for s in run)))
        start += count
    return torch.Size(out)


def _is_key(x: Any) -> bool:
    """A tuple starting with a str: a nested key, which holds no node."""
    return type(x) is tuple and bool(x) and type(x[0]) is str


def _holds_node(x: Any) -> bool:
    return isinstance(x, (Node, Holder))


def _nodes_in(x: Any, out: list[Node]) -> None:
    """Append to ``out`` the nodes ``x`` holds: ``x`` itself, a tensorclass's node, or the nodes
    anywhere in a tree of the ``"tdtree"`` namespace (dicts, lists, tuples, named tuples, ...)."""
    # an explicit stack (items pushed reversed, so nodes come out in the order of a recursive walk):
    # a nested dict handed to update is as deep as a node gets, past Python's recursion limit. Reversed
    # slices, not reversed(): dynamo traces reversed() through a polyfill iterator and guards on it
    todo = [x]
    while todo:
        x = todo.pop()
        if isinstance(x, Node):
            out.append(x)
            continue
        t = type(x)
        if is_untagged_type(t) or _is_key(x):
            continue
        if isinstance(x, Holder):
            out.append(x._td)
        elif t is list or t is tuple:
            # the builtin containers walked here (optree would call back per item; stack takes many
            # nodes), tensors told inline
            todo.extend([item for item in x[::-1] if type(item) is not _Tensor])
        elif t is dict:
            todo.extend([item for item in list(x.values())[::-1] if type(item) is not _Tensor])
        elif not (callable(x) or isinstance(x, _Tensor)):
            leaves = optree.tree_leaves(x, is_leaf=_holds_node, namespace=NAMESPACE)  # type: ignore[arg-type]
            todo.extend([leaf for leaf in leaves[::-1] if isinstance(leaf, (Node, Holder))])


def holds_tagged(x: Any) -> bool:
    """Whether a tagged node sits in ``x``: ``x`` itself, a tensorclass's node, or a node anywhere in
    a tree of the ``"tdtree"`` namespace."""
    found: list[Node] = []
    _nodes_in(x, found)
    for n in found:
        if n._meta[3]:
            return True
    return False


def _decide(out: Any, inputs: list[Node]) -> Any:
    """``out`` with the rule applied to every node in it, wherever it sits."""
    if len(inputs) == 2 and inputs[0] is inputs[1]:
        inputs = inputs[:1]  # a node with itself (td + td, td * td): one input
    if len(inputs) == 1:  # the common case, told without the generator (a frame dynamo inlines)
        if isinstance(out, Node):
            return _ruled_one(out, inputs[0])
        common = type(inputs[0])._tags
    else:
        common = frozenset.intersection(*(type(n)._tags for n in inputs))
    if isinstance(out, Node):
        return _ruled([out], inputs, common)[0]
    if type(out) in (list, tuple) and all(isinstance(r, Node) for r in out):
        return type(out)(_ruled(out, inputs, common))  # unbind, split, chunk: no registry round trip
    leaves, spec = optree.tree_flatten(out, is_leaf=_holds_node, namespace=NAMESPACE)  # type: ignore[arg-type]
    held = [i for i, x in enumerate(leaves) if isinstance(x, (Node, Holder))]
    if not held:
        return out
    nodes = [leaves[i]._td if isinstance(leaves[i], Holder) else leaves[i] for i in held]
    for i, old, new in zip(held, nodes, _ruled(nodes, inputs, common)):
        if new is not old:
            x = leaves[i]
            leaves[i] = x._wrap(new) if isinstance(x, Holder) else new
    return optree.tree_unflatten(spec, leaves)


def _ruled(results: list[Any], inputs: list[Node], common: frozenset) -> list[Any]:
    """The nodes ``results`` with the rule applied for the ``common`` tags of ``inputs``."""
    if not common:
        return [retag(r, common) for r in results]
    leaves: list[list[torch.Tensor]] = [[] for _ in results]
    uniform = [scan(r, common, found) for r, found in zip(results, leaves)]
    decided = []
    for r, fresh, carries_common in zip(results, _new_storages(leaves, inputs), uniform):
        if fresh:
            r = retag(r, NO_TAGS)
        elif not carries_common:  # a result carrying them everywhere already is kept as it is
            r = retag(r, common)
        decided.append(r)
    return decided


@substitute_in_graph(_ruled)
def _ruled_traced(results: list[Any], inputs: list[Node], common: frozenset) -> list[Any]:
    # _ruled as dynamo traces it at least cost: one frame (walks with a stack, no recursion, no
    # comprehension: each is a call dynamo inlines), and the storage test in one call of
    # _fresh_runs, which dynamo runs on the fake tensors (their storages keep their identity) and
    # whose answer it takes as constants, so the rule adds no graph break. A node is rebuilt for
    # each call, so nothing is kept on it (memo).
    decided: list[Any] = []
    if not common:
        for r in results:
            decided.append(retag(r, common))
        return decided
    known: list[torch.Tensor] = []
    stack = list(inputs)
    while stack:
        for v in stack.pop()._data.values():
            if isinstance(v, _Tensor):
                known.append(v)
            elif isinstance(v, Node):
                stack.append(v)
    leaves: list[torch.Tensor] = []
    counts: list[int] = []
    kept: list[bool] = []  # every node of the result carries common already
    bare: list[bool] = []  # every node of the result carries no tag
    for r in results:
        start = len(leaves)
        same = plain = True
        stack = [r]
        while stack:
            node = stack.pop()
            tags = type(node)._tags
            if tags != common:
                same = False
            if tags:
                plain = False
            for v in node._data.values():
                if isinstance(v, _Tensor):
                    leaves.append(v)
                elif isinstance(v, Node):
                    stack.append(v)
        counts.append(len(leaves) - start)
        kept.append(same)
        bare.append(plain)
    for r, fresh, same, plain in zip(results, _fresh_runs(known, leaves, counts), kept, bare):
        if fresh:
            decided.append(r if plain else retag(r, NO_TAGS))
        else:
            decided.append(r if same else retag(r, common))
    return decided


@substitute_in_graph(_ruled_one)
def _ruled_one_traced(out: Node, node: Node) -> Any:
    # compiled, nothing is kept on the nodes (memo): the traced rule decides
    return _ruled_traced([out], [node], type(node)._tags)[0]


def _untagged(x: Any) -> bool:
    """Whether the argument ``x`` holds no tagged node (after the gate's lookup of its type failed)."""
    t = type(x)
    if is_tagged_type(t):
        return False
    if t is dict:
        # a dict of tensors (what update takes): its values' types told by a loop in C, without the
        # walk of holds_tagged
        if all(map(is_untagged_type, map(type, x.values()))):
            return True
    elif t is tuple or t is list:
        if t is tuple and x and type(x[0]) is str:  # a nested key (told inline: the common case here)
            return True
        # an index of slices, ints, tensors, ``...`` and None, or a list of sizes: told by the items'
        # types, without the walk of holds_tagged
        for item in x:
            if not is_untagged_type(type(item)):
                break
        else:
            return True
    return not holds_tagged(x)


def _all_untagged(values: Iterable[Any]) -> bool:
    # Many keys (select, exclude) are told by loops in C first: str keys by their type, nested keys as
    # tuples whose first part is a str (an empty tuple stops the loop with IndexError). all() and is_,
    # not operator.countOf: dynamo traces countOf through polyfills that it then guards on.
    if type(values) is not tuple or len(values) < FEW:
        pass
    elif all(map(is_untagged_type, map(type, values))):
        return True
    elif all(map(is_, map(type, values), repeat(tuple))):
        try:
            if all(map(is_, map(type, map(getitem, values, repeat(0))), repeat(str))):
                return True
        except IndexError:
            pass
    for x in values:
        t = type(x)
        if is_untagged_type(t) or (t is tuple and x and type(x[0]) is str):
            continue
        if not _untagged(x):
            return False
    return True


def _ruled_out(out: Any, values: Iterable[Any]) -> Any:
    """``out`` decided by the rule for the inputs found in the arguments ``values``."""
    inputs: list[Node] = []
    for x in values:
        if isinstance(x, Node):
            inputs.append(x)  # untagged ones too: they leave no tag in common
            continue
        t = type(x)
        # the other arguments the gate passes by type (keys, numbers, tensors) hold no node: select
        # of many keys would otherwise pay a call per key
        if is_untagged_type(t) or (t is tuple and x and type(x[0]) is str):
            continue
        if t is dict and all(map(is_, map(type, x.values()), repeat(_Tensor))):
            continue  # a dict of plain tensors (what update takes), told by a loop in C
        _nodes_in(x, inputs)
    if len(inputs) == 1 and isinstance(out, Node):
        return _ruled_one(out, inputs[0])  # _decide's common case, a frame less
    return _decide(out, inputs)


def decide(out: Any, args: Iterable[Any]) -> Any:
    """``out`` with the rule applied for the node inputs found in the arguments ``args``: what
    :func:`tag_rule`'s wrapper does, for a function that applies it in its own body (one that
    ``torch.compile`` may build in a traced frame, where ``tag_rule`` itself cannot run)."""
    args = tuple(args)
    if _all_untagged(args):
        return out
    return _ruled_out(out, args)


def _gate_source(fn: Callable[..., Any]) -> str:
    """The source of a wrapper of ``fn`` with ``fn``'s own parameters (no ``*args``/``**kwargs`` to pack
    and forward: half the wrapper's cost on a call that passes the gate). It calls ``fn``, lets the
    result through when every argument's type is an untagged one and decides it by the rule otherwise:
    straight by :func:`_ruled_one` when the first argument is a tagged node, the others hold no node
    by their types and the result is a node (a method of a tagged node), by :func:`_ruled_out` else."""
    kind = inspect.Parameter
    params, passed, checks, values = [], [], [], []
    plain: list[str] = []  # the fast route's tests of every argument after the first
    starred = False
    parameters = list(inspect.signature(fn).parameters.values())
    for p in parameters:
        name = p.name
        if p.kind is kind.VAR_POSITIONAL:
            starred = True
            params.append(f"*{name}")
            passed.append(f"*{name}")
            checks.append(f"_all_untagged({name})")
            values.append(f"*{name}")
            # keys (select, exclude) told by their types in C; a nested key (a tuple) takes the other route
            plain.append(f"all(map(_nodeless_type, map(type, {name})))")
            continue
        if p.kind is kind.VAR_KEYWORD:
            params.append(f"**{name}")
            passed.append(f"**{name}")
            checks.append(f"_all_untagged({name}.values())")
            values.append(f"*{name}.values()")
            plain.append(f"all(map(_nodeless_type, map(type, {name}.values())))")
            continue
        if p.kind is kind.KEYWORD_ONLY and not starred:
            starred = True
            params.append("*")
        params.append(name if p.default is kind.empty else f"{name}=_default_{name}")
        passed.append(f"{name}={name}" if p.kind is kind.KEYWORD_ONLY else name)
        checks.append(f"(_untagged_type(type({name})) or _untagged({name}))")
        values.append(name)
        plain.append(f"_nodeless_type(type({name}))")
        if p.kind is kind.POSITIONAL_ONLY:
            params.append("/")  # the marker after every positional-only one: the last one stays
    while params.count("/") > 1:
        params.remove("/")
    lines = [f"def _op({', '.join(params)}):", f"    _out = _fn({', '.join(passed)})"]
    if parameters and parameters[0].kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD):
        head = parameters[0].name
        lines += [
            f"    if _untagged_type(type({head})):",
            f"        if {' and '.join(checks[1:]) or 'True'}:",
            "            return _out",
            f"    elif _tagged_type(type({head})) and {' and '.join([*plain[1:], 'isinstance(_out, _Node)'])}:",
            f"        return _ruled_one(_out, {head})",
            f"    elif _untagged({head}) and {' and '.join(checks[1:]) or 'True'}:",
            "        return _out",
        ]
    else:
        lines += [f"    if {' and '.join(checks) or 'True'}:", "        return _out"]
    lines.append(f"    return _ruled_out(_out, ({''.join(v + ', ' for v in values)}))")
    return "\n".join(lines) + "\n"


def tag_rule(fn: F) -> F:
    """Apply the propagation rule to what ``fn`` returns: every node in it, wherever it sits (a node,
    a tensorclass, or any tree of the ``"tdtree"`` namespace holding them).

    The node inputs are the nodes in the arguments, found the same way. The gate
    tells the arguments by their types: an argument whose type is a tensor, a
    number, a str, a function or an untagged node type passes at one lookup, and
    when all pass, ``fn``'s result is returned as it is (untagged inputs make
    untagged results: the factories build no tags). When the first argument is a
    tagged node, the others are of types that hold no node and the result is a
    node (a method of a tagged node), that node is the one input, with no walk.
    Other arguments are walked for nodes.

    Under ``torch.compile`` the decision is made while tracing, from the fake
    tensors' storages. A leaf whose size depends on data (``td[mask]``) counts
    as holding data, since the trace cannot know its size: compiled, a masked
    index drops the tags even for an all-False mask, where eager keeps them
    (every leaf then holds zero bytes). Dropping is the safe side of the rule.
    """
    namespace: dict[str, Any] = {
        "_fn": fn,
        "_untagged_type": is_untagged_type,
        "_untagged": _untagged,
        "_all_untagged": _all_untagged,
        "_ruled_out": _ruled_out,
        "_ruled_one": _ruled_one,
        "_tagged_type": is_tagged_type,
        "_nodeless_type": is_nodeless_type,
        "_Node": Node,
    }
    for p in inspect.signature(fn).parameters.values():
        if p.name.startswith("_"):
            # the wrapper's own names (_fn, _out, _default_*, ...) start with one
            raise TypeError(f"tag_rule: {fn.__qualname__} has a parameter {p.name!r}; rename it without the leading _")
        if p.default is not inspect.Parameter.empty:
            namespace[f"_default_{p.name}"] = p.default
    exec(_gate_source(fn), namespace)  # noqa: S102 - source built above from fn's own parameter names
    op: Any = functools.wraps(fn)(namespace["_op"])
    return op  # type: ignore[no-any-return]
