"""Start services as detached processes with pid files; stop only the processes we started."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from steplens.stack.private_files import UMASK, open_private, private_dir

# Popen handles of processes started by this Python process, so they can be reaped.
_children: dict[int, subprocess.Popen[bytes]] = {}


def cmdline(pid: int) -> str:
    """The process's command line as one string, or '' if it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return ""
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, IndexError):
        return ""


def read_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and its command line contains ``marker``."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if marker in cmdline(pid) else None


def start(
    argv: Sequence[str],
    log_file: Path,
    pid_file: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    limits: Mapping[int, int] | None = None,
) -> int:
    """Start ``argv`` in its own session, output appended to ``log_file``; returns its pid.

    The process runs under umask 077 (what it writes is its user's alone). ``limits`` maps
    ``resource.RLIMIT_*`` to a ceiling in bytes, set on the process as soon as it exists."""
    private_dir(log_file.parent)
    private_dir(pid_file.parent)
    with open_private(log_file, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            umask=UMASK,
        )
    _children[proc.pid] = proc
    for which, ceiling in (limits or {}).items():
        with contextlib.suppress(ProcessLookupError):  # it failed at once: probe() tells
            resource.prlimit(proc.pid, which, (ceiling, ceiling))
    with open_private(pid_file) as fh:
        fh.write(f"{proc.pid}\n")
    return proc.pid


def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    return cmdline(pid) != ""


def exited_early(pid: int) -> bool:
    """True once a process we started has exited (used to stop waiting for its health)."""
    return not _alive(pid)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def stop(pid: int, deadline_s: float = 30.0) -> bool:
    """SIGTERM, then SIGKILL after ``deadline_s``; returns True if it had to be killed."""
    if deadline_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    killed = not _wait_gone(pid, deadline_s)
    if killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10.0)
    child = _children.pop(pid, None)
    if child is not None:
        child.wait(timeout=5)
    return killed


def port_free(host: str, port: int) -> bool:
    """True if nothing listens on ``host:port`` (bind with SO_REUSEADDR, as servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free right now (for private stacks in tests)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in socks:
            sock.close()
    return ports
