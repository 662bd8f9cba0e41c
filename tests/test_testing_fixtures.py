"""tdtree.testing's pytest fixtures and the entry points that install them (and the hypothesis hook)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from _fresh import fresh_python

ROOT = Path(__file__).resolve().parent.parent

SUITE = """
import json, os, torch, tdtree as tt
from tdtree.testing.fixtures import *  # noqa: F403 - a checkout not installed imports the plugin

SEEN = {}

def test_memmap(tdtree_memmap_dir, tdtree_memmap):
    assert tdtree_memmap_dir.is_dir() and not list(tdtree_memmap_dir.iterdir())
    td = tdtree_memmap(tt.TensorDict({"a": torch.ones(3)}, [3]))
    assert td.tags == frozenset({tt.Memmap, tt.Locked})
    again = tdtree_memmap(td)
    assert again["a"].data_ptr() != td["a"].data_ptr()  # a second directory, mapped anew
    assert len(list(tdtree_memmap_dir.iterdir())) == 2
    SEEN["dir"] = str(tdtree_memmap_dir)

def test_shared(tdtree_shared):
    td = tdtree_shared(tt.TensorDict({"a": torch.ones(3)}, [3]))
    assert td.tags == frozenset({tt.Shared, tt.Locked}) and td["a"].is_shared()

def test_after():
    with open(os.environ["SEEN_FILE"], "w") as f:
        json.dump(SEEN, f)
"""


def test_fixtures_give_memmap_and_shared_nodes_and_remove_the_files(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent(SUITE))
    seen = tmp_path / "seen.json"
    env = {**os.environ, "SEEN_FILE": str(seen), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:tdtree",
            str(tmp_path / "test_user.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout
    assert not Path(json.loads(seen.read_text())["dir"]).exists()


def test_entry_points_name_importable_targets():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    module, _, name = project["hypothesis"]["tdtree"].partition(":")
    hook = getattr(importlib.import_module(module), name)
    hook()  # registering twice is harmless
    plugin = importlib.import_module(project["pytest11"]["tdtree"])
    for fixture in ("tdtree_memmap_dir", "tdtree_memmap", "tdtree_shared"):
        assert hasattr(plugin, fixture)


def test_assertions_import_without_hypothesis():
    code = (
        "import sys; sys.modules['hypothesis'] = None; import tdtree; print('tdtree ok'); "
        "import tdtree.testing as T; T.assert_equal(1, 1); print('assert ok')"
    )
    run = fresh_python(code, cwd=ROOT)
    assert run.stdout.split() == ["tdtree", "ok", "assert", "ok"], run.stderr


BLOCK_HYPOTHESIS = """
import sys
class Blocker:  # hypothesis is not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "hypothesis":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
"""


@pytest.mark.parametrize("reach", ["import tdtree.testing as T; T.tensordicts", "import tdtree.testing.laws"])
def test_strategies_and_laws_without_hypothesis_say_how_to_install_it(reach):
    code = BLOCK_HYPOTHESIS + (
        "import tdtree, tdtree.testing as T; T.assert_equal(1, 1)\n"
        f"try:\n    {reach}\nexcept ModuleNotFoundError as e:\n    print(e.name, '|', e)\n"
    )
    run = fresh_python(code, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    name, _, message = run.stdout.partition(" | ")
    assert name == "hypothesis" and "pip install 'tdtree[testing]'" in message, run.stdout


@pytest.mark.parametrize("name", ["tensordicts", "check_pure", "tensorclasses", "register_strategies"])
def test_strategies_and_laws_are_reached_in_a_fresh_process(name):
    # a fresh process, hypothesis not yet imported: the first strategy or law reached imports it, and its
    # entry-point hook must find tdtree's strategies whole (in the suite another test imported it first)
    code = (
        "import sys, tdtree as tt, tdtree.testing as T; assert 'hypothesis' not in sys.modules; "
        f"assert callable(T.{name}); from hypothesis import strategies as st; "
        "print(type(st.from_type(tt.TensorDict).example()).__name__.startswith('TensorDict'))"
    )
    run = fresh_python(code, cwd=ROOT)
    assert run.stdout.split() == ["True"], run.stderr


def test_registration_module_imported_before_hypothesis_registers_once_done():
    # importing it starts hypothesis's import, which runs the entry-point hook while it is half-imported
    code = (
        "import sys, tdtree as tt, tdtree.testing._register as R; assert 'hypothesis' in sys.modules; "
        "R.register_strategies(); from hypothesis import strategies as st; "
        "print(type(st.from_type(tt.TensorDict).example()).__name__.startswith('TensorDict'))"
    )
    run = fresh_python(code, cwd=ROOT)
    assert run.stdout.split() == ["True"], run.stderr


@pytest.mark.parametrize("name", ["tensordicts", "check_pure", "tensorclasses"])
def test_strategies_and_laws_are_reached_from_the_package(name):
    import tdtree.testing as T

    assert callable(getattr(T, name))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        T.nope  # noqa: B018
