"""Clear failures: a taken port, and `down` never touching a process it did not start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from steplens.stack import Stack, StackError
from steplens.stack.process import free_ports


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_taken_port_gives_clear_message(tmp_path, taken_port) -> None:
    stack = Stack(home=tmp_path, ports={"s3": taken_port}, progress=lambda _l: None)
    with pytest.raises(StackError) as err:
        stack.up(["s3"])
    message = str(err.value)
    assert f"port {taken_port}" in message
    assert "STEPLENS_S3_PORT" in message
    assert stack.pid("s3") is None


def test_taken_port_from_the_command_line(tmp_path, taken_port) -> None:
    env = {**os.environ, "STEPLENS_HOME": str(tmp_path), "STEPLENS_KAFKA_PORT": str(taken_port)}
    result = subprocess.run(
        [sys.executable, "-m", "steplens.schema.command", "stack", "up", "kafka"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert f"port {taken_port}" in result.stderr
    assert "STEPLENS_KAFKA_PORT" in result.stderr
    secrets = (tmp_path / "secrets.json").read_text()
    assert not any(v in result.stderr for v in secrets.split('"') if len(v) > 12)


def test_down_leaves_foreign_processes_alone(tmp_path) -> None:
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        stack = Stack(
            home=tmp_path,
            ports=dict(
                zip(("kafka", "kafka_controller", "influxdb", "s3"), free_ports(4), strict=True)
            ),
        )
        for name in ("kafka", "influxdb", "s3"):
            pid_file = stack.cfg.pid_path(name)
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(f"{stranger.pid}\n")  # a stale pid now used by someone else
        assert stack.down() == []
        assert stranger.poll() is None
        assert not any(st.running for st in stack.status())
    finally:
        stranger.kill()
        stranger.wait()
