"""Full resolution against the real Kafka: every logged step arrives once, in order."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from producer_kafka_helpers import consume_all, new_raw_topic

from steplens.producer.monitor import Monitor
from steplens.schema import Record, unbatch

pytestmark = pytest.mark.stack


def full_monitor(bootstrap: str, topic: str, tmp_path: Path, **config: Any) -> Monitor:
    return Monitor(
        f"full-{uuid.uuid4().hex[:8]}",
        kafka_bootstrap=bootstrap,
        topic=topic,
        hw_interval_s=0,
        spool_dir=str(tmp_path),
        full_resolution=True,
        **config,
    )


def steps_of(records: list[Record]) -> list[Record]:
    return [s for r in records if r.kind == "step_batch" for s in unbatch(r)]


def test_every_logged_step_arrives_once_in_order(stack_env: dict[str, str], tmp_path: Path) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    topic = new_raw_topic(bootstrap)
    n = 3000
    m = full_monitor(bootstrap, topic, tmp_path, batch_steps=128, batch_s=3600, sample_rate=1.0)
    logged: list[dict[str, Any]] = []
    for step in range(n):
        loss = math.nan if step == 1234 else 3.0 - step * 1e-4
        vals = {"loss": loss, "lr": 1e-4 * (1 + step % 7), "grad_norm": 0.5, "tokens": 2048}
        m.log_step(step, **vals, step_time_s=0.25, aux=step * 0.5)
        logged.append(vals)
    m.close()
    sent = m.stats()["seq"]
    records = consume_all(bootstrap, topic, lambda rs: len(rs) >= sent, timeout_s=90)
    assert sorted(r.seq for r in records) == list(range(sent))  # none lost, none twice
    assert {r.kind for r in records} == {"run_meta", "step_batch", "health"}
    steps = steps_of(records)  # one rank: one partition, in the order sent
    assert [s.step for s in steps] == list(range(n))
    for s, vals in zip(steps, logged, strict=True):
        data = s.data
        assert data["lr"] == vals["lr"] and data["grad_norm"] == 0.5 and data["tokens"] == 2048
        assert data["loss"] == vals["loss"] or (math.isnan(data["loss"]) and s.step == 1234)
        assert data["scalars"] == {"aux": s.step * 0.5} and data["step_time_s"] == 0.25
        assert s.run_id == m.run_id and s.rank == m.rank and s.pid == m.pid
    assert steps[1234].data["reason"] == "guard"
    # the NaN step ended its batch: it left at once
    ends = [r.data["records"][-1]["step"] for r in records if r.kind == "step_batch"]
    assert 1234 in ends
    assert all(len(r.data["records"]) <= 128 for r in records if r.kind == "step_batch")


def test_a_spike_is_on_kafka_before_the_batch_is_full_or_old(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    topic = new_raw_topic(bootstrap)
    m = full_monitor(bootstrap, topic, tmp_path, batch_steps=4096, batch_s=3600)
    try:
        for step in range(60):
            m.log_step(step, loss=2.0 + 0.001 * (step % 5), step_time_s=0.1)
        m.log_step(60, loss=400.0, step_time_s=0.1)
        m.log_step(61, loss=2.0, step_time_s=0.1)
        # no flush, no close: the spike's batch is sent by itself
        records = consume_all(
            bootstrap, topic, lambda rs: any(r.kind == "step_batch" for r in rs), timeout_s=60
        )
        steps = steps_of(records)
        assert [s.step for s in steps] == list(range(61))
        assert steps[-1].data["loss"] == 400.0 and steps[-1].data["reason"] == "guard"
    finally:
        m.close()


def test_close_sends_the_partial_batch(stack_env: dict[str, str], tmp_path: Path) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    topic = new_raw_topic(bootstrap)
    m = full_monitor(bootstrap, topic, tmp_path, batch_steps=4096, batch_s=3600)
    for step in range(25):
        m.log_step(step, loss=1.5, step_time_s=0.1)
    m.close()
    records = consume_all(
        bootstrap, topic, lambda rs: any(r.kind == "health" for r in rs), timeout_s=60
    )
    assert [s.step for s in steps_of(records)] == list(range(25))
    assert [len(r.data["records"]) for r in records if r.kind == "step_batch"] == [25]
