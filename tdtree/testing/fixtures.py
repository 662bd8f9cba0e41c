"""The pytest fixtures of :mod:`tdtree.testing` (defined in ``_tdtree_plugins.fixtures``, the ``pytest11``
entry point, which pytest imports without importing tdtree)."""

from _tdtree_plugins.fixtures import tdtree_memmap as tdtree_memmap
from _tdtree_plugins.fixtures import tdtree_memmap_dir as tdtree_memmap_dir
from _tdtree_plugins.fixtures import tdtree_shared as tdtree_shared

__all__ = ["tdtree_memmap", "tdtree_memmap_dir", "tdtree_shared"]
