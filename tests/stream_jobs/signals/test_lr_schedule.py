import math

from steplens.stream_jobs.signals.lr_schedule import LrConfig, LrState, expected_lr, update

COSINE = {"kind": "cosine", "peak_lr": 1e-3, "min_lr": 1e-5, "warmup_steps": 10, "total_steps": 100}


def test_expected_lr_shapes():
    assert expected_lr(COSINE, 0) == 1e-4
    assert math.isclose(expected_lr(COSINE, 10), 1e-3)
    assert math.isclose(expected_lr(COSINE, 100), 1e-5)
    step = {"kind": "step", "peak_lr": 1.0, "milestones": [30, 60], "gamma": 0.1}
    assert [expected_lr(step, s) for s in (29, 30, 60)] == [1.0, 0.1, 0.1**2]


def test_missed_milestone_alerts_with_the_step_where_it_started():
    sched = {"kind": "step", "peak_lr": 0.1, "milestones": [50], "gamma": 0.1}
    st = LrState(schedule=sched)
    breaches = []
    for s in range(80):
        st, sigs = update(st, LrConfig(), 0.1, s)  # never decays
        breaches += [x for x in sigs if x.severity]
    assert breaches[0].step == 50 and breaches[-1].detail == {"since_step": 50}


def test_following_the_schedule_is_quiet():
    st = LrState(schedule=COSINE)
    for s in range(100):
        st, sigs = update(st, LrConfig(), expected_lr(COSINE, s), s)
        assert sigs[0].severity is None


def test_undeclared_schedule_catches_a_blow_up_only():
    st = LrState()
    out = []
    for s in range(60):
        lr = 1e-3 * min(1.0, (s + 1) / 20) * (100 if s == 40 else 1)
        st, sigs = update(st, LrConfig(), lr, s)
        out += [x.step for x in sigs if x.severity]
    assert out == [40]
