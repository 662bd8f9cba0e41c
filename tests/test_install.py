"""What installing tdtree costs the environment: hypothesis's and pytest's entry points import neither
torch nor tdtree until tdtree is used, ``import tdtree`` does not import dynamo, and the strategies
register with hypothesis whichever of the two is imported first."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A timed import is sampled in at most RUNS fresh processes, and passes at the first sample within its
# bound: the least time is within the bound exactly when one sample is, so a sample past it (the
# machine busy elsewhere) costs another sample and a quiet machine costs one.
RUNS = 8


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment where tdtree is installed as pyproject.toml says: the checkout on the path, a
    dist-info with its entry points ahead of any other install of tdtree (a stale one among them), and
    bytecode cached as after pip's install: the processes may write tdtree's bytecode next to its
    sources (a process that may not compiles every module of tdtree at each import) and read torch's
    where pip wrote it."""
    where = tmp_path_factory.mktemp("installed")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = where / f"tdtree-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tdtree\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in groups[g].items()) + "\n" for g in groups)
    )
    # (a process of its own, not a pytest-xdist worker of this run, when the suite runs under xdist)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("PYTEST_XDIST_")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(where)])}


def _run(code: str, env: dict[str, str]) -> str:
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _seconds(code: str, env: dict[str, str], bound: float) -> float:
    """The least time, over up to RUNS fresh processes (after one that caches the bytecode), of the
    import statement in ``code`` (printed by it); sampling stops at the first time within ``bound``."""
    _run(code, env)
    least = float("inf")
    for _ in range(RUNS):
        least = min(least, float(_run(code, env).split()[-1]))
        if least < bound:
            break
    return least


TIMED = "import time; t = time.perf_counter(); {}; print(time.perf_counter() - t)"


def test_the_entry_points_are_installed_and_named_as_pyproject_says(installed):
    env = installed
    out = _run(
        "import importlib.metadata as m; "
        "print(*sorted(e.value for g in ('hypothesis', 'pytest11') for e in m.entry_points(group=g) if e.name == 'tdtree'))",
        env,
    )
    assert out.split() == ["_tdtree_plugins.fixtures", "_tdtree_plugins.strategies:setup"]


def test_import_hypothesis_costs_nothing_with_tdtree_installed(installed):
    env = installed
    code = "import sys; " + TIMED.format("import hypothesis") + "; assert 'torch' not in sys.modules, 'torch'"
    plain = {**env, "HYPOTHESIS_NO_PLUGINS": "1"}
    _run(code, env)
    # the two alternate, so that a change in the machine's load weighs on both alike; pairs are taken
    # until the least times are within the bound (at most RUNS pairs)
    with_plugins = without = float("inf")
    for _ in range(RUNS):
        with_plugins = min(with_plugins, float(_run(code, env).split()[-1]))
        without = min(without, float(_run(code, plain).split()[-1]))
        if with_plugins - without < 0.05:
            break
    assert with_plugins - without < 0.05, (with_plugins, without)


def test_the_pytest_plugin_imports_neither_torch_nor_tdtree(installed):
    env = installed
    code = (
        "import sys, importlib.metadata as m; "
        "[e.load() for e in m.entry_points(group='pytest11') if e.name == 'tdtree']; "
        "print(sorted(n for n in ('torch', 'tdtree') if n in sys.modules))"
    )
    assert _run(code, env).strip() == "[]"


def test_a_pytest_run_without_tdtree_does_not_import_torch(installed, tmp_path):
    env = installed
    (tmp_path / "test_other.py").write_text("import sys\n\ndef test_x():\n    assert 'torch' not in sys.modules\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_other.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr


def test_strategies_register_whichever_is_imported_first(installed):
    env = installed
    draw = "print(isinstance(st.from_type(tt.TensorDict).example(), tt.TensorDict), isinstance(st.from_type(P).example(), P))"
    klass = "class P(tt.TensorClass):\n    x: torch.Tensor\n"
    orders = {
        "hypothesis first": f"import hypothesis\nfrom hypothesis import strategies as st\nimport torch, tdtree as tt\n{klass}{draw}",
        "tdtree first": f"import torch, tdtree as tt\n{klass}import hypothesis\nfrom hypothesis import strategies as st\n{draw}",
    }
    for order, code in orders.items():
        assert _run(code, env).split() == ["True", "True"], order


def test_import_tdtree_costs_little_more_than_import_torch(installed):
    # dynamo, sympy and the rest of the compile stack stay unimported until compile runs
    env = installed
    code = (
        "import sys, torch; "
        + TIMED.format("import tdtree")
        + "; assert not {'torch._dynamo', 'sympy'} & set(sys.modules), 'compile stack imported'"
    )
    assert _seconds(code, env, 0.3) < 0.3
