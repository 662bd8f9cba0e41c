"""Memory-mapped nodes: one file per leaf under a directory, described by one JSON file.

Layout of a memmap directory ``prefix`` (format version 2; version 1, still read, nested the tree)::

    prefix/meta.json          format, version, node type, tags, and the tree, flat
                              (see _treefile.describe): every node's key, batch_size, device and
                              number of entries, every leaf's key, dtype, shape and
                              index, in depth-first canonical order
    prefix/leaf-000000.bin    the raw bytes of leaf 0 (C order), and so on

Files are named by the leaf's index in depth-first canonical order; keys live
only in the JSON. No key can name a file, so no key can reach outside
``prefix`` whatever it spells (``/``, ``..``, a thousand characters).

A directory is written under a temporary name next to ``prefix`` (carrying
the writer's pid) and renamed into place once complete, so an error leaves the
old directory or none, never a half-written one; the temporary directories of a
writer that was killed are removed by the next write to the same prefix.
``existsok=True`` replaces only an empty directory or one tdtree wrote that
holds nothing but its ``meta.json`` and the leaf files it names. Durability
against power loss (fsync) is not attempted.

Reading opens ``prefix`` once (not through a symlink) and every file relative
to that descriptor (see :mod:`tdtree._files`), so a load maps one directory
generation even while another process replaces ``prefix``, and ``memmap``
returns the files it wrote. Modes are numpy's: ``"r+"`` shared, ``"r"``
read-only (the storages are recorded, and every in-place writer refuses them,
views included), ``"c"`` private copy-on-write. A leaf's storage is mapped
through the descriptor opened under the directory, so its ``filename`` is
``/proc/self/fd/N`` (shared) or None (private); :func:`origin` names the file,
the mode and the identities of the files mapped, and :func:`reopen` maps them
again only while ``prefix`` still holds those very files (how a Memmap node
pickles, see :mod:`tdtree._pickle`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ._base import Node
from ._files import META_MAX, as_bytes, checked_size, map_regular, open_regular, remove_stale, swap_in
from ._inplace import mark_read_only
from ._keys import display
from ._kinds import kind
from ._names import name_of, root_named
from ._tags import Locked, Memmap, retag
from ._treefile import assemble, describe, flat_tree
from .errors import MemmapError

__all__ = [
    "META",
    "VERSION",
    "leaf_name",
    "mappable",
    "read_header",
    "memmap",
    "load",
    "Origin",
    "origin",
    "reopen",
]

META = "meta.json"
FORMAT = "tdtree-memmap"
VERSION = 2
_TAGS: frozenset = frozenset({Memmap, Locked})

# Dtypes whose values are plain bytes, element by element: what a file can hold.
# Quantized, bit and sub-byte dtypes have no such layout and are refused.
_MAPPABLE = frozenset(
    getattr(torch, name)
    for name in (
        "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64"
        " complex32 complex64 complex128 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu"
    ).split()
    if isinstance(getattr(torch, name, None), torch.dtype)
)


class Origin(NamedTuple):
    """Where a mapped storage's bytes come from: directory, leaf index, mode, and the identities found
    when mapping of the metadata file ``(st_dev, st_ino, st_size, st_mtime_ns)`` (never written in place,
    and new in every directory written: it names one generation) and of the leaf file ``(st_dev, st_ino)``
    (whose mtime moves with every shared write)."""

    prefix: str
    leaf: int
    mode: str
    meta: tuple[int, int, int, int]
    file: tuple[int, int]


# data_ptr of every storage this module mapped -> its Origin. It is how a Memmap node pickles by
# reference: private (read-only, copy-on-write) mappings keep no file name.
_ORIGIN: dict[int, Origin] = {}


def leaf_name(index: int) -> str:
    return f"leaf-{index:06d}.bin"


def mappable(dtype: torch.dtype) -> bool:
    """Whether ``dtype``'s values are plain bytes, element by element (what a file or a byte buffer holds)."""
    return dtype in _MAPPABLE


def read_header(
    doc: object,
    fmt: str,
    versions: tuple[int, ...],
    source: str,
    corrupt: Callable[[str], Exception],
    error: type[Exception],
) -> tuple[type, dict[str, Any]]:
    """The node type a description (memmap metadata or save file) names, and the description,
    after checking its header.

    ``doc`` must be a dict of format ``fmt`` and one of ``versions``, naming a
    registered node type. A malformed header raises ``corrupt(reason)``; a
    well-formed one of another version raises ``error`` naming ``source``.
    """
    kind = fmt.removeprefix("tdtree-")
    if type(doc) is not dict or doc.get("format") != fmt:
        raise corrupt(f"it is not a tdtree {kind} description")
    version = doc.get("version")
    if type(version) is not int or version not in versions:
        read = ", ".join(map(str, versions))
        raise error(f"{source} has format version {version!r}; this tdtree reads versions {read}")
    root = root_named(doc.get("type"))
    if root is None:
        raise corrupt(f"unknown node type {doc.get('type')!r}")
    return root, doc


# -- writing --------------------------------------------------------------------------------


def _check_target(prefix: str, existsok: bool) -> None:
    """Refuse ``prefix`` unless it is absent, or (with ``existsok``) an empty directory or one that
    tdtree wrote and that holds nothing else: a meta.json of tdtree's format and exactly the leaf
    files it names. Nothing else is ever deleted.

    Another writer may swap its own directory in while this one looks (``swap_in``): the directory
    is told by the one ``lstat`` taken first, and a directory that no longer is the one ``prefix``
    names when a check fails was replaced meanwhile, so it was tdtree's and is no refusal.
    """
    try:
        seen = os.lstat(prefix)
    except FileNotFoundError:
        return
    if not existsok:
        raise MemmapError(f"{prefix} exists; pass existsok=True to replace it")
    if not stat.S_ISDIR(seen.st_mode):  # lstat: a symlink to a directory is not one
        raise MemmapError(f"{prefix} exists and is not a directory; memmap replaces only memmap directories")
    try:
        names = set(os.listdir(prefix))
    except FileNotFoundError:  # another writer is swapping its directory in
        return
    if not names:
        return
    try:
        doc, _ = _read_meta(prefix)
        tree = doc["tree"]
        count = _count_leaves(tree, doc["version"] != VERSION)
    except (MemmapError, FileNotFoundError, KeyError, TypeError, AttributeError, RecursionError):
        count = -1
    if count >= 0 and names == {META, *(leaf_name(i) for i in range(count))}:
        return
    if _moved(prefix, seen):
        return
    raise MemmapError(
        f"{prefix} is not a memmap directory that tdtree wrote (it holds other files, or its {META} is not "
        "tdtree's): memmap replaces only its own directories (or empty ones), never other files"
    )


def _moved(prefix: str, seen: os.stat_result) -> bool:
    """Whether ``prefix`` names another file than the one ``seen`` described (or none) now."""
    try:
        now = os.lstat(prefix)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino)


def _count_leaves(tree: Any, nested: bool) -> int:
    return sum(type(item) is dict and "leaf" in item for item in flat_tree(tree, nested, MemmapError))


def _read_meta(prefix: str, dir_fd: int | None = None, parse: bool = True) -> tuple[Any, tuple[int, int, int, int]]:
    """The parsed metadata file of ``prefix`` (a regular file, no symlink, read up to a bound; None
    unless ``parse``) and the identity of the file read (see :class:`Origin`)."""
    meta = os.path.join(prefix, META)
    try:
        with open_regular(
            META if dir_fd is not None else meta, MemmapError, "metadata file", dir_fd, follow=False
        ) as f:
            info = os.fstat(f.fileno())
            raw = f.read(META_MAX + 1) if parse else b""
    except FileNotFoundError:
        raise MemmapError(f"missing metadata file {meta}: {prefix} is not a memmap directory") from None
    except MemmapError as err:
        raise MemmapError(str(err).replace(f" {META} ", f" {meta} ")) from None
    except OSError as err:
        raise MemmapError(f"cannot read metadata file {meta}: {err}") from err
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if not parse:
        return None, identity
    if len(raw) > META_MAX:
        raise MemmapError(f"corrupt metadata file {meta}: larger than {META_MAX} bytes")
    try:
        return json.loads(raw), identity
    except (ValueError, RecursionError) as err:
        raise MemmapError(f"corrupt metadata file {meta}: {err}") from None


def _write_leaf(path: str, tensor: torch.Tensor) -> None:
    with open(path, "xb") as f:
        f.write(as_bytes(tensor).numpy())  # type: ignore[arg-type]  # numpy stubs lack Buffer


def _write_zeros(path: str, nbytes: int) -> None:
    # the file is sized, not written: its bytes read as zeros and take no memory (nor, on most file
    # systems, disk) until written
    with open(path, "xb") as f:
        f.truncate(nbytes)


def _write_json(path: str, doc: dict[str, Any]) -> None:
    # json.dumps, not json.dump: dump streams through the pure-Python encoder, several times slower
    text = json.dumps(doc, ensure_ascii=True, separators=(",", ":"))
    with open(path, "x", encoding="ascii") as f:
        f.write(text)


def memmap(
    node: Node,
    prefix: str | os.PathLike[str],
    existsok: bool = False,
    record: dict[str, Any] | None = None,
    values: bool = True,
) -> Any:
    """Write every leaf of ``node`` to its own file under ``prefix`` and return the mapped node.

    Args:
        node: the node to write; leaves are written as their values (a
            non-contiguous or expanded leaf as a contiguous copy), detached,
            from any device.
        prefix: the directory to create; its parent is created when missing.
        existsok: replace an existing memmap directory (or empty directory)
            at ``prefix``: the new one is written aside and renamed in, the
            old one renamed away and deleted.
        record: a tensorclass's JSON record (see :mod:`tdtree._tensorclass._layout`),
            stored in the metadata so that :func:`tdtree.load_memmap` gives the class back.
        values: write the leaves' values; when False only their shapes and dtypes are read (a
            leaf may be a meta tensor or an expanded view) and every file is created at its
            final size holding zeros, without the values ever being in memory.

    Returns:
        A node equal to ``node`` (zeros of its shapes and dtypes without ``values``) whose leaves are mapped from the files
        (read-write, shared with every process that maps them), on the CPU,
        tagged ``{Memmap, Locked}`` on every sub-node. This makes tags rather
        than following the rule, like :meth:`lock`.

    Raises:
        MemmapError: ``prefix`` exists (without ``existsok``, or it is not a
            memmap directory), a leaf's dtype cannot be mapped, a leaf is a meta
            tensor (with ``values``: it has none), or writing failed; nothing is
            left behind.
    """
    prefix = os.path.abspath(os.fspath(prefix))
    _check_target(prefix, existsok)
    tree, leaves = describe(node, cpu=True)
    for path, leaf in leaves:
        odd = kind(leaf)
        if odd is not None:
            raise MemmapError(
                f"cannot memmap leaf {display(path)!r} of dtype {leaf.dtype} to {prefix}: it is {odd[0]}; memmap "
                f"writes strided tensors of dtypes laid out as plain bytes: convert it first with {odd[1]}"
            )
        if values and leaf.is_meta:
            raise MemmapError(
                f"cannot memmap leaf {display(path)!r} to {prefix}: it is a meta tensor, which has a shape and "
                "a dtype but no values to write; memmap_like(prefix) makes the files at their size, holding zeros"
            )
        if leaf.dtype not in _MAPPABLE:
            raise MemmapError(
                f"cannot memmap leaf {display(path)!r} of dtype {leaf.dtype} to {prefix}: only dtypes laid out "
                "as plain bytes map to files (not quantized, bit or sub-byte dtypes)"
            )
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "type": name_of(type(node)._root),
        "tags": sorted(t.name for t in _TAGS),
        "tree": tree,
    }
    if record is not None:
        doc["record"] = record
    parent, name = os.path.split(prefix)
    where = prefix
    try:
        os.makedirs(parent, exist_ok=True)
        remove_stale(parent, name)
        tmp = os.path.join(parent, f".{name[:40]}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        os.mkdir(tmp, 0o777)  # the umask applies, as to any directory the user makes
        dir_fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise MemmapError(f"cannot create {where}: {err}") from err
    try:
        for index, (path, leaf) in enumerate(leaves):
            where = os.path.join(prefix, leaf_name(index))
            if values:
                _write_leaf(os.path.join(tmp, leaf_name(index)), leaf)
            else:
                _write_zeros(
                    os.path.join(tmp, leaf_name(index)), checked_size(leaf.shape, leaf.dtype, MemmapError, path)
                )
        where = os.path.join(prefix, META)
        _write_json(os.path.join(tmp, META), doc)
        _, meta = _read_meta(prefix, dir_fd, parse=False)
        # mapped before the rename, through the directory written: another writer may replace
        # prefix (and delete these files) at once, and the node is still the one written
        node = _open(prefix, doc, "r+", dir_fd, meta)
        where = prefix
        swap_in(tmp, prefix)
    except OSError as err:  # MemmapError included
        shutil.rmtree(tmp, ignore_errors=True)
        raise err if isinstance(err, MemmapError) else MemmapError(f"cannot write {where}: {err}") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(dir_fd)
    return node


# -- reading ----------------------------------------------------------------------------------


def _remember(tensor: torch.Tensor, origin: Origin) -> None:
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return
    ptr = storage.data_ptr()
    _ORIGIN[ptr] = origin
    weakref.finalize(storage, _forget, ptr, origin)


def _forget(ptr: int, origin: Origin) -> None:
    if _ORIGIN.get(ptr) is origin:
        del _ORIGIN[ptr]


def _map_file(
    prefix: str,
    index: int,
    nbytes: int,
    dtype: torch.dtype,
    mode: str,
    dir_fd: int,
    meta: tuple[int, int, int, int],
    expect: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The file of leaf ``index`` mapped as a 1-d tensor of ``dtype`` (see :func:`map_regular`),
    remembered for pickling by reference and, under ``mode="r"``, marked read-only."""
    path = os.path.join(prefix, leaf_name(index))
    flat, identity = map_regular(path, leaf_name(index), dir_fd, nbytes, dtype, mode, expect)
    _remember(flat, Origin(prefix, index, mode, meta, identity))
    if mode == "r":
        mark_read_only(
            flat.untyped_storage(),
            f"it is mapped from {path} with mode='r'; load with mode='r+' to write the file, "
            "or mode='c' for private copy-on-write",
        )
    return flat


def _open(prefix: str, doc: object, mode: str, dir_fd: int, meta_id: tuple[int, int, int, int]) -> Any:
    meta = os.path.join(prefix, META)

    def corrupt(reason: str) -> MemmapError:
        return MemmapError(f"corrupt metadata file {meta}: {reason}")

    root, doc = read_header(doc, FORMAT, (1, VERSION), f"metadata file {meta}", corrupt, MemmapError)

    def leaf(index: int, dtype: torch.dtype, shape: torch.Size, path: tuple[str, ...]) -> torch.Tensor:
        if dtype not in _MAPPABLE:
            raise MemmapError(f"leaf {display(path)!r} in {meta} has dtype {dtype}, which cannot be mapped")
        nbytes = checked_size(shape, dtype, corrupt, path)
        return _map_file(prefix, index, nbytes, dtype, mode, dir_fd, meta_id).view(shape)

    def device(name: str | None) -> torch.device | None:
        if name not in (None, "cpu"):
            raise corrupt(f"device {name!r}: memmapped leaves live on the cpu")
        return None if name is None else torch.device("cpu")

    nested = doc["version"] != VERSION
    return retag(assemble(doc.get("tree"), nested, root, leaf, corrupt, device), _TAGS)


# how long a load keeps trying while other writers replace the directory under it (a count of tries
# ran out on a loaded machine, where a writer can be descheduled between its two renames)
_LOAD_WAIT = 5.0


def _open_dir(prefix: str, last: bool) -> int:
    """A descriptor of the directory ``prefix``; -1 when it is missing while a writer is swapping
    a new one in (its temporary or old directory is there), so the caller tries again."""
    try:
        return os.open(prefix, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        parent, name = os.path.split(prefix)
        head = f".{name[:40]}."
        # a writer between its two renames: its directories are there, or prefix is back already
        if not last and (os.path.lexists(prefix) or any(e.startswith(head) for e in _listdir(parent))):
            time.sleep(0.001)
            return -1
        raise MemmapError(f"missing metadata file {os.path.join(prefix, META)}: {prefix} does not exist") from None
    except OSError as err:
        # O_NOFOLLOW | O_DIRECTORY on a symlink: ELOOP or, on Linux, ENOTDIR
        reason = "is a symlink (never followed)" if os.path.islink(prefix) else f"cannot be opened: {err}"
        raise MemmapError(f"{prefix} {reason}; load_memmap takes a memmap directory") from None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _replaced(prefix: str, dir_fd: int) -> bool:
    """Whether ``prefix`` names another directory than ``dir_fd`` now."""
    return _moved(prefix, os.fstat(dir_fd))


def load(prefix: str | os.PathLike[str], mode: str) -> tuple[Any, Any, str]:
    """:func:`tdtree.load_memmap`'s work below the tensorclass: the node stored under ``prefix``
    (tagged ``{Memmap, Locked}``), the tensorclass record stored with it or None, and the metadata
    file's path (for the errors a record that does not fit raises)."""
    if mode not in ("r", "r+", "c"):
        raise ValueError(f"mode must be 'r' (read-only), 'r+' (shared writes) or 'c' (copy-on-write), got {mode!r}")
    prefix = os.path.abspath(os.fspath(prefix))
    deadline = time.monotonic() + _LOAD_WAIT
    while True:
        last = time.monotonic() > deadline
        dir_fd = _open_dir(prefix, last)
        if dir_fd < 0:
            continue
        try:
            doc, meta = _read_meta(prefix, dir_fd)
            node = _open(prefix, doc, mode, dir_fd, meta)
            break
        except MemmapError:
            # a writer replaced prefix while it was read (and deleted the files not yet opened):
            # read the new directory; a directory that stayed in place is broken, say so
            if last or not _replaced(prefix, dir_fd):
                raise
        finally:
            os.close(dir_fd)
    return node, doc.get("record"), os.path.join(prefix, META)


# -- mapping again what was mapped ----------------------------------------------------------------


def origin(leaf: torch.Tensor) -> Origin | None:
    """Where the bytes of ``leaf`` (a view of a storage this module mapped) come from, or None."""
    storage = leaf.untyped_storage()
    return _ORIGIN.get(storage.data_ptr()) if storage.nbytes() else None


def reopen(
    prefix: str, meta: tuple[int, int, int, int], leaves: Sequence[tuple[int, int, str, tuple[int, int]]]
) -> list[torch.UntypedStorage]:
    """The storages of ``leaves`` (leaf index, bytes, mode ``"r"`` or ``"r+"``, leaf file identity)
    of the memmap directory ``prefix`` mapped again, one for each.

    Through one descriptor of ``prefix``, as :func:`load` reads, and only while it holds the
    directory generation whose metadata file had the identity ``meta`` and each leaf file is
    the one recorded (see :class:`Origin`); a directory that another writer replaced, or that
    is gone, raises MemmapError naming ``prefix``: its files are never mapped.
    """
    dir_fd = _open_dir(prefix, last=True)
    try:
        _, found = _read_meta(prefix, dir_fd, parse=False)
        if found != meta:
            raise MemmapError(
                f"{prefix} no longer holds the memmap directory that was mapped: another writer replaced it"
            )
        return [
            _map_file(prefix, index, nbytes, torch.uint8, mode, dir_fd, meta, identity).untyped_storage()
            for index, nbytes, mode, identity in leaves
        ]
    finally:
        os.close(dir_fd)
