"""Plain nested dicts of tensors: the operations the pytree floor spells with dicts and optree.

Each function takes and returns plain nested dicts (keys: str, or a tuple path into the dicts); the
dicts along a path are copied and the rest shared, as a node's are; nothing is validated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import optree
import torch


def get_path(tree: dict[str, Any], key: Any) -> Any:
    if type(key) is str:
        return tree[key]
    for part in key:
        tree = tree[part]
    return tree


def walk(tree: dict[str, Any], prefix: tuple[str, ...], leaves: bool, paths: list[Any], values: list[Any]) -> None:
    """Append the path and value of every entry (``leaves``: of every leaf only), depth first."""
    for key, value in tree.items():
        path = (*prefix, key)
        if type(value) is dict:
            if not leaves:
                paths.append(path)
                values.append(value)
            walk(value, path, leaves, paths, values)
        else:
            paths.append(path)
            values.append(value)


def nested_entries(tree: dict[str, Any], leaves: bool) -> tuple[list[Any], list[Any]]:
    """The nested keys and values: a plain recursive walk, which is faster than optree's
    ``tree_paths`` / ``tree_leaves`` on these trees (the floor is the fastest plain-dict spelling)."""
    paths: list[Any] = []
    values: list[Any] = []
    walk(tree, (), leaves, paths, values)
    return paths, values


def has_leaf(tree: dict[str, Any], key: Any) -> bool:
    return has_path(tree, key) and type(get_path(tree, key)) is not dict


def has_path(tree: dict[str, Any], key: Any) -> bool:
    for part in (key,) if type(key) is str else key:
        if type(tree) is not dict or part not in tree:
            return False
        tree = tree[part]
    return True


def set_path(tree: dict[str, Any], key: Any, value: Any) -> dict[str, Any]:
    """``tree`` with ``value`` at ``key``: the dicts along the path are copied, the rest shared."""
    if type(key) is str:
        return {**tree, key: value}
    head, rest = key[0], key[1:]
    if not rest:
        return {**tree, head: value}
    return {**tree, head: set_path(tree.get(head, {}), rest, value)}


def drop_path(tree: dict[str, Any], key: Any) -> dict[str, Any]:
    """``tree`` without the entry at ``key`` (copied along the path), unchanged when it is missing."""
    if type(key) is str:
        key = (key,)
    head, rest = key[0], key[1:]
    if head not in tree:
        return tree
    if not rest:
        return {k: v for k, v in tree.items() if k != head}
    return {**tree, head: drop_path(tree[head], rest)}


def merge(tree: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``tree`` updated from ``other``, nested dicts merged."""
    out = dict(tree)
    for key, value in other.items():
        mine = out.get(key)
        out[key] = merge(mine, value) if type(value) is dict and type(mine) is dict else value
    return out


def flatten_keys(tree: dict[str, Any], prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {} if out is None else out
    for key, value in tree.items():
        if type(value) is dict:
            flatten_keys(value, f"{prefix}{key}.", out)
        else:
            out[prefix + key] = value
    return out


def unflatten_keys(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        level = out
        for part in parents:
            level = level.setdefault(part, {})
        level[last] = value
    return out


def select(tree: dict[str, Any], keys: tuple[Any, ...]) -> dict[str, Any]:
    """``tree`` with only ``keys``, each at its path (a key below one already selected whole adds
    nothing): one pass over the keys, each dict of the result made once."""
    out: dict[str, Any] = {}
    for key in keys:
        path = (key,) if type(key) is str else key
        level, source = out, tree
        for part in path[:-1]:
            source = source[part]
            below = level.get(part)
            if below is source:
                break
            if below is None:
                below = level[part] = {}
            level = below
        else:
            level[path[-1]] = source[path[-1]]
    return out


def shared_copy(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.clone().share_memory_()


def scatter_leaf(index: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def scatter(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        out[index] = v
        return out

    return scatter


def permute(*dims: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x.permute(*dims, *range(len(dims), x.dim()))


def reshape(*shape: int) -> Callable[[torch.Tensor], torch.Tensor]:
    # (3, 4) batch dims become ``shape``; the feature dims follow
    return lambda x: x.reshape(*shape, *x.shape[2:])


def view(*shape: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x.view(*shape, *x.shape[2:])


# How the pytree impl maps a node method to a per-leaf function (batch dims lead).
LEAF_METHODS: dict[str, Callable[..., Callable[[torch.Tensor], Any]]] = {
    "apply": lambda fn: fn,
    "unbind": lambda dim: lambda x: x.unbind(dim),
    "split": lambda size, dim=0: lambda x: x.split(size, dim),
    "chunk": lambda chunks, dim=0: lambda x: x.chunk(chunks, dim),
    "permute": permute,
    "squeeze": lambda dim: lambda x: x.squeeze(dim),
    "unsqueeze": lambda dim: lambda x: x.unsqueeze(dim),
    "reshape": reshape,
    "view": view,
    "to": lambda device: lambda x: x.to(device),
}


def nested_dict(source: Mapping[Any, Any]) -> dict[str, Any]:
    """Plain nested dicts holding ``source``'s leaves (tuple keys become paths), every dict new."""
    out: dict[str, Any] = {}
    for key, value in source.items():
        path = (key,) if type(key) is str else key
        level = out
        for part in path[:-1]:
            level = level.setdefault(part, {})
        level[path[-1]] = nested_dict(value) if isinstance(value, Mapping) else value
    return out


def write_files(tree: dict[str, Any], directory: Path) -> None:
    """Each leaf's bytes to a file of its own in ``directory``, named by its path joined by ".":
    the floor of writing a node to a memmap directory."""
    directory.mkdir(exist_ok=True)
    for path, leaf in zip(*nested_entries(tree, True)):
        leaf.numpy().tofile(directory / ".".join(path))


def read_files(directory: Path, like: dict[str, Any]) -> dict[str, Any]:
    """The leaves :func:`write_files` wrote from a tree shaped like ``like``, read into memory: the
    floor of mapping a memmap directory and reading it (the dtypes and shapes come from ``like``,
    where a node reads them from its metadata file)."""
    return optree.tree_map_with_path(
        lambda path, x: torch.from_numpy(np.fromfile(directory / ".".join(path), dtype=x.numpy().dtype)).view(x.shape),
        like,
    )
