"""Testing helpers: equality assertions that name the key, and hypothesis strategies for nodes.

The strategies need hypothesis and are imported on first use, so
``assert_equal`` works without it.
"""

from typing import Any

from ._assert import assert_close as assert_close
from ._assert import assert_equal as assert_equal

__all__ = ["assert_close", "assert_equal", "batch_sizes", "nested_keys", "tensordicts"]


def __getattr__(name: str) -> Any:
    if name in ("batch_sizes", "nested_keys", "tensordicts"):
        from . import _strategies

        return getattr(_strategies, name)
    raise AttributeError(f"module 'tdtree.testing' has no attribute {name!r}")
