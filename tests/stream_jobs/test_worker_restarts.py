"""A worker killed with SIGKILL: what it leaves behind. Against the real Kafka.

This module imports nothing of the worker itself, so it also runs against another checkout
(its ``PYTHONPATH``), to compare."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from steplens.schema import make_record

pytestmark = pytest.mark.stack

T0 = 1_700_000_000_000_000_000


def steps(run: str, first: int, last: int, spike_at: int | None = None) -> list:
    return [
        make_record(
            "step",
            {"loss": 40.0 if i == spike_at else 2.0 + 0.01 * ((i * 7) % 5), "step_time_s": 0.1},
            run_id=run,
            rank=0,
            step=i,
            seq=i,
            time_ns=T0 + i * 10**8,
        )
        for i in range(first, last)
    ]


def wait_for(what, timeout_s: float, step_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step_s)


def scored(worker) -> float:
    for line in worker.metrics().splitlines():
        if line.startswith('steplens_worker_records_total{kind="step"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def committed(kafka, app_id: str) -> int:
    """The offsets the route stage of workers ``app_id`` has committed on the raw topic, all
    partitions together."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"{app_id}-route"})
    try:
        meta = c.list_topics(kafka.topics.raw, timeout=10).topics[kafka.topics.raw]
        parts = [TopicPartition(kafka.topics.raw, p) for p in meta.partitions]
        return sum(max(tp.offset, 0) for tp in c.committed(parts, timeout=10))
    finally:
        c.close()


def test_an_alert_scored_again_after_a_crash_is_the_same_point(kafka, workers):
    """A spike's messages are held for a checkpoint an hour away; the worker is killed after
    their alert went out; the next worker scores them again and sends the alert again: with
    the same identity and time (the time of the record it fired on), so a store keyed by them
    (InfluxDB: tags and time) overwrites it instead of keeping two firing points."""
    run = f"replay-{uuid.uuid4().hex[:6]}"
    first = workers("--no-arima", "--checkpoint-s", "3600").start()
    first.wait_metrics()
    kafka.send(steps(run, 0, 5))  # the run's first message is checkpointed at once
    assert wait_for(lambda: scored(first) >= 5, 60)
    # its offsets committed before the spike is sent: a checkpoint still under way when the
    # spike's messages arrive (a busy machine) would take them too, and nothing is replayed
    assert wait_for(lambda: committed(kafka, first.app_id) >= 5, 60, step_s=0.5)
    kafka.send(steps(run, 5, 60, spike_at=50))  # held until a checkpoint an hour away

    def fired(got):
        return [
            a
            for a in got
            if a.run_id == run and a.data["rule"] == "spike:loss" and a.data["state"] == "firing"
        ]

    assert len(fired(kafka.collect(kafka.topics.alerts, fired, 60))) == 1
    first.kill()
    second = workers("--no-arima", "--checkpoint-s", "0", state="w1").start()
    second.wait_metrics()
    alerts = fired(kafka.collect(kafka.topics.alerts, lambda got: len(fired(got)) >= 2, 120))
    assert len(alerts) == 2  # scored again: the messages were never acknowledged
    identity = {(a.data["fingerprint"], a.data["state"], a.step, a.time_ns) for a in alerts}
    assert identity == {(alerts[0].data["fingerprint"], "firing", 50, T0 + 50 * 10**8)}


def children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_the_fit_pool_and_resource_tracker_die_with_a_killed_worker(workers):
    """SIGKILL to the worker alone (not its process group): its ARIMA fit pool process and
    the multiprocessing resource tracker are gone within seconds, not left to init."""
    w = workers().start()  # ARIMA on: the pool starts with the worker
    w.wait_metrics()
    assert w.proc is not None
    pid = w.proc.pid

    def helpers() -> list[int]:
        kids = children(pid)
        pool = [k for k in kids if "spawn_main" in cmdline(k)]
        tracker = [k for k in kids if "resource_tracker" in cmdline(k)]
        return pool + tracker if pool and tracker else []

    left = wait_for(helpers, 60)
    assert left, [cmdline(k) for k in children(pid)]
    os.kill(pid, signal.SIGKILL)
    w.proc.wait(30)
    try:
        still = wait_for(lambda: [p for p in left if alive(p)] == [], 10)
        assert still, [(p, cmdline(p)) for p in left if alive(p)]
    finally:
        for p in left:  # what this test started, if it outlived its worker
            if alive(p):
                os.kill(p, signal.SIGKILL)
