"""The runnable example: it trains, its records arrive in Kafka, and it exits 0 without Kafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from producer_kafka_helpers import consume_all, new_raw_topic

EXAMPLE = Path(__file__).parents[2] / "producer" / "examples" / "train_minimal.py"
STEPS = 120


def _run_example(env: dict[str, str], spool: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", str(STEPS)],
        env={
            **os.environ,
            **env,
            "STEPLENS_SPOOL_DIR": str(spool),
            "STEPLENS_HW_INTERVAL_S": "0.2",
        },
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


@pytest.mark.stack
@pytest.mark.slow
def test_example_records_arrive_in_kafka(stack_env: dict[str, str], tmp_path: Path) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    topic = new_raw_topic(bootstrap)
    run_id = f"example-{uuid.uuid4().hex[:8]}"
    env = {
        "STEPLENS_KAFKA_BOOTSTRAP": bootstrap,
        "STEPLENS_TOPIC": topic,
        "STEPLENS_RUN_ID": run_id,
    }
    summary = _run_example(env, tmp_path)
    assert summary["delivered"] is True and summary["run_id"] == run_id
    sent = summary["seq"]
    assert isinstance(sent, int) and sent > 0
    records = consume_all(bootstrap, topic, lambda rs: len(rs) >= sent, timeout_s=60)
    assert sorted(r.seq for r in records) == list(range(sent))
    assert {r.run_id for r in records} == {run_id}
    kinds = {r.kind for r in records}
    assert {"run_meta", "step", "step_window", "eval", "batch", "hw"} <= kinds
    windows = [r for r in records if r.kind == "step_window"]
    assert sum(r.data["count"] for r in windows) == STEPS  # every step is in a window
    watched = [r for r in records if r.kind == "step" and "param_norm" in r.data]
    assert watched and all(r.data["param_norm"] > 0 for r in watched)
    batch = next(r for r in records if r.kind == "batch")
    assert batch.data["n_samples"] == 32 and len(batch.data["sample_hashes"]) == 32


def test_example_exits_0_without_kafka(tmp_path: Path) -> None:
    env = {
        "STEPLENS_KAFKA_BOOTSTRAP": "127.0.0.1:9",  # nothing listens on the discard port
        "STEPLENS_TOPIC": "unreachable.raw",
        "STEPLENS_RUN_ID": f"offline-{uuid.uuid4().hex[:8]}",
        "STEPLENS_DELIVERY_TIMEOUT_S": "1",
        "STEPLENS_SHUTDOWN_TIMEOUT_S": "2",
    }
    summary = _run_example(env, tmp_path)
    assert summary["delivered"] is False and summary["spooled"] == summary["seq"]
    segments = list(tmp_path.rglob("*.seg"))
    assert segments and sum(p.stat().st_size for p in segments) > 0
