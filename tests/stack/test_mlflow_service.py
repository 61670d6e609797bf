"""The stack's MLflow server (the live view): a default service on 127.0.0.1 with one worker,
its store and artifacts in the stack's home, a memory ceiling on both of its processes, no job
runner; a crash of the server takes its worker with it."""

from __future__ import annotations

import os
import resource
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from steplens.stack.config import SERVICES


def _group(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    out.append(int(entry.name))
            except ProcessLookupError:
                pass
    return sorted(out)


def _listening(pids: list[int]) -> list[str]:
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True)
    return sorted(
        line.split()[3]
        for line in ss.stdout.splitlines()
        if any(f"pid={pid}," in line for pid in pids)
    )


def test_mlflow_is_a_default_service_with_its_own_options(tmp_path, monkeypatch) -> None:
    from steplens.stack import Stack

    assert "mlflow" in SERVICES
    stack = Stack(home=tmp_path / "home", ports={"mlflow": 1}, progress=print)
    monkeypatch.setenv("STEPLENS_MLFLOW_OPTS", "--static-prefix /ml")
    svc = stack.service("mlflow")
    argv = svc.argv()
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--workers") + 1] == "1"
    assert argv[argv.index("--backend-store-uri") + 1].endswith(f"{stack.home}/mlflow/mlflow.db")
    assert argv[-2:] == ["--static-prefix", "/ml"]
    assert svc.process_env()["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert svc.env() == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"}


@pytest.mark.stack
@pytest.mark.slow
def test_private_mlflow_is_local_limited_and_goes_with_its_worker(tmp_path) -> None:
    from steplens.stack import Stack
    from steplens.stack.process import free_ports
    from steplens.stack.services.mlflow import memory_ceiling_bytes

    (port,) = free_ports(1)
    stack = Stack(home=tmp_path / "home", ports={"mlflow": port}, progress=print)
    try:
        env = stack.up(["mlflow"], timeout_s=300)
        url = f"http://127.0.0.1:{port}"
        assert env["MLFLOW_TRACKING_URI"] == url
        pid = stack.pid("mlflow")
        assert pid is not None
        group = _group(pid)
        assert len(group) == 2  # the server and its one uvicorn worker: no job runner
        assert _listening(group) == [f"127.0.0.1:{port}"]
        ceiling = memory_ceiling_bytes()
        for member in group:
            assert resource.prlimit(member, resource.RLIMIT_DATA) == (ceiling, ceiling)
        (st,) = [s for s in stack.status() if s.name == "mlflow"]
        assert st.healthy and st.address == url
        with urllib.request.urlopen(url + "/", timeout=10) as resp:  # the UI
            assert b"MLflow" in resp.read()
        assert (stack.home / "mlflow" / "mlflow.db").exists()
        assert (stack.home / "mlflow" / "artifacts").is_dir()
        assert stack.kill("mlflow")  # a crash of the server: its worker goes too
        deadline = time.monotonic() + 30
        while _group(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _group(pid) == []
    finally:
        stack.down(deadline_s=15)
