"""The demo's own subprocesses (worker, sinks): started in their own process groups, with
private logs, watched, and stopped at the end; and the ports they listen on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from steplens.stack.private_files import UMASK, open_private

Progress = Callable[[str], None]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Children:
    """The demo's own subprocesses; each in its own process group, stopped at the end."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.running: list[Child] = []

    def start(self, name: str, args: list[str]) -> Child:
        log = self.log_dir / f"{name}.log"
        with open_private(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "steplens.schema.command", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                umask=UMASK,  # a worker's state folder is as private as the rest
            )
        child = Child(name, proc, log)
        self.running.append(child)
        return child

    def check(self) -> Child | None:
        """The first child that has exited, if any."""
        return next((c for c in self.running if c.proc.poll() is not None), None)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for child in self.running:
            if child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.running:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait(timeout=5)
        self.running.clear()


def wait_port(port: int, child: Child, timeout_s: float, progress: Progress) -> None:
    """Wait until ``child`` answers on 127.0.0.1:``port`` (its metrics endpoint)."""
    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited ({child.proc.returncode}):\n{child.tail()}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() - shown > 10:
            shown = time.monotonic()
            progress(f"[demo] waiting for {child.name} on 127.0.0.1:{port} ...")
        time.sleep(0.5)
    raise RuntimeError(
        f"{child.name} did not open 127.0.0.1:{port} in {timeout_s:.0f} s:\n{child.tail()}"
    )


def wait_file(path: Path, child: Child, timeout_s: float) -> str:
    """Wait until ``child`` has written ``path``; returns its first line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text().strip()):
            return text.splitlines()[0]
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited ({child.proc.returncode}):\n{child.tail()}")
        time.sleep(0.5)
    raise RuntimeError(f"{child.name} did not write {path} in {timeout_s:.0f} s:\n{child.tail()}")


def port_or_free(port: int) -> int:
    """``port`` when it can be bound on 127.0.0.1 now, else a free one (a connect test can
    time out on a busy machine and call a taken port free)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return free_port()
    return port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
