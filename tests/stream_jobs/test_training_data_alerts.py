"""Training and data signals end to end through ``RunDetector.process``: each event gives the
incident it should, with its hint and the evidence that points at the cause (the batch of a
spike, the layers that moved, a stuck rank's stacks, the XID code), and healthy streams of the
same kinds give none."""

from __future__ import annotations

import hashlib
import math
import random

from steplens.schema import make_record
from steplens.stream_jobs.engine.core import flatten
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.hints import hint_for
from steplens.stream_jobs.engine.run_keys import shard_key


def t(i: int) -> int:
    return (i + 1) * 10**8


def step(i: int, rank: int = 0, **data):
    return make_record("step", data, run_id="r", rank=rank, step=i, time_ns=t(i))


def md5(x: object) -> str:
    return hashlib.md5(str(x).encode()).hexdigest()[:16]


def run(records) -> tuple[RunDetector, list, list]:
    """The detector after ``records``, every incident report and every signal."""
    det = RunDetector("r")
    reports, sigs = [], []
    for rec in records:
        got, alerts = det.process(rec)
        reports += alerts
        sigs += flatten(got)
    return det, reports, sigs


def opened(reports) -> list:
    return [a for a in reports if a.state == "firing"]


def members(report) -> dict:
    return {m["rule"]: m for m in report.evidence["members"]}


def healthy(i: int, rng: random.Random, **more) -> dict:
    return {
        "loss": 3.0 * (1 - i / 4000) + rng.gauss(0, 0.01),
        "grad_norm": 1.0 + rng.gauss(0, 0.05),
        **more,
    }


# ------------------------------------------------------------------------------ dynamics
def test_a_clipping_storm_is_a_training_incident_with_its_hint():
    rng = random.Random(1)
    recs = [
        step(i, **healthy(i, rng), clipped=rng.random() < (0.9 if i >= 300 else 0.1))
        for i in range(450)
    ]
    _, reports, _ = run(recs)
    first = opened(reports)
    assert first and first[0].rule == "clipping:clipped" and first[0].severity == "warning"
    assert 300 < first[0].step < 360 and first[0].hint == hint_for("clipping:clipped")
    assert "most steps" in first[0].hint


def test_vanishing_gradients_are_an_incident_naming_the_layers_that_collapsed():
    rng = random.Random(2)
    recs = []
    for i in range(600):
        fall = 10 ** (-5 * min(1.0, max(0, i - 400) / 60))
        data = healthy(i, rng, grad_norm=(1.0 + rng.gauss(0, 0.05)) * fall)
        if i % 10 == 0:
            data["layer_grad_norms"] = {"emb": 0.5 * fall, "h.0": 0.7 * fall, "head": 0.3}
        recs.append(step(i, **data))
    _, reports, _ = run(recs)
    first = opened(reports)
    assert first and first[0].rule == "vanishing:grad_norm" and 400 < first[0].step < 470
    ev = members(first[0])["vanishing:grad_norm"]
    assert {x["layer"] for x in ev["layers"][:2]} == {"emb", "h.0"}
    assert ev["layers"][-1]["layer"] == "head" and ev["layers"][0]["ratio"] < 1


def test_an_update_share_collapse_with_adam_like_numbers_warns():
    """Adam moves most elements by about the lr: 70-90 % of them by more than 1e-3 of their
    size; an optimizer whose state was reset with a huge epsilon moves 1 %."""
    rng = random.Random(3)
    sched = {"kind": "cosine", "peak_lr": 3e-4, "warmup_steps": 50, "total_steps": 5000}
    recs = [make_record("run_meta", {"world_size": 1, "lr_schedule": sched}, run_id="r")]
    for i in range(0, 800, 10):  # watch's interval
        share = rng.uniform(0.7, 0.9) if i < 600 else rng.uniform(0.005, 0.02)
        if i < 50:
            share = 0.01  # the warmup moves few elements: not judged
        recs.append(step(i, **healthy(i, rng), update_ratio=share, param_norm=200.0))
    _, reports, _ = run(recs)
    first = opened(reports)
    assert [(a.rule, a.step) for a in first] == [("training:update_ratio", 620)]
    assert first[0].hint == hint_for("training:update_ratio")


def test_a_gradient_spike_names_the_layer_whose_norm_jumped():
    rng = random.Random(4)
    recs = []
    for i in range(400):
        data = healthy(i, rng)
        layers = {f"h.{k}": 0.3 + rng.gauss(0, 0.005) for k in range(8)}
        if i == 300:
            data["grad_norm"] *= 30
            layers["h.5"] = 9.0
        if i % 10 == 0 or i == 300:
            data["layer_grad_norms"] = layers
        recs.append(step(i, **data))
    _, reports, _ = run(recs)
    first = opened(reports)
    assert first and first[0].step == 300 and first[0].severity == "critical"
    ev = members(first[0])["spike:grad_norm"]
    assert ev["layers"][0]["layer"] == "h.5" and ev["layers"][0]["ratio"] > 20
    assert ev["layers_step"] == 300 and len(ev["layers"]) == 5


def test_grad_norm_preclip_is_judged_like_grad_norm():
    rng = random.Random(5)
    recs = []
    for i in range(400):
        pre = (1.0 + rng.gauss(0, 0.05)) * (30 if i == 300 else 1)
        recs.append(step(i, **healthy(i, rng), grad_norm_preclip=pre))
    det, reports, sigs = run(recs)
    first = opened(reports)
    assert [(a.rule, a.step) for a in first] == [("spike:grad_norm_preclip", 300)]
    assert first[0].hint == hint_for("spike:grad_norm_preclip") != hint_for("spike:loss")
    names = {s.name for s in sigs if s.metric == "grad_norm_preclip"}
    assert {"spike", "arima", "vanishing"} <= names
    assert det.series[0]["arima"]["grad_norm_preclip"].params is not None


def test_a_loss_and_pre_clip_gradient_spike_together_are_the_loss_grad_correlation():
    rng = random.Random(6)
    recs = []
    for i in range(400):
        data = healthy(i, rng, grad_norm_preclip=1.0 + rng.gauss(0, 0.05))
        if i == 300:
            data["loss"] *= 1.6
            data["grad_norm_preclip"] *= 30
        recs.append(step(i, **data))
    _, reports, _ = run(recs)
    first = opened(reports)
    assert first and first[0].step == 300
    got = members(first[-1])
    assert {"spike:loss", "spike:grad_norm_preclip", "correlation:loss_grad"} <= set(got)


def test_lr_events_are_published_signals_and_never_alerts():
    from steplens.stream_jobs.engine.publish_limit import QuietLimiter

    sched = {"kind": "step", "peak_lr": 1e-3, "warmup_steps": 20, "milestones": [200]}
    recs = [make_record("run_meta", {"world_size": 1, "lr_schedule": sched}, run_id="r")]
    rng = random.Random(6)
    for i in range(300):
        lr = 1e-3 * min(1.0, (i + 1) / 20) * (0.1 if i >= 200 else 1.0)
        recs.append(step(i, **healthy(i, rng), lr=lr))
    det = RunDetector("r")
    limiter = QuietLimiter(every=10_000, interval_s=1e9)
    reports, published = [], []
    for rec in recs:
        got, alerts = det.process(rec)
        reports += alerts
        for s in got:
            published += [s.view(k) for k in limiter.picked("r", s, 0.0) if s.name == "lr_event"]
    assert [(s.step, s.detail["kind"], s.detail["declared_step"]) for s in published] == [
        (19, "warmup_end", 20),
        (200, "decay", 200),
    ]
    assert all(s.severity is None for s in published) and opened(reports) == []


def test_a_window_std_feeds_volatility_as_the_noise_of_its_steps():
    """Windows of 100 steps whose steps are 20 % noisy around a flat mean: their means barely
    move, so only their own std (20 %) shows the noise."""
    rng = random.Random(7)
    recs = []
    for w in range(20):
        loss = {"count": 100, "mean": 2.0 + rng.gauss(0, 0.004), "std": 0.4, "min": 1.0,
                "max": 3.0, "last": 2.0, "nonfinite": 0}  # fmt: skip
        data = {"step_first": w * 100, "step_last": w * 100 + 99, "count": 100,
                "metrics": {"loss": loss}}  # fmt: skip
        recs.append(make_record("step_window", data, run_id="r", step=w * 100 + 99, time_ns=t(w)))
    _, reports, sigs = run(recs)
    vol = [s for s in sigs if s.name == "volatility"]
    assert 0.19 < vol[-1].value < 0.21 and vol[-1].severity == "warning"
    assert "volatility:loss" in {m["rule"] for a in opened(reports) for m in a.evidence["members"]}


# ------------------------------------------------------------------------------ from alert to cause
def batch(i: int, rank: int = 0, **more):
    ids = [f"doc-{rank}-{i}-{k}" for k in range(8)]
    lengths = {"length_mean": 900.0, "length_max": 2048, "max_len": 2048, "over_length": 0}
    data = {"n_samples": 8, "sample_hashes": [md5(x) for x in ids], "sample_ids": ids}
    data.update(lengths, **more)
    return make_record("batch", data, run_id="r", rank=rank, step=i, time_ns=t(i))


def test_a_loss_spike_names_the_samples_of_its_batch_on_its_rank():
    rng = random.Random(8)
    recs = []
    for i in range(300):
        for rank in (0, 1):
            recs.append(batch(i, rank))  # log_batch comes before log_step in a loop
            loss = 40.0 if (i == 250 and rank == 1) else healthy(i, rng)["loss"]
            recs.append(step(i, rank, loss=loss, grad_norm=1.0 + rng.gauss(0, 0.05)))
    _, reports, _ = run(recs)
    first = opened(reports)
    assert first and first[0].step == 250
    ev = members(first[0])["spike:loss"]
    assert ev["rank"] == 1 and ev["samples"]["step"] == 250
    assert ev["samples"]["ids"] == [f"doc-1-250-{k}" for k in range(8)]
    assert ev["samples"]["hashes"][0] == md5("doc-1-250-0")
    assert ev["samples"]["length_max"] == 2048


def test_a_batch_record_after_its_spike_is_added_to_the_incident():
    rng = random.Random(9)
    recs = []
    for i in range(300):
        recs.append(step(i, loss=40.0 if i == 250 else healthy(i, rng)["loss"]))
        recs.append(batch(i))  # sent after its step
    _, reports, _ = run(recs)
    first = opened(reports)
    assert [a.step for a in first] == [250, 250]  # opened, then again with the samples
    assert "samples" not in members(first[0])["spike:loss"]
    assert members(first[1])["spike:loss"]["samples"]["ids"][0] == "doc-0-250-0"
    assert first[1].fingerprint == first[0].fingerprint


def hw(time_ns: int, **gpu):
    data = {"gpus": [{"index": 0, "util_gpu": 95.0, **gpu}]}
    return make_record("hw", data, run_id="r", rank=0, host="n1", time_ns=time_ns)


def stacks(rank: int, last: int, time_ns: int):
    threads = [{"name": "MainThread", "id": 1, "stack": 'File "train.py", line 88, in step\n'
                "    dist.all_reduce(grad)\n"}]  # fmt: skip
    data = {"stalled_s": 70.0, "last_step": last, "threads": threads}
    return make_record("stacks", data, run_id="r", rank=rank, time_ns=time_ns)


def hang_records(stacks_at_s: float):
    """Two ranks step 100 times at 10 steps a second; rank 1 then stops while rank 0's host
    keeps sampling; rank 1 sends its stacks ``stacks_at_s`` after its last step."""
    recs = [make_record("run_meta", {"world_size": 2}, run_id="r")]
    rng = random.Random(10)
    for i in range(100):
        recs.append(step(i, 0, **healthy(i, rng), step_time_s=0.1))
        if i < 60:
            recs.append(step(i, 1, **healthy(i, rng), step_time_s=0.1))
    last_ns = t(59)
    sent = False
    for s in range(1, 140):
        now = t(99) + s * 10**9
        if not sent and now - last_ns >= stacks_at_s * 1e9:
            recs.append(stacks(1, 59, now))
            sent = True
        recs.append(hw(now))
    return recs


def test_a_hang_incident_carries_the_stacks_of_the_stuck_rank():
    for at_s in (45.0, 120.0):  # sent before the hang is confirmed, or after it fired
        _, reports, _ = run(hang_records(at_s))
        hangs = [a for a in opened(reports) if "hang:progress" in members(a)]
        assert hangs, at_s
        ev = next(m for m in hangs[-1].evidence["members"] if m["scope"] == "rank:1")
        assert ev["stacks"]["last_step"] == 59
        assert "dist.all_reduce" in ev["stacks"]["threads"][0]["stack"]
        assert hangs[-1].severity == "critical"
        assert ("stacks" in members(hangs[0])["hang:progress"]) == (at_s < 60)


def test_a_shard_past_a_wide_runs_first_pages_no_hang():
    """The same hang in a detector of a wide run's second shard: its signals say which rank
    stopped, and no incident opens (shard 0, whose ranks stop too, pages it)."""
    det = RunDetector(shard_key("r", 1))
    reports, sigs = [], []
    for rec in hang_records(120.0):
        got, alerts = det.process(rec)
        reports += alerts
        sigs += flatten(got)
    assert opened(reports) == []
    stalled = [s for s in sigs if s.rule == "hang:progress" and s.scope == "rank:1"]
    assert stalled and max(s.value for s in stalled) > 60.0
    _, first_shard, _ = run(hang_records(120.0))
    assert [a for a in opened(first_shard) if "hang:progress" in members(a)]


# ------------------------------------------------------------------------------ data quality
def test_a_language_model_batch_stream_raises_no_label_warning():
    rng = random.Random(11)
    recs = []
    for i in range(200):
        data = {"n_samples": 8, "supervised_share": 0.3 + rng.gauss(0, 0.01),
                "label_counts": {"-100": 20000, "42": 3}}  # fmt: skip
        recs.append(make_record("batch", data, run_id="r", step=i, time_ns=t(i)))
    _, reports, sigs = run(recs)
    assert opened(reports) == []
    assert {s.metric for s in sigs} == {"supervised_share"}


def sharded(i: int, rank: int, epoch: int, shard: int | None = None):
    shard = rank if shard is None else shard
    ids = [f"s{(i % 25) * 64 + shard * 16 + k}" for k in range(16)]  # 25 steps an epoch
    data = {"n_samples": 16, "sample_hashes": [md5(x) for x in ids], "epoch": epoch}
    return make_record("batch", data, run_id="r", rank=rank, step=i, time_ns=t(i))


def test_cross_rank_duplicates_alert_and_a_new_epoch_does_not():
    recs = [sharded(i, rank, i // 25) for i in range(100) for rank in range(4)]
    _, reports, _ = run(recs)
    assert opened(reports) == []  # four epochs over the same samples: no repeat within one
    bad = [sharded(i, rank, i // 25, 0 if rank == 2 and i >= 60 else None)
           for i in range(100) for rank in range(4)]  # fmt: skip
    _, reports, _ = run(bad)
    first = opened(reports)
    # over the last 20 batch records: 16 of 320 samples (5 %) at step 60, 10 % at 61
    assert [(a.rule, a.step) for a in first] == [("data:duplicate_rate", 61)]
    assert first[0].hint == hint_for("data:duplicate_rate") and "shard" in first[0].hint


# ------------------------------------------------------------------------------ hardware
def test_an_xid_or_ecc_error_is_a_critical_hardware_incident_with_the_xid_code():
    recs = [hw(s * 10**9, xid_count=0, ecc_uncorrected=0) for s in range(5)]
    recs.append(hw(5 * 10**9, xid_count=1, ecc_uncorrected=0, xid_last=79))
    recs += [hw(s * 10**9, xid_count=1, ecc_uncorrected=0) for s in range(6, 30)]
    recs.append(hw(30 * 10**9, xid_count=1, ecc_uncorrected=2))
    _, reports, _ = run(recs)
    first = opened(reports)
    assert [(a.rule, a.severity, a.evidence["topic"]) for a in first] == [
        ("hardware:xid_count", "critical", "hardware"),
        ("hardware:ecc_uncorrected", "critical", "hardware"),
    ]
    xid = members(first[0])["hardware:xid_count"]
    assert xid["xid_last"] == 79 and xid["scope"] == "gpu:n1/0"
    assert first[0].hint == hint_for("hardware:xid_count")
    resolved = [a for a in reports if a.state == "resolved"]
    assert resolved and resolved[0].time_ns == 15 * 10**9  # ten clean samples later
    assert math.isfinite(xid["value"])


def test_length_histograms_are_published_per_window_and_never_alert():
    rng = random.Random(5)
    recs = []
    for i in range(40):
        for rank in range(2):
            counts = [rng.randint(0, 9) for _ in range(4)]
            data = {"n_samples": sum(counts), "length_edges": [0, 64, 128, 256, 512],
                    "length_counts": counts, "length_mean": 100.0 + rng.gauss(0, 30)}  # fmt: skip
            recs.append(make_record("batch", data, run_id="r", rank=rank, step=i, time_ns=t(i)))
    _, reports, sigs = run(recs)
    assert opened(reports) == []
    hist = [s for s in sigs if s.name == "length_histogram"]
    assert [s.step for s in hist] == [9, 19, 29, 39]  # 20 batch records a window, both ranks
    assert sum(sum(s.detail["counts"]) for s in hist) == sum(
        sum(r.data["length_counts"]) for r in recs
    )
