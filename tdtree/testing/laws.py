"""Laws to run on your own functions over nodes: each ``check_<law>(fn, strategy)`` runs a hypothesis
test, each ``assert_<law>(fn, *args)`` checks one example.

* purity: the inputs are unchanged (structure, leaf objects, ``_version``, values bit for bit);
* tags: the results' tags follow the storage rule and every claim is true;
* compiles: ``torch.compile(fullgraph=True)`` gives the eager result without recompiling;
* vmap: ``tdtree.vmap(fn)`` equals ``fn`` stacked over the slices;
* grad: ``torch.func.grad`` through ``fn`` matches central differences (float64).
"""

from . import _requires  # noqa: F401 - without hypothesis: an ImportError that says how to install it
from ._laws import LawError as LawError
from ._laws import assert_pure as assert_pure
from ._laws import assert_tags as assert_tags
from ._laws import check_pure as check_pure
from ._laws import check_tags as check_tags
from ._translaws import assert_compiles as assert_compiles
from ._translaws import assert_grad as assert_grad
from ._translaws import assert_vmap as assert_vmap
from ._translaws import check_compiles as check_compiles
from ._translaws import check_grad as check_grad
from ._translaws import check_vmap as check_vmap

__all__ = [
    "LawError",
    "assert_pure",
    "assert_tags",
    "assert_compiles",
    "assert_grad",
    "assert_vmap",
    "check_pure",
    "check_tags",
    "check_compiles",
    "check_grad",
    "check_vmap",
]
