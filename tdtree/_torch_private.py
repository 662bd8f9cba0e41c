"""The names from torch's private internals that tdtree needs, in one place.

torch has no public way to ask these questions, so each is read from a private
name here and nowhere else; ``tests/test_torch_private.py`` fails loudly when a
torch release moves one of them. Checked against torch 2.13.0 (the version the
Makefile pins).

* Whether a ``torch.func`` transform is running: ``torch._foreach_*`` kernels
  have no batching rule, so the leaf-wise maps run per-leaf ops inside a
  transform (one test, made once per operation in the map layer).
* The tensor a functorch wrapper (a batched or grad-tracking tensor, at any
  nesting level) wraps: its storage is the wrapper's storage identity, so the
  tag rule and the alias check work inside transforms as they do in eager.
* A storage's identity: ``id()`` of its Python object, which torch keeps one of
  per storage for as long as the storage lives (as it does for tensors), so that
  views share it; defined for the fake tensors dynamo traces with too, where
  ``data_ptr()`` is not. torch does not document this, so the test checks it. A set
  of the storage objects themselves is a set by that identity, since
  ``UntypedStorage`` keeps ``object``'s ``__eq__`` and ``__hash__``; the test
  checks that too (by value, two storages of equal bytes would be one member).
* How the tag rule runs its storage test under ``torch.compile``, as plain Python on the fake
  tensors while dynamo traces, without a graph break: a function marked with
  ``torch.compiler.allow_in_graph`` (public) that returns a ``torch.Size``, whose ints dynamo takes
  as constants (not documented). ``torch._dynamo.nonstrict_trace`` would do it too, at several
  times the trace cost of the rest of the rule: dynamo traces ``torch.utils._pytree.tree_flatten``
  of its arguments, twice, bytecode by bytecode.
* Whether a storage holds bytes when its size is data-dependent (``td[mask]``
  under ``torch.compile``): ``guard_or_true`` answers without guarding on a
  size the trace cannot know, and the answer is "it may", so the rule fails safe.
* torch's pytree registry (``torch.utils._pytree``): how ``torch.func``, ``torch.compile`` and
  ``torch.export`` see nodes and tensorclasses as trees; it has no public spelling.
* ``nn.Module``'s ``_parameters`` / ``_buffers`` / ``_modules`` dicts, read and written (for the
  call) by ``tdtree.nn`` (``from_module``, ``functional_call``) as ``torch.func.functional_call``
  itself does; they are attributes of every module, so they are not re-exported here, and the test
  checks a module's call reads what is put in them.
* ``default_collate_fn_map`` (``torch.utils.data._utils.collate``): the table of element types that
  ``torch.utils.data.default_collate`` consults first. torch's own docstring of ``collate`` says to
  extend ``default_collate`` by adding to it in place; it has no public spelling. Nodes and
  tensorclasses are added there, so a ``DataLoader`` with its default ``collate_fn`` gives a node
  (an instance) per batch.
* Which callables are higher-order operators (``torch._ops.HigherOrderOperator``), and how to call
  one past ``__torch_function__`` overrides (``torch._C.DisableTorchFunctionSubclass``): dynamo asks
  every argument's ``__torch_function__`` before tracing a higher-order operator (``cond``,
  ``invoke_subgraph``, activation checkpointing, ...), a node included, where eager torch flattens
  the node as a pytree and never asks it. A node hands such a call straight back to torch.
* Whether a tensor's storage is memory torch shares between processes as it is
  (``share_memory()`` copies nothing when every leaf's is): ``is_shared()`` is
  also True for a storage mapped from a file (``torch.from_file``, a memmap,
  private mappings included), which no process can be handed and whose private
  writes no other process sees. Torch's shared memory is told from a file
  mapping by ``UntypedStorage._get_shared_fd``: the file descriptor its own
  shared memory keeps (``file_descriptor`` strategy), -1 for a file mapping, and
  a RuntimeError for a storage with no such mapping, which for a shared cpu
  storage means torch's managed shared memory (``file_system`` strategy); each
  strategy sends only its own kind without moving it.
* For ``tdtree.control``: ``scan``, ``associative_scan`` and ``map``, which torch offers only under
  ``torch._higher_order_ops`` (``cond`` and ``while_loop`` are public).
* Where ``torch.save`` puts each storage's bytes: ``tdtree.save`` writes the file with
  ``torch.serialization.skip_data`` (public, documented as a prototype: the records are reserved,
  their bytes left out) and then writes each storage's bytes into its record itself, from the
  leaves, with no copy of them into one buffer. Which record holds which storage is torch's
  format, not its API: storages are keyed ``data/0``, ``data/1``, ... in the order the pickler
  first meets them (``Storage._cdata`` telling them apart), and tensors on the meta device get no
  record. ``save_skeleton`` checks every record's size against its storage, so a torch that
  changes this fails loudly rather than writing a wrong file.
* For ``tdtree.testing``'s compile law: a backend that counts the frames it
  compiles, and dynamo's count of graph breaks.
* Whether ``torch.compile`` is tracing (``torch.compiler.is_compiling``): public, but asked here
  with the rest, so that one module says what tdtree asks torch.

Importing dynamo costs seconds, so nothing here imports it: the compile-time registrations
(``substitute_in_graph``, ``answered_while_tracing``) are kept until ``torch._dynamo`` is imported (by
``torch.compile``, ``torch.export`` or the user), and run right after that import, before dynamo
traces anything; when dynamo is already imported they run at once. ``guard_or_true`` is read from
``torch.fx.experimental.symbolic_shapes`` only for a symbolic size, which exists only once that
module is imported.

Every private name is read through :func:`needed`: a torch that lacks one raises
:class:`tdtree.errors.TorchVersionError` naming the name and torch's version, at the first use of
the name (``import tdtree`` for the eager ones, the import of dynamo for the compile ones, the
call for the testing ones), not an ``AttributeError`` deep in an operation.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import struct
import sys
import types
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, TypeVar

import torch

from .errors import TorchVersionError

__all__ = [
    "needed",
    "transforms_active",
    "unwrapped",
    "storages",
    "storage_ids",
    "storage_of",
    "storage_set",
    "storage_id",
    "holds_data",
    "in_shared_memory",
    "is_compiling",
    "substitute_in_graph",
    "answered_while_tracing",
    "compile_counter",
    "graph_breaks",
    "quiet_trace_log",
    "torch_pytree",
    "TreeSpec",
    "default_collate_fn_map",
    "HigherOrderOperator",
    "through_higher_order",
    "dynamo_higher_order_operators",
    "scan",
    "associative_scan",
    "hop_map",
    "save_skeleton",
]

F = TypeVar("F", bound=Callable[..., Any])


def needed(name: str) -> Any:
    """The object torch names ``name`` (dotted, from ``torch``), importing the modules on its path.

    Raises:
        TorchVersionError: this torch has no such name (the message names it and torch's version).
    """
    parts = name.split(".")
    value: Any = torch
    for i, part in enumerate(parts[1:], 2):
        try:
            value = getattr(value, part)
        except AttributeError:
            try:
                value = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                raise TorchVersionError(name, torch.__version__) from None
    return value


# One C call: dynamo folds it to a constant while tracing (it is on its list of such calls), so a
# compiled function takes the branch its transforms take, with no guard and no graph break.
transforms_active: Callable[[], bool] = needed("torch._C._are_functorch_transforms_active")

_is_wrapped = needed("torch._C._functorch.is_functorch_wrapped_tensor")
_get_unwrapped = needed("torch._C._functorch.get_unwrapped")

torch_pytree: types.ModuleType = needed("torch.utils._pytree")
if TYPE_CHECKING:  # the class itself for annotations (the module above is typed as a plain module)
    from torch.utils._pytree import TreeSpec
else:
    TreeSpec = needed("torch.utils._pytree.TreeSpec")
for _name in ("register_pytree_node", "MappingKey", "GetAttrKey"):
    needed(f"torch.utils._pytree.{_name}")

is_compiling: Callable[[], bool] = torch.compiler.is_compiling

default_collate_fn_map: dict[type, Callable[..., Any]] = needed(
    "torch.utils.data._utils.collate.default_collate_fn_map"
)

scan: Callable[..., Any] = needed("torch._higher_order_ops.scan")
associative_scan: Callable[..., Any] = needed("torch._higher_order_ops.associative_scan")
hop_map: Callable[..., Any] = needed("torch._higher_order_ops.map")


def unwrapped(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor under every functorch wrapper of ``tensor`` (``tensor`` itself when unwrapped)."""
    while _is_wrapped(tensor):
        tensor = _get_unwrapped(tensor)
    return tensor


_storage = torch.Tensor.untyped_storage

# The identity of a storage: its Python object, shared exactly by tensors viewing the same memory
# (a builtin, so that mapping it over many storages runs at C speed).
storage_id: Callable[[torch.UntypedStorage], int] = id


def storage_ids(tensors: Iterable[torch.Tensor]) -> Iterator[int]:
    """The storage identity of each of ``tensors``, seen through functorch wrappers.

    Asking a wrapper for its storage raises, so inside a transform each tensor
    is unwrapped first; outside one (the eager common path) the tensors are
    mapped at C speed, with no Python frame per tensor.
    """
    return map(storage_id, storages(tensors))


def storages(tensors: Iterable[torch.Tensor]) -> Iterator[torch.UntypedStorage]:
    """The untyped storage of each of ``tensors``, seen through functorch wrappers."""
    if transforms_active():
        tensors = map(unwrapped, tensors)
    return map(_storage, tensors)


def storage_set(tensors: Iterable[torch.Tensor]) -> set[torch.UntypedStorage]:
    """The storages of ``tensors`` (seen through functorch wrappers) as a set by identity: two tensors'
    storages are one member exactly when their ``storage_id`` is equal, and a lookup in it needs no
    ``id()`` per storage (``UntypedStorage`` keeps ``object``'s ``__eq__`` and ``__hash__``)."""
    return set(storages(tensors))


def storage_of(tensor: torch.Tensor) -> torch.UntypedStorage:
    """The untyped storage of ``tensor``, seen through functorch wrappers: :func:`storages` for one
    tensor, without the iterators."""
    return _storage(unwrapped(tensor) if transforms_active() else tensor)


def holds_data(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` holds any bytes; True when its size is known only at run time.

    In eager, and for sizes a compiled trace knows, this is ``nbytes() != 0``. A
    data-dependent size (the result of a boolean mask under ``torch.compile``)
    cannot be turned into a bool while tracing: such a storage counts as holding
    data, so the tag rule drops tags rather than claim them for new memory.
    """
    nbytes = storage.nbytes()
    if type(nbytes) is int:
        return nbytes != 0
    # a symbolic size: made by a ShapeEnv, so symbolic_shapes is imported
    return torch.fx.experimental.symbolic_shapes.guard_or_true(nbytes != 0)


HigherOrderOperator = needed("torch._ops.HigherOrderOperator")
_no_subclass_functions = needed("torch._C.DisableTorchFunctionSubclass")


def through_higher_order(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """``func(*args, **kwargs)`` with ``__torch_function__`` overrides off for the call, when ``func`` is a
    higher-order operator; NotImplemented for any other function.

    Only dynamo asks a node about a higher-order operator (eager torch flattens the node as a
    pytree, so the operator sees its tensors and never asks): dynamo traces this call as the
    operator itself, which takes the node as the pytree it is, as it takes a dict. The overrides
    stay off while dynamo traces the operator's body, as they do for a tensor subclass whose
    ``__torch_function__`` passes the operator on (torch's default for subclasses).
    """
    if not isinstance(func, HigherOrderOperator):
        return NotImplemented
    with _no_subclass_functions():
        return func(*args, **(kwargs or {}))


def dynamo_higher_order_operators() -> list[str]:
    """The names of the higher-order operators whose dynamo handler asks its arguments'
    ``__torch_function__`` first (``TorchHigherOrderOperatorVariable.call_function``, inherited, not
    overridden), sorted: the operators ``through_higher_order`` hands back to torch. For the test
    that runs each with a node, so that a torch release adding one fails there, by name."""
    # dynamo's handlers load with dynamo's tracer, not with every import of tdtree
    import torch._higher_order_ops as hops
    from torch._dynamo.variables import higher_order_ops as handlers

    asks = handlers.TorchHigherOrderOperatorVariable.call_function
    registry: dict[str, Any] = handlers._hop_name_to_variable_class  # name -> handler class
    named = {name for name, handler in registry.items() if inspect.unwrap(handler.call_function) is asks}
    # any other BaseHOP is traced by BaseHOPVariable, which asks as well
    named |= {name for name, op in torch._ops._higher_order_ops.items() if isinstance(op, hops.BaseHOP)}
    return sorted(named)


# a C method torch's stubs do not declare
_shared_fd: Callable[[torch.UntypedStorage], int] = needed("torch.UntypedStorage._get_shared_fd")


def in_shared_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s storage is shared memory torch hands to other processes without moving it.

    True for CUDA tensors (torch shares them by IPC; ``is_shared()`` says so) and
    for cpu storages in the shared memory of torch's current sharing strategy
    (``share_memory_()``, or received from another process); False for a storage
    mapped from a file, on another device, in private memory, or in the other
    strategy's shared memory (sending it would move it).
    """
    if tensor.is_cuda:
        return True
    storage = tensor.untyped_storage()
    if tensor.device.type != "cpu" or not storage.is_shared():
        return False
    # each sharing strategy sends its own kind of shared memory as it is, and moves any other storage
    fd_strategy = torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    try:
        fd = _shared_fd(storage)
    except RuntimeError:  # shared, and no fd-keeping mapping: torch's managed shared memory
        return not fd_strategy
    return fd_strategy and fd >= 0


_DYNAMO = "torch._dynamo"
_pending: list[Callable[[], None]] = []


def _when_dynamo(register: Callable[[], None]) -> None:
    """Run ``register`` now if dynamo is imported, else right after its import."""
    if _DYNAMO in sys.modules:
        register()
        return
    _pending.append(register)
    if not any(isinstance(f, _AfterDynamo) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamo())


_refused: list[TorchVersionError] = []


class _AfterDynamo(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` as the finders after it do, with a loader that runs the pending
    registrations once the module has run (so before dynamo can trace anything). When one raised,
    every later import of dynamo raises the same error (the module half set up is not kept)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DYNAMO:
            return None
        if _refused:
            raise TorchVersionError(_refused[0].name, _refused[0].version)
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenRegister(spec.loader)
        return spec


class _ThenRegister(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader  # the module keeps torch's own loader (its source, its files)
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            for register in _pending:
                register()
        except TorchVersionError as error:
            _refused.append(error)
            sys.meta_path.insert(0, _AfterDynamo())
            raise
        _pending.clear()


def substitute_in_graph(original: Callable[..., Any], **options: Any) -> Callable[[F], F]:
    """``torch.compiler.substitute_in_graph(original, **options)``, registered when dynamo is imported:
    compiled code runs the decorated function where it meets ``original``. Returns the decorated
    function unchanged (eager code calls ``original``)."""

    def decorate(traced: F) -> F:
        _when_dynamo(lambda: needed("torch.compiler.substitute_in_graph")(original, **options)(traced))
        return traced

    return decorate


def answered_while_tracing(fn: F) -> F:
    """Mark ``fn`` for ``torch.compiler.allow_in_graph`` when dynamo is imported; returns ``fn`` itself.

    ``fn`` takes tensors, lists of tensors and lists of ints, and returns a ``torch.Size``. Under
    ``torch.compile`` dynamo does not trace it: it calls it once, on the fake tensors, while tracing,
    and takes the ints of the ``torch.Size`` it returns as constants (dynamo's rule for a traced
    output that is a ``torch.Size`` of ints, which torch does not document: the test checks it).
    Eager code calls ``fn`` directly. The graph keeps the call, whose result nothing reads:
    AOTAutograd traces it to nothing, and only the "eager" backend, which runs dynamo's graph as it
    is, calls it again on each run.
    """
    _when_dynamo(lambda: torch.compiler.allow_in_graph(fn))
    return fn


def compile_counter(backend: str) -> Any:
    """A ``torch.compile`` backend that compiles with the backend named ``backend``, counts the
    frames it compiles (``.frame_count``: how ``tdtree.testing.check_compiles`` sees recompiles) and
    keeps the graphs dynamo hands it (``.graphs``)."""
    return needed("torch._dynamo.testing.CompileCounterWithBackend")(backend)


def graph_breaks() -> int:
    """How many graph breaks dynamo has counted in this process (``torch._dynamo.utils.counters``)."""
    return sum(needed("torch._dynamo.utils.counters")["graph_break"].values())


def _drop(record: logging.LogRecord) -> bool:
    return False


@contextlib.contextmanager
def quiet_trace_log() -> Iterator[None]:
    """Inside: torch's structured trace log (the logger ``torch.__trace``) hands no record to any handler,
    unless ``TORCH_TRACE`` asks for the trace. The logger is always at DEBUG and does not propagate, so
    pytest attaches its capture handler to it directly, and a failing test would print every record of
    every compile it ran (hundreds of lines with no message) under "Captured log call"."""
    if os.environ.get("TORCH_TRACE"):
        yield
        return
    log = logging.getLogger("torch.__trace")
    log.addFilter(_drop)
    try:
        yield
    finally:
        log.removeFilter(_drop)


_LOCAL_HEADER = struct.Struct("<4s22xHH")  # a zip local file header: signature ... name and extra lengths


def save_skeleton(obj: Any, file: IO[bytes], tensors: list[torch.Tensor]) -> list[int]:
    """``torch.save(obj, file)`` with every storage's bytes left out (the file holds zeros there),
    and, for each of ``tensors`` (every tensor of ``obj``, strided, in the order the pickler meets
    them), the offset in ``file`` where its storage's bytes go (-1 for a meta tensor: no record)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Serializing tensors on the meta device", UserWarning)
        with torch.serialization.skip_data():
            torch.save(obj, file)
    file.flush()
    keys: dict[int, str] = {}
    for t in tensors:
        if not t.is_meta:
            keys.setdefault(t.untyped_storage()._cdata, str(len(keys)))
    with zipfile.ZipFile(file) as archive:
        records = {info.filename.split("/", 1)[-1]: info for info in archive.infolist() if "/data/" in info.filename}
    if len(records) != len(keys):
        raise RuntimeError(f"torch.save wrote {len(records)} storage records for {len(keys)} storages")
    offsets = []
    for t in tensors:
        if t.is_meta:
            offsets.append(-1)
            continue
        info = records.get(f"data/{keys[t.untyped_storage()._cdata]}")
        nbytes = t.untyped_storage().nbytes()
        if info is None or info.file_size != nbytes or info.compress_type != zipfile.ZIP_STORED:
            raise RuntimeError(f"torch.save's record of a {nbytes}-byte storage is not where tdtree expects it")
        file.seek(info.header_offset)
        signature, name_len, extra_len = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
        if signature != b"PK\x03\x04":
            raise RuntimeError("torch.save's zip record has no local header where its directory says")
        offsets.append(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
    return offsets
