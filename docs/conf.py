"""Sphinx configuration: the API reference from the docstrings, with README.md and ARCHITECTURE.md as pages.

``make docs`` builds it into ``docs/_build/html``; ``make test`` builds it with warnings as errors
(broken cross-references included). The source directory is the repository root, so the README and
ARCHITECTURE are read where they are and their links to each other resolve; the API pages are
generated from the module list in ``docs/api.rst`` (one line per module).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

project = "tdtree"
author = "tdtree contributors"
root_doc = "docs/index"
include_patterns = ["ARCHITECTURE.md", "docs/*.md", "docs/*.rst", "docs/api/*.rst"]
exclude_patterns = ["docs/_build"]
templates_path = [str(ROOT / "docs" / "_templates")]  # absolute: autosummary reads it from the source directory

extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon", "myst_parser"]
autosummary_generate = True
# the module template documents the data a module re-exports (tdtree.Locked, tdtree.testing.ALL_DTYPES),
# which automodule skips: autosummary lists them from __all__
autosummary_imported_members = True
autosummary_ignore_module_all = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# members a class inherits from tdtree's private bases (a tensorclass's operations) are shown; those
# of Python's and torch's bases are not
autodoc_default_options = {"show-inheritance": True, "inherited-members": "object, BaseException, Enum, Module"}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Returns:" as written: napoleon would read the text before a first-line colon as a type
# ("Without ``dim``: one 0-dim bool tensor"), and the types are in the signatures already
napoleon_custom_sections = ["Returns"]

# the README's links to its own sections (#testing-your-code)
myst_heading_anchors = 3

nitpicky = True
# other libraries' names: no inventories are fetched (the build runs offline)
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|optree|hypothesis|numpy|np|typing|typing_extensions|collections|enum|os|pathlib|datetime|types)(\..*)?",
    ),
]
# private names the signatures show: the node base class and its type variables (read "a node"), the
# `at` helper, a tensorclass's operations base, the distributed layout record
nitpick_ignore = [
    ("py:class", name)
    for name in (
        "Node",
        "NodeT",
        "tdtree._base.Node",
        "tdtree._base.NodeT",
        "tdtree._combine.T",
        "tdtree._dataset.T",
        "tdtree._scatter.At",
        "tdtree._scatter.AtIndex",
        "tdtree._tensorclass._ops.RecordOps",
        "tdtree._tensorclass._ops.RecordAt",
        "tdtree.distributed._layout.Layout",
    )
] + [("py:obj", "tdtree._dataset.T")]  # the dataset's item type variable, as its Generic base shows it

# the modules with a page: the list in api.rst
API = {line.strip() for line in (ROOT / "docs" / "api.rst").read_text().splitlines() if line.startswith("   tdtree")}
_page: list[str] = [""]  # the module whose page autodoc is writing


def _note_page(app, what, name, obj, options, lines):
    if what == "module":
        _page[0] = name
    if what == "data" and obj.__doc__ == type(obj).__doc__:
        lines[:] = []  # a constant shows its value, not its type's docstring (tuple's, Tag's)


def _skip_alias(app, what, name, obj, skip, options):
    """An exception is documented once, on the page of the module that defines it (``tdtree.LockedError``
    is ``tdtree.errors.LockedError``), so the names in "Raises" sections have one target."""
    home = getattr(obj, "__module__", None)
    if (
        what == "module"
        and isinstance(obj, type)
        and issubclass(obj, BaseException)
        and home in API
        and home != _page[0]
    ):
        return True
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _note_page)
    app.connect("autodoc-skip-member", _skip_alias)


html_theme = "furo"
# the pages sit under docs/ (the source directory is the repository root): index.html points there
html_extra_path = ["_extra"]
html_title = "tdtree"
