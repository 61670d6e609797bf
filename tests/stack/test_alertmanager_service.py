"""Alertmanager in the local stack: optional (never started by a plain `up`), asked for with
``--with alertmanager`` or ``STEPLENS_STACK_WITH``; bound to 127.0.0.1 with no gossip port,
its state under the stack's home, a memory ceiling; listed and exported only while it runs."""

from __future__ import annotations

import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from steplens.stack.commands import _wanted
from steplens.stack.config import SERVICES
from steplens.stack.errors import StackError


def test_up_starts_it_only_when_asked(monkeypatch) -> None:
    monkeypatch.delenv("STEPLENS_STACK_WITH", raising=False)
    assert _wanted([], []) == list(SERVICES)
    assert _wanted([], ["alertmanager"]) == [*SERVICES, "alertmanager"]
    assert _wanted(["kafka"], ["alertmanager", "alertmanager"]) == ["kafka", "alertmanager"]
    monkeypatch.setenv("STEPLENS_STACK_WITH", "alertmanager")
    assert _wanted([], []) == [*SERVICES, "alertmanager"]
    monkeypatch.setenv("STEPLENS_STACK_WITH", "grafana")
    with pytest.raises(StackError, match="optional services: alertmanager"):
        _wanted([], [])


def test_help_names_the_optional_service() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "steplens.schema.command", "stack", "up", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--with SERVICE" in out and "alertmanager" in out


def _listening(pid: int) -> list[str]:
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True)
    lines = ss.stdout.splitlines()
    return sorted(line.split()[3] for line in lines if f"pid={pid}," in line)


@pytest.mark.stack
@pytest.mark.slow
def test_private_alertmanager_is_local_limited_and_private(tmp_path, monkeypatch) -> None:
    from steplens.stack import Stack
    from steplens.stack.process import free_ports
    from steplens.stack.services.alertmanager import memory_ceiling_bytes

    monkeypatch.delenv("STEPLENS_ALERTMANAGER_CONFIG", raising=False)
    (port,) = free_ports(1)
    stack = Stack(home=tmp_path / "home", ports={"alertmanager": port}, progress=print)
    assert [st.name for st in stack.status()] == list(SERVICES)  # not listed before it runs
    assert "STEPLENS_ALERTMANAGER_URL" not in stack.env()
    try:
        env = stack.up(["alertmanager"], timeout_s=60)
        assert env["STEPLENS_ALERTMANAGER_URL"] == f"http://127.0.0.1:{port}"
        pid = stack.pid("alertmanager")
        assert pid is not None
        assert _listening(pid) == [f"127.0.0.1:{port}"]  # no cluster port on 0.0.0.0:9094
        ceiling = memory_ceiling_bytes()
        assert resource.prlimit(pid, resource.RLIMIT_DATA) == (ceiling, ceiling)
        (st,) = [s for s in stack.status() if s.name == "alertmanager"]
        assert st.healthy and st.version == "0.35.0"
        home = stack.home / "alertmanager"
        assert (home / "alertmanager.yml").exists() and (home / "data").is_dir()
        shared = [p for p in stack.home.rglob("*") if stat.S_IMODE(p.stat().st_mode) & 0o077]
        assert shared == []
        stack.up(["alertmanager"], timeout_s=60)  # again: reused, not restarted
        assert stack.pid("alertmanager") == pid
    finally:
        assert "alertmanager" in stack.down(deadline_s=15)
    assert "STEPLENS_ALERTMANAGER_URL" not in stack.env()
    assert [st.name for st in stack.status()] == list(SERVICES)
    assert Path(stack.cfg.log_path("alertmanager")).read_text()  # its log stays for a look


def test_own_options_may_set_the_log_level(tmp_path, monkeypatch) -> None:
    """Alertmanager refuses a repeated flag: `--log.level` in STEPLENS_ALERTMANAGER_OPTS
    replaces the default, other options are appended."""
    from steplens.stack import Stack

    stack = Stack(home=tmp_path / "home", ports={"alertmanager": 1}, progress=print)
    monkeypatch.setenv("STEPLENS_ALERTMANAGER_OPTS", "--log.level=debug --data.retention=1h")
    argv = stack.service("alertmanager").argv()
    assert [a for a in argv if a.startswith("--log.level")] == ["--log.level=debug"]
    assert argv[-1] == "--data.retention=1h"
    monkeypatch.delenv("STEPLENS_ALERTMANAGER_OPTS")
    assert "--log.level=info" in stack.service("alertmanager").argv()
