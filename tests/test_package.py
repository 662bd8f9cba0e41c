"""The package's surface: ``import tdtree`` reaches its subpackages on first use, and imports none of them."""

from __future__ import annotations

import pytest
from _fresh import fresh_python


@pytest.mark.parametrize(
    ("name", "attribute"),
    [
        ("nn", "from_module"),
        ("optim", "adam"),
        ("data", "minibatches"),
        ("testing", "assert_equal"),
        ("distributed", "all_reduce"),
    ],
)
def test_import_tdtree_reaches_each_subpackage_on_first_use(name: str, attribute: str) -> None:
    code = (
        "import sys, tdtree\n"
        f"assert 'tdtree.{name}' not in sys.modules\n"
        f"assert '{name}' in dir(tdtree)\n"
        f"assert callable(tdtree.{name}.{attribute})\n"
        f"assert tdtree.{name} is sys.modules['tdtree.{name}']\n"
    )
    run = fresh_python(code, timeout=120)
    assert run.returncode == 0, run.stderr


def test_an_unknown_attribute_still_raises_attribute_error() -> None:
    import tdtree

    with pytest.raises(AttributeError, match="module 'tdtree' has no attribute 'nope'"):
        tdtree.nope  # noqa: B018 - the attribute access is what is tested
