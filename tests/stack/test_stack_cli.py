"""The `steplens stack` command against the shared stack: up twice, status, env, secrets."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import steplens.stack
from steplens.stack import Stack

pytestmark = pytest.mark.stack

STEPLENS = [sys.executable, "-m", "steplens.schema.command"]


def _running() -> list[str]:
    return [st.name for st in Stack().status() if st.running]


def test_up_twice_is_harmless(stack_env: dict[str, str]) -> None:
    stack = Stack(progress=lambda _line: None)
    before = {st.name: st.pid for st in stack.status() if st.running}
    assert before, "stack_env started nothing"
    assert stack.up(list(before)) == stack_env
    after = {st.name: st.pid for st in stack.status() if st.running}
    assert after == before


def test_status_json_reports_health(stack_env: dict[str, str]) -> None:
    out = subprocess.run(
        [*STEPLENS, "stack", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    statuses = {s["name"]: s for s in json.loads(out)}
    assert set(statuses) == {"kafka", "influxdb", "s3", "mlflow"}
    assert statuses["mlflow"]["address"] == stack_env["MLFLOW_TRACKING_URI"]  # the live view
    assert statuses["kafka"]["address"] == stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    assert "http://" + statuses["s3"]["address"] == stack_env["STEPLENS_S3_ENDPOINT"]
    running = _running()
    assert running, "stack_env started nothing"
    for name in running:
        assert statuses[name]["healthy"] is True, statuses[name]
        assert statuses[name]["detail"] == "ok"


def test_env_output_points_tools_at_the_stack(stack_env: dict[str, str]) -> None:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STEPLENS_", "AWS_")) or k in ("STEPLENS_HOME", "STEPLENS_CACHE")
    }
    probe = (
        "import os, boto3; from confluent_kafka.admin import AdminClient; "
        "a = AdminClient({'bootstrap.servers': os.environ['STEPLENS_KAFKA_BOOTSTRAP']}); "
        "print(len(a.list_topics(timeout=10).brokers)); "
        "print(os.environ['STEPLENS_S3_BUCKET'] in "
        "[b['Name'] for b in boto3.client('s3', endpoint_url=os.environ['STEPLENS_S3_ENDPOINT'])"
        ".list_buckets()['Buckets']])"
    )
    script = (
        f'eval "$({sys.executable} -m steplens.schema.command stack env)" && '
        f'{sys.executable} -c "{probe}"'
    )
    result = subprocess.run(
        ["bash", "-c", script], env=clean, check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "True"]


def test_secrets_stay_out_of_logs(stack_env: dict[str, str]) -> None:
    home = Stack().home
    secrets_file = home / "secrets.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    values = json.loads(secrets_file.read_text()).values()
    for log in (home / "logs").glob("*.log"):
        text = log.read_text(errors="replace")
        leaked = [v[:4] + "..." for v in values if v in text]
        assert not leaked, f"{log} contains secrets {leaked}"


def test_module_api_matches_the_command(stack_env: dict[str, str]) -> None:
    assert steplens.stack.env() == stack_env
    out = subprocess.run(
        [*STEPLENS, "stack", "env"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    exported = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in out.splitlines()
    )
    assert exported == stack_env


def test_logs_command_prints_the_log(stack_env: dict[str, str]) -> None:
    name = _running()[0]
    out = subprocess.run(
        [*STEPLENS, "stack", "logs", name, "-n", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    printed = out.splitlines()
    lines = Path(Stack().cfg.log_path(name)).read_text().splitlines()  # it may have grown since
    assert len(printed) == 5
    assert any(lines[i : i + 5] == printed for i in range(len(lines) - 4))


def test_topics_create_command(stack_env: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient

    tag = uuid.uuid4().hex[:8]
    names = {
        "STEPLENS_TOPIC_RAW": f"c{tag}.raw",
        "STEPLENS_TOPIC_SIGNALS": f"c{tag}.signals",
        "STEPLENS_TOPIC_ALERTS": f"c{tag}.alerts",
        "STEPLENS_TOPIC_DEADLETTER": f"c{tag}.dl",
        "STEPLENS_TOPIC_ADVICE": f"c{tag}.advice",
    }
    cmd = [*STEPLENS, "topics", "create", "--raw-partitions", "4"]
    env = {**os.environ, **names}
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert first.stdout.count("created") == 5
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert again.stdout.count("exists") == 5
    meta = AdminClient({"bootstrap.servers": stack_env["STEPLENS_KAFKA_BOOTSTRAP"]}).list_topics(
        timeout=10
    )
    assert len(meta.topics[names["STEPLENS_TOPIC_RAW"]].partitions) == 4
    assert len(meta.topics[names["STEPLENS_TOPIC_ALERTS"]].partitions) == 3
