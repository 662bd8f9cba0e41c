"""pytest fixtures for tests of node code (the ``pytest11`` entry point ``tdtree``).

Installing tdtree makes them available in every test suite; a suite that runs
tdtree from a checkout without installing it imports them in its conftest.py
(``from tdtree.testing.fixtures import *``). This module imports neither torch nor
tdtree: pytest imports it in every run of the environment (see the package doc).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["tdtree_memmap_dir", "tdtree_memmap", "tdtree_shared"]


@pytest.fixture
def tdtree_memmap_dir() -> Iterator[Path]:
    """A fresh, empty directory for memmap prefixes, removed with everything in it after the test
    (unlike ``tmp_path``, which pytest keeps for three runs: memmap files can be large).

    Yields:
        The directory's ``Path``.
    """
    where = Path(tempfile.mkdtemp(prefix="tdtree-memmap-"))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def tdtree_memmap(tdtree_memmap_dir: Path) -> Callable[[Any], Any]:
    """``memmap(node)``: ``node.memmap(prefix)`` under a new prefix in :func:`tdtree_memmap_dir`
    (tagged ``{Memmap, Locked}``); the files are removed after the test.

    Args:
        tdtree_memmap_dir: the fixture above (pytest passes it).

    Returns:
        The function ``memmap(node)``, returning the memmapped node.
    """
    count = iter(range(1 << 30))

    def memmap(node: Any) -> Any:
        return node.memmap(tdtree_memmap_dir / f"node-{next(count)}")

    return memmap


@pytest.fixture
def tdtree_shared() -> Iterator[Callable[[Any], Any]]:
    """``share(node)``: ``node.share_memory()`` (tagged ``{Shared, Locked}``). After the test the
    fixture drops its references and collects garbage, so the shared memory segments are freed
    unless the test kept the node alive elsewhere (a worker still holding it, a global).

    Yields:
        The function ``share(node)``, returning the shared copy.
    """
    made: list[Any] = []

    def share(node: Any) -> Any:
        made.append(node.share_memory())
        return made[-1]

    yield share
    made.clear()
    gc.collect()
