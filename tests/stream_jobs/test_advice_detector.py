"""The remedy policy through ``RunDetector`` and the worker's ``Scorer`` (no Kafka: the
publisher's sends are collected): a corrupted batch whose loss is back at the next step gets
its samples skipped and nothing else; damage that stays is rewound, decided on a step batch
without alerts, the incident reported again with it; the state survives a restart; what the
budget holds is counted."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import numpy as np
import orjson
from prometheus_client import CollectorRegistry

from steplens.schema import encode, make_record
from steplens.schema.topics import Topics
from steplens.stream_jobs.engine.advice import Advised
from steplens.stream_jobs.engine.detector import CODEC, RunDetector
from steplens.stream_jobs.engine.publish_limit import QuietLimiter
from steplens.stream_jobs.worker.metrics import WorkerMetrics
from steplens.stream_jobs.worker.publisher import Publisher
from steplens.stream_jobs.worker.run_limits import RunLimits
from steplens.stream_jobs.worker.scoring import Scorer
from steplens.stream_jobs.worker.settings import LimitSettings

ALL = ["skip_samples", "rewind", "lower_lr"]


def _t(i: int) -> int:
    return (i + 1) * 10**8  # 0.1 s a step


def _records(steps: range, loss, every: int = 100, world: int = 1) -> list:
    """A run's records: run_meta, a checkpoint every ``every`` steps, each rank's batch (its
    sample ids) and step."""
    recs = []
    if steps.start == 0:
        meta = {"world_size": world, "remedies": ALL}
        recs.append(make_record("run_meta", meta, run_id="r", time_ns=_t(0)))
    for i in steps:
        if i % every == 0:
            recs.append(make_record("checkpoint", {"path": f"/ck/{i}"}, run_id="r", step=i))
        for rank in range(world):
            ids = [f"doc-{i}-{rank}-{k}" for k in range(4)]
            data = {"n_samples": 4, "sample_ids": ids}
            recs.append(make_record("batch", data, run_id="r", rank=rank, step=i, time_ns=_t(i)))
            step = {"loss": loss(i, rank), "grad_norm": 1.0}
            recs.append(make_record("step", step, run_id="r", rank=rank, step=i, time_ns=_t(i)))
    return recs


def _noisy(seed: int = 3):
    rng = random.Random(seed)
    return lambda i: 3.0 * (1 - i / 4000) + rng.gauss(0, 0.01)


def _through(det: RunDetector, recs: list) -> tuple[list[Advised], list[Advised], list]:
    given, held, reports = [], [], []
    for rec in recs:
        _, alerts = det.process(rec)
        if rec.kind == "step":
            d = det.advise(alerts, rec.time_ns)
            given += d.given
            held += d.held
            reports += [a for a in d.alerts if a.evidence.get("remedies")]
    return given, held, reports


def test_a_corrupted_batch_back_on_trend_at_the_next_step_gets_its_samples_skipped_only():
    base = _noisy()
    # rank 0 reads random tokens at step 1000; every other loss on the trend
    recs = _records(range(1100), lambda i, r: 40.0 if (i, r) == (1000, 0) else base(i), world=2)
    det = RunDetector("r")
    given, held, _ = _through(det, recs)
    assert [a.action for a in given] == ["skip_samples"] and held == []
    assert given[0].data["sample_ids"] == [f"doc-1000-0-{k}" for k in range(4)]
    assert det.advice.pending == [] and det.advice.steps_lost == 0


def test_damage_that_stays_is_rewound_on_a_step_without_alerts_and_reported_again():
    base = _noisy()
    up = dict.fromkeys(range(251, 400), 1.15)  # back to the trend after 400
    recs = _records(range(420), lambda i, r: 40.0 if i == 250 else up.get(i, 1.0) * base(i))
    det = RunDetector("r")
    given, _, reports = _through(det, recs)
    assert [a.action for a in given] == ["skip_samples", "rewind"]
    rewind = given[1]
    assert rewind.step == 270  # onset + K; no alert fired at that step
    d = rewind.data
    assert (d["checkpoint_step"], d["at_step"]) == (200, 270 + 52)  # 0.1 s steps: 5 s + 2
    assert (d["steps_lost"], d["skip_batches"]) == (122, 100)
    # the spike's incident resolved at 260: reported again in its state, at the step's time
    again = [a for a in reports if a.time_ns == _t(270)]
    assert again and again[0].fingerprint == d["fingerprint"] and again[0].state == "resolved"
    [entry] = [r for r in again[0].evidence["remedies"] if r["action"] == "rewind"]
    assert entry["at_step"] == d["at_step"] and entry["evidence"] == d["evidence"]
    # stored and restored: the judgement state and the budget's use go with the run
    head, parts = det.dump(det.series)
    back = RunDetector.load(head, lambda r, _slot: parts.get(r))
    assert back is not None and back.advice == det.advice
    for name in ("loss_step", "loss_x", "loss_first"):
        assert np.array_equal(getattr(back.advice, name), getattr(det.advice, name))
    assert back.advice.steps_lost == 122
    assert CODEC.unpack(CODEC.pack(det.advice)) == det.advice


def test_a_rank_that_rewinds_drops_the_losses_of_its_abandoned_steps():
    base = _noisy()
    det = RunDetector("r")
    _through(det, _records(range(300), lambda i, r: base(i)))
    assert det.advice.loss_step.max() == 299
    _through(det, _records(range(201, 205), lambda i, r: base(i)))  # back to 201
    assert det.advice.loss_step.max() == 204 and det.advice.last_step == 204


def _scorer(sent: list, registry: CollectorRegistry) -> Scorer:
    async def send(topic: str, key: bytes | None, value: bytes) -> None:
        sent.append((topic, value))

    metrics = WorkerMetrics(registry)
    out = Publisher(send, Topics(), metrics, QuietLimiter(0, 0.0), "test")
    return Scorer(RunLimits(LimitSettings(), list), None, out, metrics)


def _message(recs: list, offset: int) -> SimpleNamespace:
    items = [[0, offset + k, encode(r).decode()] for k, r in enumerate(recs)]
    return SimpleNamespace(value=orjson.dumps(items))


def test_the_worker_sends_advice_decided_on_step_batches_without_alerts_and_counts_held():
    base = _noisy()
    recs = _records(
        range(300), lambda i, r: 40.0 if i == 250 else 1.15 * base(i) if i > 250 else base(i)
    )
    sent: list = []
    registry = CollectorRegistry()
    scorer = _scorer(sent, registry)
    det = RunDetector("r", fit_inline=True)
    det.cfg.advice.remedy_budget_floor = 50  # the rewind's 122 steps are past it

    async def main() -> None:
        for k in range(0, len(recs), 7):  # messages of a few records each
            await scorer.score(det, "r", _message(recs[k : k + 7], k))

    asyncio.run(main())
    advice = [orjson.loads(v) for t, v in sent if t == Topics().advice]
    assert [a["data"]["action"] for a in advice] == ["skip_samples"]  # the rewind was held
    held = registry.get_sample_value(
        "steplens_worker_advice_total", {"action": "rewind", "outcome": "held_budget"}
    )
    assert held == 1.0
    alerts = [orjson.loads(v) for t, v in sent if t == Topics().alerts]
    suggested = [
        r
        for a in alerts
        for r in a["data"]["evidence"].get("remedies", ())
        if r["action"] == "rewind"
    ]
    assert suggested and suggested[-1]["held"] == "budget"
    assert "a person decides" in suggested[-1]["evidence"]


def test_windowed_runs_are_judged_on_their_windows_with_the_window_in_the_lead():
    base = _noisy()
    det = RunDetector("r")
    meta = {"world_size": 1, "remedies": ["rewind"]}
    det.process(make_record("run_meta", meta, run_id="r", time_ns=_t(0)))
    given = []
    for first in range(0, 400, 10):
        if first % 100 == 0:
            det.process(make_record("checkpoint", {"path": f"/ck/{first}"}, run_id="r", step=first))
        xs = [base(i) * (1.15 if i > 250 else 1.0) for i in range(first, first + 10)]
        peak = 40.0 if first == 250 else max(xs)
        mean = (sum(xs) + (peak - xs[0] if first == 250 else 0.0)) / 10
        stats = {"count": 10, "mean": mean, "min": min(xs), "max": peak, "last": xs[-1]}
        data = {"step_first": first, "step_last": first + 9, "count": 10, "metrics": {
            "loss": stats,
            "grad_norm": {"count": 10, "mean": 1.0, "min": 1.0, "max": 1.0, "last": 1.0},
        }}  # fmt: skip
        rec = make_record("step_window", data, run_id="r", step=first + 9, time_ns=_t(first + 9))
        _, alerts = det.process(rec)
        given += det.advise(alerts, rec.time_ns).given
    [rewind] = given
    assert det.advice.window == 10
    d = rewind.data
    # the spike's window ends at 259, its onset; judged at the first window starting past 269
    assert (d["onset_step"], rewind.step, d["checkpoint_step"]) == (259, 279, 200)
    assert d["at_step"] == rewind.step + 50 + 10 + 2  # 5 s of 0.1 s steps, the window, 2
