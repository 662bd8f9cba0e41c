"""One-file save and safe load of nodes.

``save`` writes, with ``torch.save``, a plain dict: a JSON string describing
the tree (the memmap metadata format: keys, batch sizes, devices, dtypes,
shapes) and the list of leaf tensors. ``load`` reads it back with
``torch.load(weights_only=True)``, which rebuilds only tensors and plain data
and never runs code found in the file, then checks every fact the JSON claims
before building the node.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from typing import Any

import torch

from ._base import Node
from ._keys import display
from ._memmap import assemble, describe
from ._pickle import root_name, root_named
from ._tags import Locked, retag, tag_rule
from .errors import SerializationError

__all__ = ["save", "load"]

FORMAT = "tdtree-save"
VERSION = 1


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values in a storage of their own size (a view of a larger storage would save all of it)."""
    t = tensor.detach().resolve_conj().resolve_neg()
    if (
        t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    ):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _reason(err: Exception) -> str:
    """The part of torch's refusal that names what was refused (not its advice to load unsafely)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    named = [ln for ln in lines[1:] if not ln.startswith(("Check the documentation", "Please file an issue"))]
    return " ".join(named) or (lines[0] if lines else type(err).__name__)


def save(node: Node, path: str | os.PathLike[str]) -> None:
    """Write ``node`` to the file ``path``, replacing it atomically (written aside, then renamed).

    Leaves are saved as their values (detached; a view of a larger tensor as
    a compact copy) on their devices; keys, batch sizes, devices and the
    ``Locked`` tag are kept. Read it back with :func:`load`.

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
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "type": root_name(type(node)._root),
        "tags": sorted(t.name for t in type(node)._tags),
        "tree": tree,
    }
    payload = {
        "tdtree": json.dumps(doc, ensure_ascii=True, separators=(",", ":")),
        "tensors": [_compact(t) for _, t in leaves],
    }
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name[:40]}.", suffix=".tmp", dir=parent)
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@tag_rule
def load(path: str | os.PathLike[str], device: torch.device | str | None = None) -> Any:
    """The node :func:`save` wrote to ``path``; safe on untrusted files.

    Args:
        path: the file.
        device: when given, every leaf is loaded onto it and it becomes the
            node's device; else leaves return to the devices they were saved from.

    Returns:
        A new node (fresh storage) with the saved keys, values and batch sizes,
        tagged ``Locked`` when the saved node was. ``Shared`` and ``Memmap``
        are claims about storage that a loaded file does not make: call
        ``share_memory()`` or ``memmap()`` on the result for them.

    Raises:
        SerializationError: naming the file, when it holds anything but
            tensors and plain data (nothing in it is run or rebuilt), is not a
            tdtree save file, or its description does not match its tensors.
        FileNotFoundError: ``path`` does not exist.
    """
    path = os.fspath(path)
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except pickle.UnpicklingError as err:
        raise SerializationError(
            f"refused to load {path}: it is not a tdtree save file, or it holds objects other than tensors "
            f"and plain data, which safe loading never rebuilds ({_reason(err)})"
        ) from None
    except Exception as err:  # noqa: BLE001 - any failure to parse an untrusted file is the same error
        raise SerializationError(
            f"cannot load {path}: it is not a tdtree save file ({type(err).__name__}: {err})"
        ) from None

    def corrupt(reason: str) -> SerializationError:
        return SerializationError(f"corrupt tdtree save file {path}: {reason}")

    if type(payload) is not dict or type(payload.get("tdtree")) is not str or type(payload.get("tensors")) is not list:
        raise corrupt("it does not hold a tdtree description and a list of tensors")
    try:
        doc = json.loads(payload["tdtree"])
    except (ValueError, RecursionError) as err:
        raise corrupt(f"its description is not JSON ({err})") from None
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise corrupt("its description is not a tdtree save description")
    if doc.get("version") != VERSION:
        raise SerializationError(
            f"{path} has format version {doc.get('version')!r}; this tdtree reads version {VERSION}"
        )
    root = root_named(doc.get("type"))
    tag_names = doc.get("tags")
    if root is None or type(tag_names) is not list:
        raise corrupt(f"unknown node type {doc.get('type')!r} or malformed tags {tag_names!r}")
    tensors = payload["tensors"]
    used: list[int] = []

    def leaf(index: int, dtype: torch.dtype, shape: torch.Size, key: tuple[str, ...]) -> torch.Tensor:
        value = tensors[index] if index < len(tensors) else None
        if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.shape != shape:
            found = None if not isinstance(value, torch.Tensor) else f"{value.dtype} {tuple(value.shape)}"
            raise corrupt(f"leaf {display(key)!r} should be {dtype} {tuple(shape)}, found {found}")
        used.append(index)
        return value

    def node_device(name: str | None) -> torch.device | None:
        if device is not None:
            return torch.device(device)
        try:
            return None if name is None else torch.device(name)
        except RuntimeError:
            raise corrupt(f"unknown device {name!r}") from None

    node = assemble(doc.get("tree"), root, leaf, corrupt, node_device)
    if len(used) != len(tensors):
        raise corrupt(f"it holds {len(tensors)} tensors for {len(used)} leaves")
    return retag(node, frozenset({Locked}) if "Locked" in tag_names else frozenset())
