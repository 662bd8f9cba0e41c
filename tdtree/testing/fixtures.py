"""The pytest fixtures of :mod:`tdtree.testing` (defined in ``tdtree.testing._fixtures``)."""

from ._fixtures import tdtree_memmap as tdtree_memmap
from ._fixtures import tdtree_memmap_dir as tdtree_memmap_dir
from ._fixtures import tdtree_shared as tdtree_shared

__all__ = ["tdtree_memmap", "tdtree_memmap_dir", "tdtree_shared"]
