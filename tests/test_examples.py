"""The examples that ``make demo`` does not run: the multi-process one under torchrun, as its docstring
says, and examples/ensemble.py, whose checks against torch.optim and a loop over samples belong to
the test suite. Each must print what it should.

``make demo`` runs the other single-process examples and ``tests/test_tensorclass.py`` type-checks
the typed one. Three processes for the distributed one: the ring then has a rank that is neither end
of the two-process channel stream.
"""

from __future__ import annotations

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "distributed.py")


def _run_example(name: str) -> list[str]:
    """The lines examples/``name`` prints, run in a process of its own with the repository importable."""
    path = os.path.join(os.path.dirname(EXAMPLE), name)
    root = os.path.dirname(os.path.dirname(path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_distributed_example_under_torchrun() -> None:
    world = 3
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", EXAMPLE],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # rank r holds w = r everywhere: the mean over ranks 0..world-1
    assert f"world size {world}" in lines
    assert f"mean of w over the ranks: {(world - 1) / 2:.2f} (expected {(world - 1) / 2:.2f})" in lines
    assert f"gathered batch size: ({world}, 8), next/reward ({world}, 8, 1)" in lines
    assert "lr from rank 0: 0.10" in lines
    assert f"received from rank {world - 1}: obs equal to its gathered entry: True" in lines
    assert "streamed from rank 1: steps [0, 1, 2], obs equal to its gathered entry: True" in lines


def test_ensemble_example_matches_torch() -> None:
    """examples/ensemble.py asserts its own differences; here it must run and report all four checks."""
    lines = _run_example("ensemble.py")
    assert lines[0].startswith("ensemble of 5 MLPs, batch_size (5,): predictions (5, 64, 3)")
    assert lines[1].startswith("5 Adam steps inside tdtree.vmap: max abs difference from torch.optim.Adam: ")
    assert lines[2].startswith("5 Adam steps inside torch.func.vmap: max abs difference from torch.optim.Adam: ")
    assert lines[3].startswith("per-sample gradients of 64 samples, batch_size (64,): max abs difference")
    assert all(float(line.rsplit(" ", 1)[1]) < 1e-5 for line in lines)


def test_gae_scan_example_matches_the_loop() -> None:
    """examples/gae_scan.py: the reverse tdtree.control.scan equals the Python loop, eager and compiled."""
    lines = _run_example("gae_scan.py")
    assert lines[0] == "rollout batch_size (128, 16): advantages by reverse scan"
    assert float(lines[1].rsplit(" ", 1)[1]) < 1e-5
    assert float(lines[2].rsplit(" ", 1)[1]) < 1e-5
    assert lines[3].startswith("time: Python loop ")
