import math

import numpy as np
import pytest

from steplens.stream_jobs.engine.core import Column
from steplens.stream_jobs.engine.signals import lr_schedule
from steplens.stream_jobs.engine.signals.lr_schedule import (
    LrConfig,
    LrState,
    check_schedule,
    expected_lr,
)


def update(st, cfg, lr, step, rank=-1, first_step=None):
    """The lr logged at ``step`` (a window's mean from ``first_step``)."""
    col = Column(
        np.array([lr]),
        np.array([step]),
        np.array([0]),
        rank,
        firsts=None if first_step is None else np.array([first_step]),
    )
    got = lr_schedule.update(st, cfg, "lr", col)
    return st, [] if got is None else got.views()


COSINE = {"kind": "cosine", "peak_lr": 1e-3, "min_lr": 1e-5, "warmup_steps": 10, "total_steps": 100}


def test_expected_lr_shapes():
    assert expected_lr(COSINE, 0) == 1e-4
    assert math.isclose(expected_lr(COSINE, 10), 1e-3)
    assert math.isclose(expected_lr(COSINE, 100), 1e-5)
    step = {"kind": "step", "peak_lr": 1.0, "milestones": [30, 60], "gamma": 0.1}
    assert [expected_lr(step, s) for s in (29, 30, 60)] == [1.0, 0.1, 0.1**2]
    # warmup-stable-decay: the peak until the last decay_steps, then the decay to min_lr
    wsd = {"kind": "wsd", "peak_lr": 1.0, "warmup_steps": 10, "total_steps": 100}
    wsd |= {"decay_steps": 20, "decay_type": "linear", "min_lr": 0.1}
    assert [expected_lr(wsd, s) for s in (9, 50, 80, 90, 100, 120)] == pytest.approx(
        [1.0, 1.0, 1.0, 0.55, 0.1, 0.1]
    )
    assert expected_lr({**wsd, "decay_type": "1-sqrt"}, 85) == pytest.approx(0.1 + 0.9 * 0.5)
    assert expected_lr({**wsd, "decay_type": None}, 90) == pytest.approx(0.55)  # cosine


def test_missed_milestone_alerts_with_the_step_where_it_started():
    sched = {"kind": "step", "peak_lr": 0.1, "milestones": [50], "gamma": 0.1}
    st = LrState(schedule=sched)
    breaches = []
    for s in range(80):
        st, sigs = update(st, LrConfig(), 0.1, s)  # never decays
        breaches += [x for x in sigs if x.severity]
    # the lr logged at step 50 may still be step 49's (scheduler stepped after logging)
    assert breaches[0].step == 51 and breaches[-1].detail == {"since_step": 51}


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


STEEP = {"kind": "cosine", "peak_lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 10, "total_steps": 40}


def breaches_of(st: LrState, series: list[tuple[int, float]], first_of=None) -> list[int]:
    out = []
    for s, lr in series:
        first = first_of(s) if first_of else None
        st, sigs = update(st, LrConfig(), lr, s, 0, first)
        out += [x.step for x in sigs if x.severity]
    return out


def test_lr_read_after_scheduler_step_is_quiet_in_a_steep_decay():
    # get_last_lr() after scheduler.step() is the next step's lr: a one-step offset, which
    # at the bottom of a short cosine is far more than 10 % of the lr
    series = [(s, expected_lr(STEEP, s + 1)) for s in range(40)]
    assert breaches_of(LrState(schedule=STEEP), series) == []
    lagging = [(s, expected_lr(STEEP, max(0, s - 1))) for s in range(40)]
    assert breaches_of(LrState(schedule=STEEP), lagging) == []


def test_window_mean_of_a_steep_decay_is_quiet_and_a_blow_up_in_it_is_not():
    def mean(a: int, b: int, factor: float = 1.0) -> float:
        return sum(expected_lr(STEEP, s) * factor for s in range(a, b + 1)) / (b - a + 1)

    windows = [(b, mean(b - 7, b)) for b in range(7, 40, 8)]
    assert breaches_of(LrState(schedule=STEEP), windows, lambda b: b - 7) == []
    blown = [(b, mean(b - 7, b, 10.0 if b == 23 else 1.0)) for b in range(7, 40, 8)]
    assert breaches_of(LrState(schedule=STEEP), blown, lambda b: b - 7) == [23]


def test_back_on_schedule_after_a_blow_up_is_quiet_again():
    series = [(s, expected_lr(STEEP, s + 1) * (10.0 if 20 <= s < 25 else 1.0)) for s in range(40)]
    assert breaches_of(LrState(schedule=STEEP), series) == [20, 21, 22, 23, 24]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({**COSINE, "warmup_steps": "ten"}, "lr_schedule.warmup_steps"),
        ({**COSINE, "total_steps": -5}, "lr_schedule.total_steps"),
        ({**COSINE, "total_steps": 10.5}, "lr_schedule.total_steps"),
        ({**COSINE, "peak_lr": "3e-4"}, "lr_schedule.peak_lr"),
        ({**COSINE, "min_lr": math.inf}, "lr_schedule.min_lr"),
        ({**COSINE, "kind": "exponential"}, "lr_schedule.kind"),
        ({**COSINE, "kind": "wsd", "decay_type": "exp"}, "lr_schedule.decay_type"),
        ({**COSINE, "kind": "wsd", "decay_steps": -1}, "lr_schedule.decay_steps"),
        ({"kind": "step", "peak_lr": 1.0, "milestones": [10, "20"]}, "lr_schedule.milestones"),
        ({"kind": "step", "peak_lr": 1.0, "milestones": 10}, "lr_schedule.milestones"),
        ([1e-3], "lr_schedule"),
    ],
)
def test_a_schedule_that_cannot_be_read_is_refused_with_its_field(bad, field):
    with pytest.raises(ValueError, match=rf"^{field}: must"):
        check_schedule(bad)


def test_a_readable_schedule_is_kept_with_whole_counts():
    got = check_schedule({**COSINE, "warmup_steps": 10.0})
    assert got == COSINE and type(got["warmup_steps"]) is int
    assert check_schedule({"peak_lr": 1e-3})["kind"] == "constant"


def test_a_refused_schedule_leaves_the_run_on_the_one_it_had():
    from steplens.schema import make_record
    from steplens.stream_jobs.engine.core import flatten
    from steplens.stream_jobs.engine.detector import RunDetector

    det = RunDetector("r")
    det.process(make_record("run_meta", {"world_size": 1, "lr_schedule": COSINE}, run_id="r"))
    bad = {"world_size": 1, "lr_schedule": {**COSINE, "warmup_steps": "ten"}}
    with pytest.raises(ValueError, match="warmup_steps"):
        det.process(make_record("run_meta", bad, run_id="r"))
    assert det.schedule == COSINE
    step = make_record("step", {"loss": 2.0, "lr": 10.0}, run_id="r", rank=0, step=50)
    sigs, _ = det.process(step)  # scored against the schedule it had: a deviation
    assert [s.severity for s in flatten(sigs) if s.name == "lr_schedule"] == ["warning"]
