"""The route stage's lag, read by its own thread between batches, against a real broker."""

from __future__ import annotations

import time
import uuid

from test_stream_worker import steps

from steplens.stream_jobs.engine.signals.registry import SERIES_RANKS
from steplens.stream_jobs.worker import router as route
from steplens.stream_jobs.worker.run_shards import first_ranks
from steplens.stream_jobs.worker.settings import WorkerSettings, ensure_worker_topics


def test_the_lag_counts_the_backlog_and_reaches_zero_once_it_is_routed(kafka, monkeypatch):
    """A backlog of 400 raw records routed 40 at a time, the lag read before every batch:
    a reading counts the backlog still to route, none more than is left, and once every
    record is routed the reading is 0."""
    monkeypatch.setattr(route, "LAG_EVERY_S", 0.0)
    run = f"run-{uuid.uuid4().hex[:6]}"
    total = 400
    records = [r for rank in range(8) for r in steps(run, 0, total // 8, rank=rank)]
    kafka.send(records)
    s = WorkerSettings(
        bootstrap=kafka.bootstrap,
        topics=kafka.topics,
        app_id=f"lag-{uuid.uuid4().hex[:6]}",
        batch=40,
        within_s=0.5,
    )
    ensure_worker_topics(s)
    first = first_ranks(SERIES_RANKS, s.shard_ranks)
    router = route.Router(s, lambda *a: b"", first=first)
    router.consumer, router.producer = router._open()
    try:
        routed, readings = 0, []
        deadline = time.monotonic() + 60
        while routed < total:
            assert time.monotonic() < deadline, (routed, readings)
            before = routed
            routed += router.step()  # the lag read before its batch
            readings.append((before, router.lag()))
        assert all(lag <= total - done for done, lag in readings), readings
        assert any(lag > 0 for _, lag in readings), readings  # the backlog behind a batch
        end = time.monotonic() + 10
        while router.lag() != 0:
            assert time.monotonic() < end, router.lag()
            router.step()
    finally:
        router.producer.flush(10)
        router.consumer.close()
