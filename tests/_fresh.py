"""Fresh interpreters for the tests that need one, at the cost of one import of torch per test process.

``fresh_python(code)`` runs ``code`` as ``python -c code`` would, and returns its exit status, stdout and
stderr. The first call starts a server: a Python process that imports torch (and none of tdtree,
hypothesis or dynamo) and then forks one child per call. A child starts from that state: a fresh
interpreter that has run ``import torch``, which is what each of these tests begins with.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from typing import Any

# The server: one request (a JSON line: code, cwd, timeout) in, one child forked, one JSON line out.
_SERVER = r"""
import json, os, sys, tempfile, traceback, types
import torch

def child(code, cwd, timeout, out, err):
    import signal
    signal.alarm(timeout)
    os.chdir(cwd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's requests
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as e:  # as the interpreter ends: None is 0, an int the status, anything else printed, 1
        status = e.code if isinstance(e.code, int) else 0 if e.code is None else print(e.code, file=sys.stderr) or 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

reply = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    request = json.loads(line)
    out, err = (tempfile.mkstemp()[1] for _ in range(2))
    pid = os.fork()
    if pid == 0:
        child(request["code"], request["cwd"], request["timeout"], out, err)
    _, status = os.waitpid(pid, 0)
    result = {"returncode": os.waitstatus_to_exitcode(status)}
    for name, path in (("stdout", out), ("stderr", err)):
        with open(path) as f:
            result[name] = f.read()
        os.unlink(path)
    reply.write(json.dumps(result) + "\n")
    reply.flush()
"""

_server: list[subprocess.Popen] = []


def _started() -> subprocess.Popen:
    if not _server:
        _server.append(
            subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
        atexit.register(_stop)
    return _server[0]


def _stop() -> None:
    server = _server.pop()
    server.stdin.close()  # type: ignore[union-attr]
    server.wait(timeout=60)


def fresh_python(code: str, cwd: str | os.PathLike[str] | None = None, timeout: int = 300) -> Any:
    """``code`` run as ``python -c code`` in ``cwd``: a ``subprocess.CompletedProcess`` (text output)."""
    server = _started()
    request = {"code": code, "cwd": os.fspath(cwd or os.getcwd()), "timeout": timeout}
    server.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
    server.stdin.flush()  # type: ignore[union-attr]
    line = server.stdout.readline()  # type: ignore[union-attr]
    assert line, "the fresh-interpreter server died"
    result = json.loads(line)
    return subprocess.CompletedProcess(["python", "-c", code], result["returncode"], result["stdout"], result["stderr"])
