"""Pure parts of the stack: config from the environment, ids, secrets, processes."""

from __future__ import annotations

import base64
import resource
import stat
import subprocess
import sys
import time

import pytest

from steplens.stack import process
from steplens.stack.config import StackConfig
from steplens.stack.secret_store import load_or_create
from steplens.stack.services.kafka import kafka_uuid


def test_ports_from_environment_and_keywords(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("STEPLENS_KAFKA_PORT", "31092")
    monkeypatch.setenv("STEPLENS_S3_PORT", "not-a-port")
    cfg = StackConfig.create(home=tmp_path, ports={"influxdb": 31086})
    assert cfg.ports["kafka"] == 31092
    assert cfg.ports["s3"] == 19000  # a bad value falls back to the default
    assert cfg.ports["influxdb"] == 31086
    assert cfg.log_path("kafka") == tmp_path / "logs" / "kafka.log"


def test_hot_retention_must_be_valid_for_influxdb(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_HOT_RETENTION_S", "7200")
    assert StackConfig.create().hot_retention_s == 7200
    monkeypatch.setenv("STEPLENS_HOT_RETENTION_S", "60")  # below InfluxDB's minimum of 1 h
    assert StackConfig.create().hot_retention_s == 3600


def test_kafka_uuid_has_kafkas_form() -> None:
    ids = {kafka_uuid() for _ in range(200)}
    assert len(ids) == 200
    for text in ids:
        assert len(text) == 22 and not text.startswith("-")
        assert len(base64.urlsafe_b64decode(text + "==")) == 16


def test_secrets_are_private_and_stable(tmp_path) -> None:
    path = tmp_path / "state" / "secrets.json"
    first = load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create(path) == first
    assert first.influx_token not in repr(first)


def _wait_for_line(path, text: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{path} never said {text!r}"
        time.sleep(0.05)


def test_stop_terminates_then_kills(tmp_path) -> None:
    # A child that ignores SIGTERM must be killed once the deadline passes.
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('handler set', flush=True); time.sleep(60)"
    )
    log, pid_file = tmp_path / "x.log", tmp_path / "x.pid"
    pid = process.start([sys.executable, "-c", code, str(tmp_path) + "/"], log, pid_file)
    _wait_for_line(log, "handler set")  # it runs its own command line (exec is done)
    assert process.read_pid(pid_file, str(tmp_path) + "/") == pid
    assert process.read_pid(pid_file, "some-other-marker") is None
    assert process.stop(pid, deadline_s=0.5) is True
    assert process.cmdline(pid) == ""


def test_started_processes_are_private_and_limited(tmp_path) -> None:
    """Log and pid files 0600 in 0700 folders; what the process writes is 0600 (umask 077);
    the memory ceiling asked for is set on it."""
    code = "open('made-by-it', 'w').write('x'); print('written', flush=True); import time; "
    code += "time.sleep(60)"
    log, pid_file = tmp_path / "logs" / "x.log", tmp_path / "pids" / "x.pid"
    ceiling = 3 << 30
    pid = process.start(
        [sys.executable, "-c", code, str(tmp_path) + "/"],
        log,
        pid_file,
        cwd=tmp_path,
        limits={resource.RLIMIT_DATA: ceiling},
    )
    try:
        _wait_for_line(log, "written")
        assert resource.prlimit(pid, resource.RLIMIT_DATA) == (ceiling, ceiling)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
        assert modes == {
            "logs": 0o700,
            "pids": 0o700,
            "x.log": 0o600,
            "x.pid": 0o600,
            "made-by-it": 0o600,
        }
    finally:
        process.stop(pid, deadline_s=1)


def test_port_free_sees_a_listener() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert process.port_free("127.0.0.1", port) is False
    assert process.port_free("127.0.0.1", port) is True


@pytest.mark.parametrize("argv", [["stack", "--help"], ["topics", "create", "--help"]])
def test_help(argv) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "steplens.schema.command", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "usage:" in result.stdout


def test_influxd_build_started_elsewhere_is_waited_for(tmp_path, monkeypatch) -> None:
    # A build started by hand (no lock) is running: ensure_influxd waits for its binary
    # instead of starting a second build.
    from steplens.stack import install

    cfg = StackConfig.create(home=tmp_path / "home", cache=tmp_path / "cache")
    binary = install.influxd_binary(cfg)
    script = f"sleep 1; mkdir -p '{binary.parent}'; touch '{binary}'"
    builder = subprocess.Popen(["bash", "-c", script, "build_influxdb.sh"])
    monkeypatch.setattr(install, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(install, "_run_recipe", lambda *a, **k: pytest.fail("built twice"))
    lines: list[str] = []
    try:
        assert install.ensure_influxd(cfg, lines.append) == binary
    finally:
        builder.wait(timeout=30)
    assert any("waiting for the running build" in line for line in lines)


def test_demo_children_log_privately(tmp_path) -> None:
    import os

    from steplens.stack.demo_children import Children

    children = Children(tmp_path, dict(os.environ))
    child = children.start("help", ["--help"])
    assert child.proc.wait(60) == 0
    assert "usage: steplens" in child.log.read_text()
    assert stat.S_IMODE(child.log.stat().st_mode) == 0o600
