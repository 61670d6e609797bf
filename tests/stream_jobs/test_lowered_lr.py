"""An lr a remedy lowered: declared again with ``lr_scale``, it is an lr event, no deviation."""

import math

import pytest

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals.lr_schedule import check_schedule, expected_lr

SCHED = {"kind": "cosine", "peak_lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 25, "total_steps": 400}


def declared(s: int) -> float:
    if s < 25:
        return 3e-3 * (s + 1) / 25
    return 3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi * (s - 25) / 375))


def run(redeclare: bool) -> tuple[list[tuple[str, int]], list[dict]]:
    """400 steps on the schedule; the lr halved from step 201 on (a remedy acted at 200)."""
    det = RunDetector("r")
    meta = {"world_size": 1, "lr_schedule": SCHED}
    det.process(make_record("run_meta", meta, run_id="r"))
    fired, events = [], []
    for s in range(400):
        lr = declared(s) * (0.5 if s > 200 else 1.0)
        rec = make_record("step", {"loss": 2.0, "lr": lr}, run_id="r", step=s, time_ns=s * 10**8)
        sigs, alerts = det.process(rec)
        fired += [(a.rule, a.step) for a in alerts if a.state == "firing"]
        for sig in sigs:
            if sig.name == "lr_event":
                events += [v.detail for v in sig.views()]
        if s == 200 and redeclare:
            scaled = {**SCHED, "lr_scale": [[201, 0.5]]}
            det.process(make_record("run_meta", {**meta, "lr_schedule": scaled}, run_id="r"))
    return fired, events


def test_a_lowered_lr_declared_again_is_an_lr_event_and_no_deviation():
    fired, events = run(redeclare=True)
    assert not [f for f in fired if f[0].startswith("lr_schedule")]
    kinds = [e["kind"] for e in events]
    assert kinds == ["warmup_end", "lowered", "decay_end"], events
    assert "lowered at step 201" in events[1]["text"]
    assert events[2]["text"].startswith("lr decay ended at step 3")  # the lowered floor


def test_a_lowered_lr_not_declared_is_a_deviation():
    fired, events = run(redeclare=False)
    assert ("lr_schedule:lr", 201) in fired
    assert "lowered" not in [e["kind"] for e in events]


def test_lr_scale_multiplies_from_its_step_and_is_checked():
    sched = check_schedule({**SCHED, "lr_scale": [[300, 0.5], [100, 0.2]]})
    assert sched["lr_scale"] == [[100, 0.2], [300, 0.5]]
    assert expected_lr(sched, 99) == pytest.approx(declared(99))
    assert expected_lr(sched, 100) == pytest.approx(declared(100) * 0.2)
    assert expected_lr(sched, 300) == pytest.approx(declared(300) * 0.1)
    for bad in ([[10, 1.5]], [[10]], [[-1, 0.5]], "x", [[0, 0.5]] * 65):
        with pytest.raises(ValueError, match="lr_scale"):
            check_schedule({**SCHED, "lr_scale": bad})
