"""A rank whose steps go back (a restart from a checkpoint), without Kafka: the detector's own
restart (its baselines afresh) and the re-seed from history the worker gives it."""

from __future__ import annotations

from history_helpers import STEP_NS, T0, firing, rows_of, scored, series_signals, steps

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import CODEC, RunDetector
from steplens.stream_jobs.engine.history import History, effective

CRASH, RESUME, REGRESSION = 1500, 1000, 1300
LATER = T0 + (CRASH + 60) * STEP_NS  # the job comes back a minute after its crash


def test_a_restarted_run_alerts_on_a_real_regression_but_not_on_its_restart():
    """Crashed at step 1,500, resumed from the checkpoint of step 1,000 (the loss 12 % above
    where it was): no alert at the jump back; a 30 % regression at 1,300 alerts at once."""
    det = RunDetector("r")
    _, before = scored(det, steps("r", 0, CRASH))
    assert firing(before) == []
    resumed = steps("r", RESUME, 1400, t0=LATER, regression=(REGRESSION, 1.3))
    sigs, alerts = scored(det, resumed)
    assert firing(alerts) == [("spike:loss", REGRESSION)]
    spikes = [s for s in sigs if s.name == "spike" and s.metric == "loss"]
    assert all(s.severity is None for s in spikes if s.step < REGRESSION)


def test_steps_going_back_are_a_restart_of_that_rank_only():
    det = RunDetector("r")
    scored(det, steps("r", 0, 300, ranks=(0, 1)))
    rec = steps("r", 200, 201, ranks=(1,), t0=LATER)[0]
    assert det.resume_step(rec) == 200
    ahead = steps("r", 300, 301, ranks=(0,), t0=LATER)[0]
    assert det.resume_step(ahead) is None
    assert det.resume_step(ahead, after=305) == 300  # behind a step not yet scored
    scored(det, [rec])
    assert det.ranks.last_step == {0: 299, 1: 200}
    assert len(det.series[0]["spike"]["loss"].values) == 64  # rank 0 keeps its baselines
    assert len(det.series[1]["spike"]["loss"].values) == 1  # rank 1 learns afresh


def test_a_window_that_goes_back_resumes_at_its_first_step():
    det = RunDetector("r")
    scored(det, steps("r", 0, 500))

    def window(first: int, last: int):
        stats = {"count": 10, "mean": 2.5, "min": 2.4, "max": 2.6, "last": 2.5, "nonfinite": 0}
        data = {"step_first": first, "step_last": last, "count": 10, "metrics": {"loss": stats}}
        return make_record("step_window", data, run_id="r", step=last, time_ns=LATER)

    assert det.resume_step(window(490, 509)) is None  # the next window
    assert det.resume_step(window(300, 319)) == 300
    det.process(window(300, 319))
    assert det.ranks.last_step[0] == 319


def test_a_reseed_from_history_is_a_detector_that_never_saw_the_abandoned_steps():
    """The worker re-seeds a restarted rank from its stored history up to the step it resumes
    at: from then on its signals are those of a detector that stopped at the checkpoint and
    never saw the steps after it, and it alerts on a real regression, not on the restart."""
    first, resumed = (
        steps("r", 0, CRASH),
        steps("r", RESUME, 1400, t0=LATER, regression=(1300, 1.3)),
    )
    det = RunDetector("r")
    scored(det, first)
    # what the stores hold up to the resume step, replayed alerting off (as the worker's job)
    seed = RunDetector("r")
    rows = {k: effective(r, RESUME, 4096) for k, r in rows_of(first).items()}
    seed.replay(History(rows=rows), LATER)
    back = det.resume_step(resumed[0])
    assert back == RESUME
    det.restart(0, back, CODEC.unpack(CODEC.pack(seed.series[0])))  # as stored values, as shipped
    det.warmed(0, {"baseline": "history", "resumed_at": back})
    sigs, alerts = scored(det, resumed)

    never = RunDetector("r")  # stopped at the checkpoint
    scored(never, [r for r in first if r.step < RESUME])
    expected, expected_alerts = scored(never, resumed)
    assert series_signals(sigs) == series_signals(expected)
    assert firing(alerts) == firing(expected_alerts) == [("spike:loss", 1300)]
    marked = [s for s in sigs if s.name == "spike" and s.step < RESUME + 256]
    assert marked and all(s.detail == {"baseline": "history", "resumed_at": RESUME} for s in marked)
    assert all(s.detail is None for s in sigs if s.name == "spike" and s.step >= RESUME + 256)
