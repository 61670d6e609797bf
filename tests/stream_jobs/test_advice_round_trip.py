"""The round trip on the local stack: two runs' ranks (real producers) and a worker on one set
of topics; a loss that jumps in one run and stays up reaches that run's rank as advice (skip
its samples, rewind to the checkpoint before it, at a step ahead of the run, with its cost)
and never the other run's, which refuses it unread; the rank's answer (``acted``) and its
checkpoint go to the raw topic, and the incident is reported again with the advice and the
answer in its evidence."""

from __future__ import annotations

import time
import uuid

import pytest

from advice_round_trip import Rank
from steplens.schema import RUN_RANK

pytestmark = pytest.mark.stack


def test_advice_reaches_the_right_run_only_and_its_answer_comes_back(kafka, workers, tmp_path):
    # 1 s of lead: at 50 steps a second the rewind undoes fewer steps than the budget's floor;
    # no history: a new run's records wait for none (a busy InfluxDB may take its 30 s)
    w = workers("--no-arima", "--no-history", "--advice-lead-s", "1").start()
    w.wait_metrics()
    tag = uuid.uuid4().hex[:6]
    common = {
        "bootstrap": kafka.bootstrap,
        "topics": kafka.topics,
        "steps": 160,
        "full_resolution": True,
        "linger_s": 20.0,
    }
    spiky = Rank(
        f"spiky-{tag}",
        spool=tmp_path / "a",
        remedies=["skip_samples", "rewind"],
        spikes=frozenset(range(120, 160)),  # damage that stays: up from 120 to 159
        checkpoints={100: "/ckpt/step-100"},
        **common,
    )
    calm = Rank(f"calm-{tag}", spool=tmp_path / "b", remedies=["skip_samples", "rewind"], **common)
    threads = [spiky.start(), calm.start()]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and {s.advice.action for s in spiky.seen} != {
        "skip_samples",
        "rewind",
    }:
        time.sleep(0.2)
    for t in threads:
        t.join(60)
    got = {s.advice.action: s.advice for s in spiky.seen}
    assert set(got) == {"skip_samples", "rewind"}, w.log.read_text()[-3000:]
    skip, rewind = got["skip_samples"], got["rewind"]
    assert skip.run_id == spiky.run_id and skip.rank == RUN_RANK and skip.onset_step == 120
    assert skip.sample_ids == [f"{spiky.run_id}-120-{k}" for k in range(4)]
    assert (rewind.checkpoint, rewind.checkpoint_step) == ("/ckpt/step-100", 100)
    assert rewind.at_step > 120 and rewind.steps_lost == rewind.at_step - 100
    assert rewind.skip_batches == rewind.batches_skipped == min(100, 500 - rewind.steps_lost)
    assert "vs trend" in rewind.evidence and (skip.steps_lost, skip.batches_skipped) == (0, 0)
    assert skip.fingerprint == rewind.fingerprint  # one incident
    assert calm.seen == []  # the other run on the same topic got nothing
    assert calm.monitor is not None and spiky.monitor is not None
    assert calm.monitor.stats()["advice"].get("other_run", 0) >= 2  # read and refused
    assert spiky.monitor.stats()["advice"].get("other_run", 0) == 0
    spiky.monitor.acted(skip, "acted", detail="4 samples skipped")
    for m in (spiky.monitor, calm.monitor):
        m.shutdown(10)
    raw = kafka.collect(
        kafka.topics.raw,
        lambda recs: any(r.kind == "acted" for r in recs),
        timeout_s=30,
    )
    [acted] = [r for r in raw if r.kind == "acted"]
    assert acted.run_id == spiky.run_id
    assert acted.data == {
        "action": "skip_samples",
        "fingerprint": skip.fingerprint,
        "outcome": "acted",
        "detail": "4 samples skipped",
    }
    [ckpt] = [r for r in raw if r.kind == "checkpoint"]
    assert (ckpt.step, ckpt.data["path"]) == (100, "/ckpt/step-100")
    advice = kafka.collect(kafka.topics.advice, lambda recs: len(recs) >= 2, timeout_s=10)
    assert {(r.run_id, r.data["action"]) for r in advice} == {
        (spiky.run_id, "skip_samples"),
        (spiky.run_id, "rewind"),
    }

    def answered(recs: list) -> list:
        return [
            r
            for r in recs
            if r.run_id == spiky.run_id
            and any(g["outcome"] == "acted" for a in r.data["evidence"].get("remedies", ())
                    for g in a["answers"])
        ]  # fmt: skip

    alerts = kafka.collect(kafka.topics.alerts, lambda recs: bool(answered(recs)), timeout_s=30)
    advised = [r for r in alerts if r.data["evidence"].get("remedies")]
    both = next(  # the report of the rewind's step
        r.data["evidence"]["remedies"]
        for r in advised
        if {a["action"] for a in r.data["evidence"]["remedies"]} == {"skip_samples", "rewind"}
    )
    assert all(a["answers"] == [] for a in both)
    (told,) = [a for a in both if a["action"] == "rewind"]
    assert (told["at_step"], told["steps_lost"]) == (rewind.at_step, rewind.steps_lost)
    (again, *_) = answered(alerts)
    assert again.data["fingerprint"] == skip.fingerprint
    (skipped,) = [a for a in again.data["evidence"]["remedies"] if a["action"] == "skip_samples"]
    assert skipped["answers"] == [
        {"outcome": "acted", "n": 1, "ranks": [0], "details": ["4 samples skipped"]}
    ]
