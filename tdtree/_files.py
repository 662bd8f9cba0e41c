"""Files tdtree reads and writes, handled so that none can be turned against the user.

Nothing read is trusted: a file is opened without blocking (a FIFO would wait
forever) and, inside a memmap directory, without following a symlink
(``O_NOFOLLOW``, relative to the directory's descriptor); only regular files
are read, metadata up to a bound, and every size is computed in Python
integers before torch sees it. Written directories and files get mode 0o777 /
0o666 less the umask, as any file the user makes.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._keys import display
from .errors import MemmapError

__all__ = [
    "as_bytes",
    "checked_size",
    "open_regular",
    "map_regular",
    "remove_stale",
    "temp_path",
    "alive",
    "swap_in",
    "META_MAX",
    "MAX_BYTES",
]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The values of ``tensor`` (detached, resolved, on the cpu) as a flat uint8 tensor, in C order."""
    values = tensor.detach().resolve_conj().resolve_neg().cpu().contiguous()
    # as_strided, not reshape(-1): a tensor of at most one element is contiguous whatever its last
    # stride, and reshape keeps a stride of 2 that view(uint8) refuses
    return values.as_strided((values.numel(),), (1,)).view(torch.uint8)


# No file tdtree reads is trusted with a size: a leaf is at most this many bytes (torch's
# sizes are int64), and a metadata file is read up to this bound.
MAX_BYTES = 2**62
META_MAX = 1 << 28


def checked_size(
    shape: torch.Size | list[int], dtype: torch.dtype, corrupt: Callable[[str], Exception], key: tuple[str, ...]
) -> int:
    """The bytes of a leaf of ``shape`` and ``dtype``, computed in Python integers; ``corrupt(reason)``
    when they overflow what torch can address."""
    n = dtype.itemsize
    for d in shape:
        n *= d
    if n > MAX_BYTES or any(d > MAX_BYTES for d in shape):
        raise corrupt(f"leaf {display(key)!r} has shape {list(shape)}, too large for any file or tensor")
    return n


@contextlib.contextmanager
def open_regular(
    path: str, error: type[Exception], what: str, dir_fd: int | None = None, follow: bool = True
) -> Iterator[Any]:
    """``path`` opened for binary reading when it is a regular file, else ``error`` naming it.

    Opened without blocking (a FIFO would wait forever for a writer) and, unless
    ``follow``, refusing a symlink (``O_NOFOLLOW``); relative to ``dir_fd`` when given.
    FileNotFoundError propagates.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    shown = path
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise error(f"{what} {shown} is a symlink; tdtree never follows one out of its directory") from None
        raise error(f"cannot open {what} {shown}: {err}") from err
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{what} {shown} is not a regular file (a device, FIFO, socket or directory)")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def map_regular(
    path: str,
    name: str,
    dir_fd: int | None,
    nbytes: int,
    dtype: torch.dtype,
    mode: str,
    expect: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, tuple[int, int]]:
    """The file ``name`` (relative to ``dir_fd`` when given; ``path`` in messages) mapped as a 1-d
    tensor of ``dtype``, after checking it, and the file's identity ``(st_dev, st_ino)``.

    Opened without following a symlink, only a regular file of exactly ``nbytes``
    bytes and, when ``expect`` is given, only the file of that identity;
    mapped shared (``"r+"``) or private (``"r"``, ``"c"``: copy-on-write).
    Never created or grown (``torch.from_file`` in shared mode would do both).
    """
    flags = (os.O_RDWR if mode == "r+" else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise MemmapError(f"missing leaf file {path}") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise MemmapError(f"leaf file {path} is a symlink; tdtree never follows one out of its directory") from None
        raise MemmapError(f"cannot read leaf file {path}: {err}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MemmapError(f"leaf file {path} is not a regular file")
        identity = (info.st_dev, info.st_ino)
        if expect is not None and identity != expect:
            raise MemmapError(f"leaf file {path} is not the file that was mapped: another writer replaced it")
        if info.st_size != nbytes:
            raise MemmapError(f"leaf file {path} holds {info.st_size} bytes; its metadata asks for {nbytes}")
        if nbytes == 0:
            return torch.empty(0, dtype=dtype), identity
        return _map_fd(fd, path, nbytes, dtype, mode), identity
    finally:
        os.close(fd)


_PROC_FD = "/proc/self/fd"


def _map_fd(fd: int, path: str, nbytes: int, dtype: torch.dtype, mode: str) -> torch.Tensor:
    """The open regular file ``fd`` of ``nbytes`` bytes mapped as a 1-d tensor of ``dtype``."""
    try:
        if os.path.isdir(_PROC_FD):
            # torch maps a path: /proc/self/fd/N reopens this very file (not whatever the path names
            # now), and torch keeps no descriptor once mapped
            return torch.from_file(f"{_PROC_FD}/{fd}", shared=mode == "r+", size=nbytes // dtype.itemsize, dtype=dtype)
        # elsewhere mmap maps the descriptor itself (and keeps a copy of it while mapped)
        buffer = mmap.mmap(fd, nbytes, access=mmap.ACCESS_WRITE if mode == "r+" else mmap.ACCESS_COPY)
    except (OSError, ValueError, RuntimeError) as err:
        raise MemmapError(f"cannot map leaf file {path}: {err}") from err
    # the tensor keeps the mapping alive; it is unmapped when the last view of it dies
    return torch.frombuffer(buffer, dtype=dtype)


def temp_path(parent: str, name: str) -> str:
    """A fresh temporary name in ``parent`` for a writer of ``name``, carrying this process's pid so
    that :func:`remove_stale` can tell a killed writer's leftovers from a live one's."""
    return os.path.join(parent, f".{name[:40]}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def remove_stale(parent: str, name: str) -> None:
    """Remove the temporary and old directories and files of ``name`` that a killed writer left in
    ``parent`` (their names carry the writer's pid; a live writer's are kept)."""
    head = f".{name[:40]}."
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        if not entry.startswith(head) or not entry.endswith((".tmp", ".old")):
            continue
        pid = entry[len(head) :].split(".", 1)[0]
        if not pid.isdigit() or len(pid) > 10 or alive(int(pid)):
            continue  # not a pid (a name of another scheme), or a live writer's
        stale = os.path.join(parent, entry)
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(stale)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def swap_in(tmp: str, prefix: str, attempts: int = 50) -> None:
    """Rename ``tmp`` to ``prefix``; an existing ``prefix`` is moved away first and deleted after.

    Another process replacing ``prefix`` at the same time can put its directory in
    between the two renames: then this one moves that one away too and tries again
    (the last writer wins, and every directory it replaced is deleted).
    """
    parent, name = os.path.split(prefix)
    moved: list[str] = []
    try:
        for _ in range(attempts):
            old = os.path.join(parent, f".{name[:40]}.{os.getpid()}.{secrets.token_hex(6)}.old")
            try:
                os.rename(prefix, old)
                moved.append(old)
            except FileNotFoundError:
                pass
            try:
                os.rename(tmp, prefix)
                return
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        raise OSError(errno.EBUSY, f"{prefix} kept being replaced by another writer")
    finally:
        for old in moved:
            shutil.rmtree(old, ignore_errors=True)
