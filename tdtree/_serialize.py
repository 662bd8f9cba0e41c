"""One-file save and safe load of nodes.

``save`` writes, in ``torch.save``'s format, a plain dict: a JSON string describing
the tree (the memmap metadata format: keys, batch sizes, devices, dtypes,
shapes), one uint8 tensor ``packed`` holding the bytes of every cpu leaf whose
dtype is plain bytes (each at the next multiple of 64 bytes, in leaf order),
and the list ``tensors`` of the other leaves. ``load`` reads it back with
``torch.load(weights_only=True)``, which rebuilds only tensors and plain data
and never runs code found in the file, then checks every fact the JSON claims
before building the node; packed leaves are views of the loaded buffer.

Parameters: the file holds every leaf's values as plain tensors (``load``
refuses anything else); the description lists the leaves that were
``nn.Parameter`` (``"parameters"``) and the leaves that required grad
(``"grad"``), and ``load`` makes them so again, so a
:func:`tdtree.nn.from_module` node comes back as Parameters with their
``requires_grad``. Both lists are optional (absent: none), so files written
before them still load, and a reader that does not know them loads the values.

How: ``torch.save`` writes the dict with its storages' bytes left out
(``torch.serialization.skip_data``: the records are reserved and read as
zeros), then each leaf's bytes are written into its record, straight from the
leaf's memory (see ``_torch_private.save_skeleton``). No buffer of all the
leaves is ever made, so a save costs one write of each leaf. The file is what
``torch.save`` of the same dict writes, except that its tensor records carry
no CRC-32 (as ``torch.save`` under ``set_crc32_options(False)`` writes them;
``torch.load`` does not check one), so every file of every version loads.

Why packed: ``torch.load`` spends ~0.1 ms in Python on every tensor record of
a file, so a model's few hundred weights cost more to unpickle than to read;
one buffer is one record, whatever the number of leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import zipfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._base import Node
from ._files import remove_stale, temp_path
from ._keys import display
from ._kinds import kind
from ._memmap import as_bytes, checked_size, mappable, open_regular, read_header
from ._names import name_of
from ._tags import Locked, retag, tag_rule
from ._torch_private import save_skeleton, storage_id
from ._treefile import assemble, describe
from .errors import SerializationError

__all__ = ["save", "load"]

FORMAT = "tdtree-save"
VERSION = 3
# Packed leaves start at multiples of this, as fresh allocations do, so every
# dtype views them and vectorised kernels see aligned data.
ALIGN = 64
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values in a storage of their own size (a view of a larger storage would save all of it)."""
    t = tensor.detach().resolve_conj().resolve_neg()
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _packable(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.layout == torch.strided and mappable(tensor.dtype)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Where each of ``tensors`` starts in the packed buffer (a multiple of ``ALIGN``), and its size."""
    starts = []
    end = 0
    for t in tensors:
        start = _aligned(end)
        starts.append(start)
        end = start + t.numel() * t.element_size()
    return starts, end


def _write_at(fd: int, data: torch.Tensor, offset: int) -> None:
    """Write the flat uint8 cpu tensor ``data`` into the file ``fd`` at ``offset``, from its own memory."""
    view = memoryview(data.numpy())  # type: ignore[arg-type]  # numpy stubs lack Buffer
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor``'s storage, as torch.save writes them, as a flat uint8 cpu tensor."""
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
    return raw.cpu()


def _unsavable(tensor: torch.Tensor) -> str | None:
    """Why ``save`` cannot write ``tensor`` as a leaf that ``load`` reads back (None: it can)."""
    odd = kind(tensor)
    if odd is not None:
        return f"is {odd[0]} (convert it first with {odd[1]})"
    if type(tensor) not in (torch.Tensor, nn.Parameter):
        return f"is a {type(tensor).__name__}"
    return None


def _reason(err: Exception) -> str:
    """The part of torch's refusal that names what was refused (not its advice to load unsafely)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    named = [ln for ln in lines[1:] if not ln.startswith(("Check the documentation", "Please file an issue"))]
    return " ".join(named) or (lines[0] if lines else type(err).__name__)


# A save file is torch's zip of stored records; deflated ones (a hand-made file) could expand to far
# more memory than the file takes, so they are refused, as is a record larger than the file. torch
# reads a file as a zip when it starts as one, so such a file must be a zip that zipfile reads whole:
# one whose directory zipfile cannot read is refused rather than left to torch's laxer reader.
def _check_records(f: Any, path: str) -> None:
    size = os.fstat(f.fileno()).st_size
    head = f.read(4)
    f.seek(0)
    if head != b"PK\x03\x04":
        return  # torch's legacy format, or not torch's at all: torch.load refuses what it cannot read
    try:
        infos = zipfile.ZipFile(f).infolist()
    except Exception as err:  # noqa: BLE001 - zipfile raises many kinds (BadZipFile, NotImplementedError, ...)
        raise SerializationError(
            f"cannot load {path}: it is not a tdtree save file ({type(err).__name__}: {err})"
        ) from None
    finally:
        f.seek(0)
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > size:
            raise SerializationError(
                f"refused to load {path}: its record {info.filename[:80]!r} is compressed or larger than the file "
                f"({info.file_size} bytes); tdtree.save writes stored records only"
            )


def _refused_leaf(value: torch.Tensor, seen: set[int]) -> str | None:
    """Why a tensor found in a save file is refused as a leaf (None: taken; its storage joins ``seen``).

    A leaf is a plain, strided tensor with a storage of its own, laid out as save()
    writes it (compact): no subclass or Parameter, no sparse tensor, no view that
    shares its storage with another leaf or the buffer. Meta leaves (no data) load.
    """
    if type(value) is not torch.Tensor:
        return f"is a {type(value).__name__}, not a plain tensor"
    if value.layout != torch.strided:
        return f"has layout {value.layout}: only strided tensors are leaves"
    if value.is_meta:
        return None  # no data, no storage: nothing to alias or allocate
    storage = value.untyped_storage()
    if value.numel() and (
        not value.is_contiguous()
        or value.storage_offset() != 0
        or storage.nbytes() != value.numel() * value.element_size()
    ):
        return "is not a compact tensor of its own storage (a view, an expanded tensor, or a shared storage)"
    key = storage_id(storage)
    if value.numel() and key in seen:
        return "shares its storage with another leaf or with the packed buffer"
    seen.add(key)
    return None


def _indices(listed: object, what: str, corrupt: Callable[[str], Exception]) -> set[int]:
    """The leaf indices of a description's list (sorted, distinct ints), or ``corrupt`` when it is not one."""
    if type(listed) is not list or any(type(i) is not int or i < 0 for i in listed) or listed != sorted(set(listed)):
        raise corrupt(f"malformed list of {what} leaves {str(listed)[:80]}")
    return set(listed)


def save(node: Node, path: str | os.PathLike[str]) -> None:
    """Write ``node`` to the file ``path``, replacing it atomically (written aside, then renamed).

    Leaves are saved as their values (detached; a view of a larger tensor as
    a compact copy) on their devices, cpu leaves of byte-laid-out dtypes in
    one shared buffer; keys, batch sizes, devices, the ``Locked`` tag, which
    leaves are ``nn.Parameter`` and which require grad are kept. Read it back
    with :func:`load`.

    Args:
        node: the node to save (any device; its tags do not matter, only ``Locked`` is recorded).
        path: the file to write (str or path); its directory must exist.

    Returns:
        None; ``node`` is not changed.

    The file is written under a temporary name beside ``path`` (``.NAME.PID.XXXX.tmp``) and renamed
    over it; the temporary files that earlier saves to ``path`` left when their process was killed
    are removed first (those of live processes are kept), as :meth:`~tdtree.TensorDict.memmap` does for its directories.

    Raises:
        TypeError: ``node`` is not a node.
        SerializationError: a leaf is of a kind :func:`load` could not read back (a tensor subclass,
            sparse or nested); nothing is written.
        OSError: the file cannot be written (a full disk: errno ``ENOSPC``; a file-size limit:
            ``EFBIG``), naming ``path``; the old file at ``path`` is left as it was and nothing beside it.

    Example:
        >>> import tempfile, torch, tdtree
        >>> td = tdtree.TensorDict({"a": torch.zeros(2)}, batch_size=[2])
        >>> path = tempfile.mkdtemp() + "/td.pt"
        >>> tdtree.save(td, path)
        >>> tdtree.load(path)["a"]
        tensor([0., 0.])
    """
    if not isinstance(node, Node):
        raise TypeError(f"tdtree.save takes a node, got {type(node).__name__}")
    tree, leaves = describe(node, cpu=False)
    path = os.path.abspath(os.fspath(path))
    for key, t in leaves:
        refused = _unsavable(t)
        if refused:
            raise SerializationError(
                f"cannot save {path}: leaf {display(key)!r} {refused}; tdtree.save writes plain strided "
                "tensors (and nn.Parameter), the leaves tdtree.load reads back"
            )
    packed = [i for i, (_, t) in enumerate(leaves) if _packable(t)]
    starts, total = _layout([leaves[i][1] for i in packed])
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "type": name_of(type(node)._root),
        "tags": sorted(t.name for t in type(node)._tags),
        "tree": tree,
        "packed": packed,
        "parameters": [i for i, (_, t) in enumerate(leaves) if type(t) is nn.Parameter],
        "grad": [i for i, (_, t) in enumerate(leaves) if t.requires_grad],
    }
    in_buffer = set(packed)
    # the buffer's pages are never touched: its record is filled from the leaves themselves
    buffer = torch.empty(total, dtype=torch.uint8)
    apart = [_compact(t) for i, (_, t) in enumerate(leaves) if i not in in_buffer]
    payload = {"tdtree": json.dumps(doc, ensure_ascii=True, separators=(",", ":")), "packed": buffer, "tensors": apart}
    parent, name = os.path.split(path)
    remove_stale(parent, name)
    tmp = temp_path(parent, name)
    try:
        # O_EXCL, mode 0o666: the umask applies, as to any file the user writes
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | _CLOEXEC, 0o666)
    except OSError as err:
        raise OSError(err.errno, f"cannot save {path}: {err.strerror}", tmp) from err
    try:
        with os.fdopen(fd, "w+b") as f:
            offsets = save_skeleton(payload, f, [buffer, *apart])
            for i, start in zip(packed, starts):
                _write_at(fd, as_bytes(leaves[i][1]), offsets[0] + start)
            for t, offset in zip(apart, offsets[1:]):
                if offset >= 0:
                    _write_at(fd, _storage_bytes(t), offset)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError) and not isinstance(err, SerializationError):
            # a full disk, a quota, a file size limit: the errno, and the file it stopped
            raise OSError(err.errno, f"cannot save {path}: {err.strerror or err}") from err
        raise


@tag_rule
def load(path: str | os.PathLike[str], device: torch.device | str | None = None) -> Any:
    """The node :func:`save` wrote to ``path``; safe on untrusted files.

    Args:
        path: the file.
        device: when given, every leaf is loaded onto it and it becomes the
            node's device; else leaves return to the devices they were saved from.

    Returns:
        A new node (fresh storage, the leaves saved in the packed buffer being
        disjoint views of one new storage) with the saved keys, values and batch sizes,
        tagged ``Locked`` when the saved node was. Leaves saved from an
        ``nn.Parameter`` are Parameters again, and leaves that required grad
        require it (each a leaf of autograd). ``Shared`` and ``Memmap``
        are claims about storage that a loaded file does not make: call
        ``share_memory()`` or ``memmap()`` on the result for them.

    ``path`` may be a symlink (it is the user's own path), but what it names must
    be a regular file: a FIFO or a device is refused without reading it.

    Raises:
        SerializationError: naming the file, when it is not a regular file, holds
            anything but tensors and plain data (nothing in it is run or rebuilt),
            holds a compressed record or one larger than the file, is not a tdtree
            save file, its description does not match its tensors (shapes too large
            included), or a leaf is not what save writes (plain, strided, one storage each).
        FileNotFoundError: ``path`` does not exist.
    """
    path = os.fspath(path)
    with open_regular(path, SerializationError, "save file") as f:
        _check_records(f, path)
        try:
            payload = torch.load(f, map_location=device, weights_only=True)
        except pickle.UnpicklingError as err:
            raise SerializationError(
                f"refused to load {path}: it is not a tdtree save file, or it holds objects other than tensors "
                f"and plain data, which safe loading never rebuilds ({_reason(err)})"
            ) from None
        except SerializationError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure to parse an untrusted file is the same error
            raise SerializationError(
                f"cannot load {path}: it is not a tdtree save file ({type(err).__name__}: {err})"
            ) from None

    def corrupt(reason: str) -> SerializationError:
        return SerializationError(f"corrupt tdtree save file {path}: {reason}")

    if (
        type(payload) is not dict
        or type(payload.get("tdtree")) is not str
        or type(payload.get("tensors")) is not list
        or type(payload.get("packed")) is not torch.Tensor
    ):
        raise corrupt("it does not hold a tdtree description, a packed buffer and a list of tensors")
    try:
        doc = json.loads(payload["tdtree"])
    except (ValueError, RecursionError) as err:
        raise corrupt(f"its description is not JSON ({err})") from None
    root, doc = read_header(doc, FORMAT, (2, VERSION), path, corrupt, SerializationError)
    tag_names = doc.get("tags")
    if type(tag_names) is not list:
        raise corrupt(f"malformed tags {tag_names!r}")
    packed = _indices(doc.get("packed"), "packed", corrupt)
    parameters = _indices(doc.get("parameters", []), "parameter", corrupt)
    grad = _indices(doc.get("grad", []), "grad-requiring", corrupt)
    buffer = payload["packed"]
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
        raise corrupt(
            f"its packed buffer should be a contiguous 1-d uint8 tensor, found {buffer.dtype} {tuple(buffer.shape)}"
        )
    tensors = payload["tensors"]
    seen = {storage_id(buffer.untyped_storage())} if buffer.numel() else set()
    if type(buffer) is not torch.Tensor:
        raise corrupt(f"its packed buffer is a {type(buffer).__name__}, not a plain tensor")
    offset = 0  # bytes of the buffer taken so far
    in_buffer = 0  # leaves taken from the buffer
    apart = 0  # leaves taken from the list

    def leaf(index: int, dtype: torch.dtype, shape: torch.Size, key: tuple[str, ...]) -> torch.Tensor:
        value = values(index, dtype, shape, key)
        if index not in parameters and index not in grad:
            return value
        if index in grad and not (dtype.is_floating_point or dtype.is_complex):
            raise corrupt(f"leaf {display(key)!r} of dtype {dtype} cannot require grad")
        return nn.Parameter(value, requires_grad=index in grad) if index in parameters else value.requires_grad_()

    def values(index: int, dtype: torch.dtype, shape: torch.Size, key: tuple[str, ...]) -> torch.Tensor:
        nonlocal offset, in_buffer, apart
        if index in packed:
            if not mappable(dtype):
                raise corrupt(f"leaf {display(key)!r} of dtype {dtype} cannot be packed")
            start = _aligned(offset)
            offset = start + checked_size(shape, dtype, corrupt, key)
            if offset > buffer.numel():
                raise corrupt(f"its packed buffer holds {buffer.numel()} bytes, too few for leaf {display(key)!r}")
            in_buffer += 1
            return buffer[start:offset].view(dtype).view(shape)
        value = tensors[apart] if apart < len(tensors) else None
        if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.shape != shape:
            found = None if not isinstance(value, torch.Tensor) else f"{value.dtype} {tuple(value.shape)}"
            raise corrupt(f"leaf {display(key)!r} should be {dtype} {tuple(shape)}, found {found}")
        refused = _refused_leaf(value, seen)
        if refused:
            raise corrupt(f"leaf {display(key)!r} {refused}")
        apart += 1
        return value

    def node_device(name: str | None) -> torch.device | None:
        if device is not None:
            return torch.device(device)
        try:
            return None if name is None else torch.device(name)
        except RuntimeError:
            raise corrupt(f"unknown device {name!r}") from None

    node = assemble(doc.get("tree"), doc["version"] != VERSION, root, leaf, corrupt, node_device)
    if apart != len(tensors):
        raise corrupt(f"it holds {len(tensors)} separate tensors for {apart} leaves")
    if offset != buffer.numel():
        raise corrupt(f"its packed buffer holds {buffer.numel()} bytes for {offset} bytes of leaves")
    if in_buffer != len(packed):
        raise corrupt(f"its list of packed leaves names {len(packed)} leaves, it holds {in_buffer}")
    beyond = [i for i in parameters | grad if i >= in_buffer + apart]
    if beyond:
        raise corrupt(
            f"its lists of parameters and grad-requiring leaves name leaf {beyond[0]}; it holds {in_buffer + apart}"
        )
    return retag(node, frozenset({Locked}) if "Locked" in tag_names else frozenset())
