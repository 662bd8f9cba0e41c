"""What installing tdtree costs the environment: hypothesis's and pytest's entry points import neither
torch nor tdtree until tdtree is used, ``import tdtree`` does not import dynamo, and the strategies
register with hypothesis whichever of the two is imported first."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5


def _installed(where: Path) -> dict[str, str]:
    """An environment where tdtree is installed as pyproject.toml says: the checkout on the path, a
    dist-info with its entry points ahead of any other install of tdtree (a stale one among them), and
    bytecode cached (pip compiles it at install; a process that may not write it compiles every module
    of tdtree at each import)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = where / f"tdtree-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tdtree\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in groups[g].items()) + "\n" for g in groups)
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(where)]), "PYTHONPYCACHEPREFIX": str(where / "pyc")}


def _run(code: str, env: dict[str, str]) -> str:
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _seconds(code: str, env: dict[str, str]) -> float:
    """The least time, over RUNS fresh processes (after one that caches the bytecode), of the import
    statement in ``code`` (printed by it)."""
    _run(code, env)
    return min(float(_run(code, env).split()[-1]) for _ in range(RUNS))


TIMED = "import time; t = time.perf_counter(); {}; print(time.perf_counter() - t)"


def test_the_entry_points_are_installed_and_named_as_pyproject_says(tmp_path):
    env = _installed(tmp_path)
    out = _run(
        "import importlib.metadata as m; "
        "print(*sorted(e.value for g in ('hypothesis', 'pytest11') for e in m.entry_points(group=g) if e.name == 'tdtree'))",
        env,
    )
    assert out.split() == ["_tdtree_plugins.fixtures", "_tdtree_plugins.strategies:setup"]


def test_import_hypothesis_costs_nothing_with_tdtree_installed(tmp_path):
    env = _installed(tmp_path)
    code = "import sys; " + TIMED.format("import hypothesis") + "; assert 'torch' not in sys.modules, 'torch'"
    plain = {**env, "HYPOTHESIS_NO_PLUGINS": "1"}
    _run(code, env)
    # the two alternate, so that a change in the machine's load weighs on both alike
    runs = [(float(_run(code, env).split()[-1]), float(_run(code, plain).split()[-1])) for _ in range(RUNS)]
    with_plugins, without = min(r[0] for r in runs), min(r[1] for r in runs)
    assert with_plugins - without < 0.05, (with_plugins, without)


def test_the_pytest_plugin_imports_neither_torch_nor_tdtree(tmp_path):
    env = _installed(tmp_path)
    code = (
        "import sys, importlib.metadata as m; "
        "[e.load() for e in m.entry_points(group='pytest11') if e.name == 'tdtree']; "
        "print(sorted(n for n in ('torch', 'tdtree') if n in sys.modules))"
    )
    assert _run(code, env).strip() == "[]"


def test_a_pytest_run_without_tdtree_does_not_import_torch(tmp_path):
    env = _installed(tmp_path)
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


def test_strategies_register_whichever_is_imported_first(tmp_path):
    env = _installed(tmp_path)
    draw = "print(isinstance(st.from_type(tt.TensorDict).example(), tt.TensorDict), isinstance(st.from_type(P).example(), P))"
    klass = "class P(tt.TensorClass):\n    x: torch.Tensor\n"
    orders = {
        "hypothesis first": f"import hypothesis\nfrom hypothesis import strategies as st\nimport torch, tdtree as tt\n{klass}{draw}",
        "tdtree first": f"import torch, tdtree as tt\n{klass}import hypothesis\nfrom hypothesis import strategies as st\n{draw}",
    }
    for order, code in orders.items():
        assert _run(code, env).split() == ["True", "True"], order


def test_import_tdtree_costs_little_more_than_import_torch(tmp_path):
    # dynamo, sympy and the rest of the compile stack stay unimported until compile runs
    env = _installed(tmp_path)
    code = (
        "import sys, torch; "
        + TIMED.format("import tdtree")
        + "; assert not {'torch._dynamo', 'sympy'} & set(sys.modules), 'compile stack imported'"
    )
    assert _seconds(code, env) < 0.3
