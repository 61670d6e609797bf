"""A local stack instance: its services, state folder and ports; start, stop, probe, env."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from steplens.stack import process
from steplens.stack.config import (
    ALL_SERVICES,
    DEFAULT_PORTS,
    OPTIONAL_SERVICES,
    SERVICES,
    StackConfig,
)
from steplens.stack.errors import StackError
from steplens.stack.install import BUILD_TIMEOUT_S, Progress
from steplens.stack.private_files import private_dir, write_private
from steplens.stack.secret_store import Secrets, load_or_create
from steplens.stack.services.alertmanager import Alertmanager
from steplens.stack.services.base import Service
from steplens.stack.services.influxdb import InfluxDB
from steplens.stack.services.kafka import Kafka
from steplens.stack.services.mlflow import Mlflow
from steplens.stack.services.s3 import S3

SERVICE_TYPES: dict[str, type[Service]] = {
    "kafka": Kafka,
    "influxdb": InfluxDB,
    "s3": S3,
    "alertmanager": Alertmanager,
    "mlflow": Mlflow,
}
LOG_ROTATE_BYTES = 50 * 1024 * 1024
# Installs that build for minutes on the CPU (influxd: libflux with cargo, then go): started at
# once, beside the others' downloads, not after them
BUILT_IN_BACKGROUND = ("influxdb",)


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    version: str
    address: str
    running: bool
    healthy: bool
    pid: int | None
    log: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _quiet(_: str) -> None:
    pass


class Stack:
    """One stack: ``Stack()`` is the default one; ``Stack(home=..., ports=...)`` a private one."""

    def __init__(
        self,
        home: Path | str | None = None,
        ports: Mapping[str, int] | None = None,
        cache: Path | str | None = None,
        progress: Progress = print,
    ) -> None:
        unknown = set(ports or {}) - set(DEFAULT_PORTS)
        if unknown:
            raise ValueError(f"unknown port names {sorted(unknown)}; known: {list(DEFAULT_PORTS)}")
        self.cfg = StackConfig.create(home, ports, cache)
        self.progress = progress
        self._secrets: Secrets | None = None

    @property
    def home(self) -> Path:
        return self.cfg.home

    @property
    def secrets(self) -> Secrets:
        if self._secrets is None:
            self._secrets = load_or_create(self.cfg.home / "secrets.json")
        return self._secrets

    def service(self, name: str) -> Service:
        if name not in SERVICE_TYPES:
            raise StackError(f"unknown service {name!r}; choose from {', '.join(ALL_SERVICES)}")
        return SERVICE_TYPES[name](self.cfg, self.secrets)

    def _names(self, services: Iterable[str] | None) -> list[str]:
        wanted = list(SERVICES) if services is None else list(services)
        for name in wanted:
            self.service(name)  # validates the name
        return [name for name in ALL_SERVICES if name in wanted]

    def _lock(self) -> FileLock:
        private_dir(self.cfg.home)  # an older home is made private too
        return FileLock(str(self.cfg.home / "stack.lock"), mode=0o600)

    def pid(self, name: str) -> int | None:
        svc = self.service(name)
        return process.read_pid(self.cfg.pid_path(name), svc.marker)

    # -- start ---------------------------------------------------------------------------------

    def up(
        self,
        services: Iterable[str] | None = None,
        progress: Progress | None = None,
        timeout_s: float = 180.0,
    ) -> dict[str, str]:
        """Start what is not running (reusing healthy services), wait for health, configure.

        Returns the client environment (``env()``)."""
        say = progress or self.progress
        names = self._names(services)
        lock = self._lock()
        try:
            lock.acquire(timeout=0)
        except Timeout:
            say(f"[stack] another `steplens stack up` is using {self.cfg.home}; waiting for it")
            lock.acquire(timeout=BUILD_TIMEOUT_S)
        try:
            started = time.monotonic()
            building = {
                name: self._install_in_background(name, say)
                for name in names
                if name in BUILT_IN_BACKGROUND and self.pid(name) is None
            }
            # Java services first so they boot while influxd is fetched or built.
            launched: dict[str, int | None] = {}
            for name in sorted(names, key=lambda n: n == "influxdb"):
                launched[name] = self._launch(name, say, building.get(name))
            for name in names:
                self._wait_healthy(name, launched[name], timeout_s)
                self.service(name).configure(say)
            if any(pid is not None for pid in launched.values()):
                say(f"[stack] up: {', '.join(names)} in {time.monotonic() - started:.1f} s")
        finally:
            lock.release()
        return self.env()

    def start(self, service: str, timeout_s: float = 180.0) -> None:
        """Start one service (no-op if it runs) and wait until it is healthy."""
        self.up([service], progress=_quiet, timeout_s=timeout_s)

    def _install_in_background(self, name: str, say: Progress) -> Future[None]:
        """``install`` of one service in a daemon thread (an error in another service's start
        does not wait for it; a build it leaves running is waited for by the next start)."""
        done: Future[None] = Future()
        svc = self.service(name)

        def work() -> None:
            try:
                svc.install(say)
            except BaseException as e:  # handed to the start that waits for it
                done.set_exception(e)
            else:
                done.set_result(None)

        threading.Thread(target=work, name=f"install-{name}", daemon=True).start()
        return done

    def _launch(
        self, name: str, say: Progress, installing: Future[None] | None = None
    ) -> int | None:
        """Start the service unless ours already runs; returns the new pid or None if reused.
        ``installing``: its install, already under way."""
        svc = self.service(name)
        ports = {p: svc.port(p) for p in svc.port_names}
        ports_file = self.cfg.pid_path(name).with_suffix(".ports.json")
        if self.pid(name) is not None:
            running = json.loads(ports_file.read_text()) if ports_file.exists() else ports
            if running != ports:
                raise StackError(
                    f"{name} is running with ports {running}, not {ports}; run `steplens stack "
                    "down` first to change its ports"
                )
            return None
        for port_name in svc.port_names:
            port = svc.port(port_name)
            if not process.port_free(self.cfg.host, port):
                var = DEFAULT_PORTS[port_name][1]
                raise StackError(
                    f"{name}: port {port} on {self.cfg.host} is already in use by another "
                    f"program (not by the stack in {self.cfg.home}). Stop that program "
                    f"(`ss -ltnp 'sport = :{port}'` shows it) or choose another port with "
                    f"{var}=<port>.",
                    exit_code=5,
                )
        if installing is not None:
            installing.result()
        else:
            svc.install(say)
        svc.prepare(say)
        log = self.cfg.log_path(name)
        if log.exists() and log.stat().st_size > LOG_ROTATE_BYTES:
            log.replace(log.with_suffix(".log.1"))
        say(f"[{name}] starting on {svc.address} (log: {log})")
        pid = process.start(
            svc.argv(),
            log,
            self.cfg.pid_path(name),
            env=svc.process_env(),
            cwd=svc.dir,
            limits=svc.memory_limits(),
        )
        write_private(ports_file, json.dumps(ports))
        return pid

    def _wait_healthy(self, name: str, pid: int | None, timeout_s: float) -> None:
        svc = self.service(name)
        deadline = time.monotonic() + (svc.start_timeout_s if pid else 0) + timeout_s
        reason = svc.probe()
        while reason is not None:
            if pid is not None and process.exited_early(pid):
                raise StackError(
                    f"{name} exited while starting: {self._log_tail(name)}\n"
                    f"full log: {self.cfg.log_path(name)}"
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{name} is not healthy after {timeout_s:.0f} s ({reason}); see "
                    f"{self.cfg.log_path(name)}, or run `steplens stack down` and `up` again"
                )
            time.sleep(0.5)
            reason = svc.probe()

    def _log_tail(self, name: str, lines: int = 8) -> str:
        return "\n  " + "\n  ".join(tail(self.cfg.log_path(name), lines))

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, service: str, deadline_s: float = 30.0) -> bool:
        """Stop one service if this stack started it; returns True if it was running."""
        pid = self.pid(service)
        pid_file = self.cfg.pid_path(service)
        if pid is None:
            pid_file.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
        if process.stop(pid, deadline_s) and deadline_s > 0:
            self.progress(f"[{service}] did not stop within {deadline_s:.0f} s; killed")
        # what it started (MLflow's uvicorn worker) goes too: the service leads its own
        # process group, whose id no new process can take while a member lives
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
        return True

    def kill(self, service: str) -> bool:
        """SIGKILL one service (a crash, for fault tests); ``start`` brings it back."""
        return self.stop(service, deadline_s=0.0)

    def pause(self, service: str) -> None:
        """Freeze one service with SIGSTOP (a hung server: connections open, no answers)."""
        self._signal(service, signal.SIGSTOP)

    def resume(self, service: str) -> None:
        """Undo ``pause`` with SIGCONT."""
        self._signal(service, signal.SIGCONT)

    def _signal(self, service: str, sig: signal.Signals) -> None:
        pid = self.pid(service)
        if pid is None:
            raise StackError(f"{service} is not running in the stack at {self.cfg.home}")
        os.kill(pid, sig)

    def down(self, deadline_s: float = 30.0) -> list[str]:
        """Stop every service this stack started (Kafka last)."""
        return [name for name in reversed(ALL_SERVICES) if self.stop(name, deadline_s)]

    def listed(self) -> list[str]:
        """The default services, and the optional ones this stack has started."""
        started = [n for n in OPTIONAL_SERVICES if self.cfg.pid_path(n).exists()]
        return [*SERVICES, *started]

    # -- inspect -------------------------------------------------------------------------------

    def status(self) -> list[ServiceStatus]:
        out = []
        for name in self.listed():
            svc = self.service(name)
            pid = self.pid(name)
            reason = svc.probe() if pid is not None else "not running"
            out.append(
                ServiceStatus(
                    name=name,
                    version=svc.version,
                    address=svc.address,
                    running=pid is not None,
                    healthy=reason is None,
                    pid=pid,
                    log=str(self.cfg.log_path(name)),
                    detail=reason or "ok",
                )
            )
        return out

    def env(self) -> dict[str, str]:
        """Client settings for every service (what `steplens stack env` exports)."""
        merged: dict[str, str] = {}
        for name in SERVICES:
            merged.update(self.service(name).env())
        for name in OPTIONAL_SERVICES:  # only while running: clients would post to nothing
            if self.pid(name) is not None:
                merged.update(self.service(name).env())
        return merged


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a text file (reads at most the last 256 KiB)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]
