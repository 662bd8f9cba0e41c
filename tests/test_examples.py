"""The multi-process example runs under torchrun as its docstring says, and prints what it should.

``make demo`` runs the single-process examples and ``tests/test_tensorclass.py`` type-checks the
typed one; this one needs a launcher, so it is run here. Three processes: the ring then has a rank
that is neither end of the two-process channel stream.
"""

from __future__ import annotations

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "distributed.py")


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
