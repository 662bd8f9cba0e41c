"""The API reference covers the public modules and names (the site itself is built by `make docs` /
`make test`, warnings as errors).

A public module is one whose dotted path has no part starting with ``_``; each has a line in
docs/api.rst, and its public names are its ``__all__``, which autodoc documents.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
from pathlib import Path

import tdtree

API_RST = Path(__file__).resolve().parent.parent / "docs" / "api.rst"


def _listed() -> list[str]:
    return [line.strip() for line in API_RST.read_text().splitlines() if line.startswith("   tdtree")]


def _public_modules() -> set[str]:
    found = {"tdtree"}
    for info in pkgutil.walk_packages(tdtree.__path__, "tdtree."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.add(info.name)
    return found


def test_every_public_module_has_a_page() -> None:
    listed = _listed()
    assert len(listed) == len(set(listed)), "a module listed twice"
    assert set(listed) == _public_modules()


def test_every_public_name_is_in_all() -> None:
    for name in _listed():
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{name} has no __all__"
        assert [n for n in exported if not hasattr(module, n)] == [], name
        # what the module or its private submodules define (tdtree.nn.TDModule lives in
        # tdtree.nn._modules); names it imports from elsewhere are its implementation
        own = {
            attr
            for attr, value in vars(module).items()
            if not attr.startswith("_")
            and not isinstance(value, types.ModuleType)
            and (
                getattr(value, "__module__", None) == name
                or str(getattr(value, "__module__", "")).startswith(f"{name}._")
            )
        }
        assert sorted(own - set(exported)) == [], name
