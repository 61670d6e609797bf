"""A record stamped later than now + ``STEPLENS_MAX_FUTURE_SKEW_S`` is not scored by the worker:
it becomes a dead letter with the sinks' reason and is counted (the steps of a ``step_batch``
in time are scored, as the sinks store them)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import orjson
from prometheus_client import generate_latest

from steplens.schema import decode, encode, make_record
from steplens.schema.time_bounds import TimeBounds
from steplens.schema.topics import Topics
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.publish_limit import QuietLimiter
from steplens.stream_jobs.worker.metrics import WorkerMetrics
from steplens.stream_jobs.worker.publisher import Publisher
from steplens.stream_jobs.worker.run_limits import RunLimits
from steplens.stream_jobs.worker.scoring import Scorer
from steplens.stream_jobs.worker.settings import LimitSettings

SKEW_S = 120
ALLOWED = "s in the future (more than the 120 s clock skew allowed)"


def score(records: list) -> tuple[RunDetector, list, WorkerMetrics]:
    """``records`` as one by-run message scored into a fresh detector of run ``r``: the
    detector, the dead letters sent, the metrics."""
    sent: list[tuple[str, bytes | None, bytes]] = []

    async def send(topic: str, key: bytes | None, value: bytes) -> None:
        sent.append((topic, key, value))

    topics = Topics()
    metrics = WorkerMetrics()
    out = Publisher(send, topics, metrics, QuietLimiter(), "test")
    scorer = Scorer(RunLimits(LimitSettings(), list), None, out, metrics, TimeBounds(SKEW_S))
    det = RunDetector("r", fit_inline=True)
    message = [[0, i, encode(rec).decode()] for i, rec in enumerate(records)]
    assert asyncio.run(scorer.score(det, "r", SimpleNamespace(value=orjson.dumps(message))))
    dead = [decode(v).data for t, _, v in sent if t == topics.dead_letters]
    return det, dead, metrics


def out_of_time(metrics: WorkerMetrics) -> float:
    text = generate_latest(metrics.registry).decode()
    line = 'steplens_worker_out_of_time_total{reason="future"} '
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))


def step(i: int, time_ns: int):
    return make_record("step", {"loss": 2.0}, run_id="r", step=i, seq=i, time_ns=time_ns)


def test_a_record_from_the_future_is_a_dead_letter_not_a_signal() -> None:
    now = time.time_ns()
    ahead = now + 3600 * 10**9
    within = now + (SKEW_S // 2) * 10**9  # a clock a little ahead is fine
    det, dead, metrics = score([step(0, now), step(1, ahead), step(2, within)])
    assert det.records == 2
    assert len(dead) == 1 and dead[0]["offset"] == 1
    assert dead[0]["reason"].startswith("time is ") and dead[0]["reason"].endswith(ALLOWED)
    assert out_of_time(metrics) == 1


def test_a_step_batch_keeps_its_steps_in_time() -> None:
    now = time.time_ns()
    times = [now, now + 10**9, now + 7200 * 10**9, now + 7201 * 10**9]
    entries = [{"step": i, "time_ns": t, "loss": 2.0} for i, t in enumerate(times)]
    batch = make_record("step_batch", {"records": entries}, run_id="r", step=3)
    det, dead, metrics = score([batch])
    assert det.records == 2  # steps 0 and 1
    assert len(dead) == 1 and dead[0]["reason"].startswith("step 2: time is ")
    assert dead[0]["reason"].endswith(ALLOWED)
    assert out_of_time(metrics) == 2

    all_ahead = [{**e, "time_ns": now + 7200 * 10**9} for e in entries]
    batch = make_record("step_batch", {"records": all_ahead}, run_id="r", step=3)
    det, dead, metrics = score([batch])
    assert det.records == 0 and len(dead) == 1 and out_of_time(metrics) == 4
