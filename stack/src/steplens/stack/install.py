"""Fetch jars and build influxd once per version into the cache, with progress and a file lock."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib.resources import files
from pathlib import Path

from filelock import FileLock, Timeout

from steplens.stack import process
from steplens.stack.config import (
    ALERTMANAGER_VERSION,
    INFLUXDB_VERSION,
    KAFKA_VERSION,
    LOG4J_VERSION,
    MLFLOW_VERSION,
    S3PROXY_VERSION,
    StackConfig,
)
from steplens.stack.errors import StackError

Progress = Callable[[str], None]

KAFKA_ARTIFACTS = (
    f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
    f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
)
S3PROXY_ARTIFACTS = (f"org.gaul:s3proxy:{S3PROXY_VERSION}",)
BUILD_TIMEOUT_S = 2 * 3600
HEARTBEAT_S = 30.0


def recipe(name: str) -> Path:
    return Path(str(files("steplens.stack") / "recipes" / name))


def require_tool(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise StackError(f"'{tool}' is not installed: {hint}", exit_code=3)
    return path


def kafka_libs(cfg: StackConfig) -> Path:
    return cfg.cache / "kafka" / KAFKA_VERSION / "libs"


def s3proxy_libs(cfg: StackConfig) -> Path:
    return cfg.cache / "s3proxy" / S3PROXY_VERSION / "libs"


def influxd_binary(cfg: StackConfig) -> Path:
    return cfg.cache / "influxdb" / INFLUXDB_VERSION / "influxd"


def alertmanager_binary(cfg: StackConfig) -> Path:
    return cfg.cache / "alertmanager" / ALERTMANAGER_VERSION / "alertmanager"


def mlflow_venv(cfg: StackConfig) -> Path:
    return cfg.cache / "mlflow" / MLFLOW_VERSION / "venv"


def _run_recipe(
    what: str, argv: Sequence[str], log_file: Path, progress: Progress, env: dict[str, str]
) -> None:
    """Run a recipe; its output goes to ``log_file`` and, line by line, to ``progress``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    lines: queue.Queue[str | None] = queue.Queue()
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    tail: list[str] = []
    with open(log_file, "a") as log:
        while time.monotonic() - started < BUILD_TIMEOUT_S:
            try:
                line = lines.get(timeout=HEARTBEAT_S)
            except queue.Empty:
                progress(f"[{what}] still working ... {time.monotonic() - started:.0f} s")
                continue
            if line is None:
                break
            log.write(line + "\n")
            log.flush()
            tail = [*tail[-19:], line]
            if line.startswith("[") or "error" in line.lower():
                progress(f"{line} ({time.monotonic() - started:.0f} s)")
        else:
            proc.kill()
    code = proc.wait()
    if code != 0:
        last = "\n  ".join(tail[-8:])
        raise StackError(
            f"{what}: the recipe {Path(argv[1]).name} failed (exit {code}) after "
            f"{time.monotonic() - started:.0f} s; full log: {log_file}\n  {last}\n"
            "Fix the cause shown above and run `steplens stack up` again.",
            exit_code=4,
        )
    progress(f"[{what}] done in {time.monotonic() - started:.0f} s")


def ensure_jars(
    cfg: StackConfig, what: str, out: Path, artifacts: Sequence[str], progress: Progress
) -> Path:
    if (out / ".complete").exists():
        return out
    require_tool("java", "install Java 17 (apt-get install openjdk-17-jre-headless)")
    require_tool("mvn", "install Maven (apt-get install maven)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / ".fetch.lock")):
        if not (out / ".complete").exists():
            progress(f"[{what}] fetching jars from Maven Central into {out}")
            _run_recipe(
                what,
                ["bash", str(recipe("fetch_jars.sh")), str(out), *artifacts],
                cfg.cache / "logs" / f"fetch-{what}.log",
                progress,
                dict(os.environ),
            )
    return out


def _foreign_build_running() -> int | None:
    """A build_influxdb.sh started outside this module (no lock held), if any."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and "build_influxdb.sh" in process.cmdline(int(entry.name)):
            return int(entry.name)
    return None


def ensure_influxd(cfg: StackConfig, progress: Progress) -> Path:
    binary = influxd_binary(cfg)
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(binary.parent / ".build.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress("[influxdb] another `steplens stack up` is building influxd; waiting for it")
        lock.acquire(timeout=BUILD_TIMEOUT_S)
    try:
        started = time.monotonic()
        while (pid := _foreign_build_running()) and not binary.exists():
            if time.monotonic() - started > BUILD_TIMEOUT_S:
                raise StackError(f"influxd build (pid {pid}) still running; try again later")
            progress(
                f"[influxdb] waiting for the running build (pid {pid}) ... "
                f"{time.monotonic() - started:.0f} s"
            )
            time.sleep(HEARTBEAT_S)
        if binary.exists():
            return binary
        for tool, hint in (
            ("go", "install Go >= 1.22 (https://go.dev/dl)"),
            ("cargo", "install Rust with rustup (https://rustup.rs)"),
            ("pkg-config", "apt-get install pkg-config"),
        ):
            require_tool(tool, hint)
        progress(
            f"[influxdb] building influxd {INFLUXDB_VERSION} (first time only: several minutes)"
        )
        _run_recipe(
            "influxdb",
            ["bash", str(recipe("build_influxdb.sh")), INFLUXDB_VERSION],
            cfg.cache / "logs" / "build-influxdb.log",
            progress,
            {**os.environ, "STEPLENS_CACHE": str(cfg.cache)},
        )
    finally:
        lock.release()
    if not binary.exists():
        raise StackError(f"influxd build finished but {binary} is missing", exit_code=4)
    return binary


def ensure_alertmanager(cfg: StackConfig, progress: Progress) -> Path:
    """Build Alertmanager once per version (the recipe's own lock makes a build run by hand
    and one run here wait for each other)."""
    binary = alertmanager_binary(cfg)
    if binary.exists():
        return binary
    require_tool("go", "install Go >= 1.26 (https://go.dev/dl)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(binary.parent / ".build.lock"), timeout=BUILD_TIMEOUT_S):
        if not binary.exists():
            progress(
                f"[alertmanager] building alertmanager {ALERTMANAGER_VERSION} "
                "(first time: 2-8 min on 2 cores)"
            )
            _run_recipe(
                "alertmanager",
                ["bash", str(recipe("build_alertmanager.sh")), ALERTMANAGER_VERSION],
                cfg.cache / "logs" / "build-alertmanager.log",
                progress,
                {**os.environ, "STEPLENS_CACHE": str(cfg.cache)},
            )
    if not binary.exists():
        raise StackError(f"alertmanager build finished but {binary} is missing", exit_code=4)
    return binary


def ensure_mlflow(cfg: StackConfig, progress: Progress) -> Path:
    """Install the MLflow server into a virtual environment of its own, once per version (its
    dependencies, pinned in ``recipes/mlflow_server.txt``, conflict with the project's)."""
    venv = mlflow_venv(cfg)
    if (venv / ".complete").exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(venv.parent / ".install.lock"), timeout=BUILD_TIMEOUT_S):
        if not (venv / ".complete").exists():
            progress(
                f"[mlflow] installing the MLflow server {MLFLOW_VERSION} from PyPI "
                "(first time: about 3 min, 850 MB)"
            )
            _run_recipe(
                "mlflow",
                [
                    "bash",
                    str(recipe("install_mlflow.sh")),
                    str(venv),
                    MLFLOW_VERSION,
                    str(recipe("mlflow_server.txt")),
                ],
                cfg.cache / "logs" / "install-mlflow.log",
                progress,
                {**os.environ, "PYTHON": sys.executable},
            )
    return venv
