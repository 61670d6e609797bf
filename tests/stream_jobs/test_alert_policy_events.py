"""The alert policy end to end through the detector: the shapes of real events (a loss jump
with a gradient jump, a spike reported raw and again in its window) give one incident each,
with the right hint, in the step they happen."""

from __future__ import annotations

import math
import random

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.hints import hint_for


def step(i: int, loss: float, grad: float, rank: int = 0):
    data = {"loss": loss, "grad_norm": grad}
    return make_record("step", data, run_id="r", rank=rank, step=i, time_ns=(i + 1) * 10**8)


def test_a_loss_jump_with_a_gradient_jump_is_one_incident_with_the_data_pipeline_hint():
    """Loss up 9 % and the gradient norm up 5x in the same step of a healthy run (the shape of
    a real bad batch): one incident, led by the loss+gradient correlation, in that step."""
    rng = random.Random(5)
    det = RunDetector("r")
    reports = []
    for i in range(400):
        loss = 3.0 * (1 - i / 4000) + rng.gauss(0, 0.01)
        grad = 1.0 + rng.gauss(0, 0.05)
        if i == 300:
            loss, grad = loss * 1.09, grad * 5
        reports += det.process(step(i, loss, grad))[1]
    opened = [a for a in reports if a.state == "firing"]
    assert opened and {a.fingerprint for a in reports} == {opened[0].fingerprint}
    assert opened[0].step == 300 and opened[-1].step == 300
    assert opened[-1].rule == "correlation:loss_grad"
    assert opened[-1].hint == hint_for("correlation:loss_grad")
    members = {m["rule"]: m for m in opened[-1].evidence["members"]}
    # the loss jump alone, one step, is a note (a hard batch); with the gradient it is named
    assert {"spike:grad_norm", "correlation:loss_grad"} <= set(members)
    assert "spike:loss" in members["correlation:loss_grad"]["because"]
    assert any(r.endswith("grad_norm") for r in members["correlation:loss_grad"]["because"])


def test_moderate_jumps_in_the_same_step_correlate_without_alerting_alone():
    """A loss rise of 3 % and a gradient norm of 2.5x, each rare on its series but too small to
    alert alone (notes), correlate in the step they happen; far apart they do not."""
    rng = random.Random(6)

    def run(loss_at: int, grad_at: int) -> list:
        det = RunDetector("r")
        out = []
        for i in range(500):
            loss = 3.0 + rng.gauss(0, 0.002)
            grad = 1.0 + rng.gauss(0, 0.01)
            loss *= 1.03 if i == loss_at else 1.0
            grad *= 2.5 if i == grad_at else 1.0
            out += det.process(step(i, loss, grad))[1]
        return out

    together = run(400, 400)
    assert [(a.state, a.rule) for a in together if a.state == "firing"] == [
        ("firing", "correlation:loss_grad")
    ]
    assert not [a for a in run(400, 440) if a.state == "firing"]


def test_a_spike_sent_raw_is_not_reported_again_by_its_window():
    """The producer sends a spike raw at once and again inside its window's maximum: one
    incident, from the raw step."""
    rng = random.Random(7)
    det = RunDetector("r")
    reports = []
    for w in range(30):
        first, last = w * 10, w * 10 + 9
        peak = 2.0 + 0.05
        if w == 20:
            peak = 40.0
            reports += det.process(step(205, 40.0, 1.0))[1]  # the guard sends it raw
        metrics = {
            "loss": {"count": 10, "mean": 2.0 + rng.gauss(0, 0.01), "min": 1.95, "max": peak},
            "grad_norm": {"count": 10, "mean": 1.0, "min": 0.99, "max": 1.01},
        }
        window = make_record(
            "step_window",
            {"step_first": first, "step_last": last, "count": 10, "metrics": metrics},
            run_id="r",
            step=last,
            time_ns=(last + 1) * 10**8,
        )
        reports += det.process(window)[1]
    opened = [a for a in reports if a.state == "firing"]
    assert [(a.rule, a.step) for a in opened] == [("spike:loss", 205)]


def test_the_first_windows_initial_loss_is_no_spike(tmp_path):
    """A healthy run as the producer sends it at its defaults (windows of 100 steps, one step
    in 100 raw, slow steps flagged raw by its guard): the loss falls fast from its initial
    value, so the first window's largest loss is its first steps'. Nothing alerts on the loss:
    that peak has no baseline before it to be judged against."""
    from steplens.producer.delivery.transport import MemoryTransport
    from steplens.producer.monitor import Monitor

    rng = random.Random(3)
    transport = MemoryTransport()
    monitor = Monitor("r", transport=transport, hw_interval_s=0, spool_dir=str(tmp_path))
    for i in range(400):
        loss = 1.6 + 2.4 * math.exp(-i / 20) + rng.gauss(0, 0.02) + (0.3 if i == 2 else 0.0)
        # an evaluation every 25 steps makes that step slow: the guard sends it raw, loss too
        slow = i % 25 == 0 and i > 0
        monitor.log_step(i, loss=loss, tokens=1000, step_time_s=1.0 if slow else 0.1)
    monitor.shutdown()
    records = transport.records()
    windows = [r for r in records if r.kind == "step_window"]
    raw_before = [r.step for r in records if r.kind == "step" and r.step <= windows[0].step]
    assert len(raw_before) >= 3  # the baseline the first window meets: its own later steps
    det = RunDetector("r")
    reports = [a for r in records for a in det.process(r)[1]]
    assert not [a for a in reports if a.state == "firing" and "loss" in a.rule]


def _window(rank: int, last: int, wait: dict[str, float], step_s: float = 0.6):
    n = 100
    metrics = {
        "loss": {"count": n, "mean": 2.0, "std": 0.01, "min": 1.98, "max": 2.02},
        "step_time_s": {"count": n, "mean": step_s, "std": 0.01, "min": 0.1, "max": 0.7},
        "data_time_s": {"count": n, "std": 0.01, "min": 0.0, **wait},
    }
    data = {"step_first": last - n + 1, "step_last": last, "count": n, "metrics": metrics}
    return make_record(
        "step_window", data, run_id="r", rank=rank, step=last, time_ns=(last + 1) * 10**8
    )


def test_a_rank_whose_windows_wait_for_data_warns_and_one_slow_batch_does_not():
    """The producer's windows at its defaults: a rank whose steps wait for data most of a
    window (an input pipeline slowed down) warns; a window whose only long wait is one batch
    (a loader's start) and a single slow step sent raw stay quiet."""
    det = RunDetector("r")
    reports = []
    reports += det.process(_window(1, 99, {"mean": 0.03, "max": 2.9}))[1]  # start: one batch
    slow = make_record(
        "step", {"loss": 2.0, "step_time_s": 1.0, "data_time_s": 0.9}, run_id="r", rank=1, step=120
    )
    reports += det.process(slow)[1]
    assert not [a for a in reports if a.state == "firing"]
    reports += det.process(_window(1, 199, {"mean": 0.45, "max": 0.52}))[1]
    opened = [a for a in reports if a.state == "firing"]
    assert [(a.rule, a.severity) for a in opened] == [("threshold:data_wait_share", "warning")]
    assert opened[0].evidence["members"][0]["rank"] == 1


def test_steps_sent_raw_that_keep_waiting_for_data_warn_at_the_third():
    """A slowed input pipeline whose steps reach the worker as raw samples (spikes of step time
    are sent raw at the defaults): two slow steps in a row stay notes, the third warns; a fast
    step in between starts the count again."""

    def step(n: int, wait: float):
        fields = {"loss": 2.0, "step_time_s": 1.0, "data_time_s": wait}
        return make_record("step", fields, run_id="r", rank=1, step=n)

    det = RunDetector("r")
    firing = []
    for n, wait in enumerate([0.9, 0.9, 0.05, 0.9, 0.9], start=100):
        firing += [a for a in det.process(step(n, wait))[1] if a.state == "firing"]
    assert firing == []
    firing += [a for a in det.process(step(105, 0.9))[1] if a.state == "firing"]
    assert [(a.rule, a.severity) for a in firing] == [("threshold:data_wait_share", "warning")]
