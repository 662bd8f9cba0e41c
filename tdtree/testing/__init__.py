"""Testing helpers: hypothesis strategies for nodes and equality assertions that name the key."""

from ._assert import assert_close as assert_close
from ._assert import assert_equal as assert_equal
from ._strategies import batch_sizes as batch_sizes
from ._strategies import nested_keys as nested_keys
from ._strategies import tensordicts as tensordicts
