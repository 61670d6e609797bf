"""Training dynamics: the clipping rate, vanishing gradients, lr events and the loss volatility
of a window's own spread; the compiled loops held equal to their per-value references."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import clipping_ref, vanishing_ref

from steplens.stream_jobs.engine.core import Column
from steplens.stream_jobs.engine.signals import clipping, lr_events, vanishing, volatility


def col(xs, lo: int, hi: int, rank: int = 0, **kw) -> Column:
    steps = np.arange(lo, hi, dtype=np.int64)
    return Column(np.array(xs[lo:hi], dtype=float), steps, steps - lo, rank, **kw)


def views(sigs):
    return [] if sigs is None else sigs.views()


def cuts(draw, n: int) -> list[int]:
    return sorted({0, n, *draw(st.lists(st.integers(0, n), max_size=5))})


# ------------------------------------------------------------------------------ clipping
def clip_rates(flags, cfg=None, schedule=None):
    st_ = clipping.ClipState(schedule=schedule)
    return views(
        clipping.update(st_, cfg or clipping.ClipConfig(), "clipped", col(flags, 0, len(flags)))
    )


def test_clipping_on_most_steps_warns_and_now_and_then_does_not():
    rng = random.Random(0)
    sometimes = [float(rng.random() < 0.2) for _ in range(400)]
    assert not [s for s in clip_rates(sometimes) if s.severity]
    storm = sometimes[:200] + [float(rng.random() < 0.9) for _ in range(200)]
    sigs = clip_rates(storm)
    warned = [s.step for s in sigs if s.severity]
    assert warned and 200 < warned[0] < 260 and all(s.severity == "warning" for s in sigs[260:])
    assert 0.8 < sigs[-1].value < 1.0 and sigs[-1].expected == 0.5
    # the first values are not judged (no score) until 50 watched steps were seen
    assert [s.severity for s in sigs[:49]] == [None] * 49 and math.isnan(sigs[0].score)


def test_clipping_during_the_declared_warmup_is_not_counted():
    sched = {"kind": "cosine", "peak_lr": 1e-3, "warmup_steps": 100, "total_steps": 1000}
    flags = [1.0] * 100 + [0.0] * 300
    sigs = clip_rates(flags, schedule=sched)
    assert sigs[0].step == 100 and not [s for s in sigs if s.severity]


def test_a_window_counts_as_its_watched_steps():
    """A window's share of ``count`` watched steps weighs as that many step records."""
    cfg = clipping.ClipConfig()
    st_ = clipping.ClipState()
    got = []
    for w, share in enumerate([0.1, 0.2, 0.9, 0.95]):
        c = Column(
            np.array([share]), np.array([w * 50 + 49]), np.zeros(1, np.int64), 0,
            firsts=np.array([w * 50]), counts=np.array([50]),
        )  # fmt: skip
        got += views(clipping.update(st_, cfg, "clipped", c))
    assert [round(s.value, 3) for s in got] == [0.1, 0.15, 0.55, 0.925]
    assert [s.severity for s in got] == [None, None, "warning", "warning"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0, 30]), st.data())
def test_clipping_equals_the_reference(seed, warm, data):
    rng = random.Random(seed)
    n = data.draw(st.integers(0, 400))
    xs = [float(rng.random() < rng.choice([0.1, 0.7])) for _ in range(n)]
    cfg = clipping.ClipConfig(window=data.draw(st.sampled_from([1, 7, 100])), min_values=5)
    sched = {"peak_lr": 1.0, "warmup_steps": warm} if warm else None
    one, many = clipping_ref.ClipState(warm=warm), clipping.ClipState(schedule=sched)
    want = [s for i, x in enumerate(xs) for s in clipping_ref.update(one, cfg, x, i)]
    got = []
    for lo, hi in itertools.pairwise(cuts(data.draw, n)):
        got += views(clipping.update(many, cfg, "clipped", col(xs, lo, hi)))
    assert repr(got) == repr(want)
    assert [(int(c), float(x)) for c, x in zip(many.counts, many.clipped, strict=True)] == list(
        one.kept
    )


# ------------------------------------------------------------------------------ vanishing
def vanish(xs, cfg=None):
    st_ = vanishing.VanishState()
    return views(
        vanishing.update(st_, cfg or vanishing.VanishConfig(), "grad_norm", col(xs, 0, len(xs)))
    )


def test_a_collapsing_gradient_norm_warns_and_a_healthy_decline_does_not():
    rng = random.Random(1)
    # a healthy run: 8 at the start, 100x lower after 10,000 steps, noisy, with spikes
    healthy = [
        8 * math.exp(-i / 2200) * math.exp(rng.gauss(0, 0.3)) * (20 if rng.random() < 0.01 else 1)
        for i in range(10_000)
    ]
    quiet = vanish(healthy)
    assert not [s for s in quiet if s.severity]
    # a healthy level is a signal once in 50 values (the board's trace), not every value
    assert 10_000 / 50 * 0.9 < len(quiet) < 10_000 / 50 * 1.5
    # gradients vanish: from 1.0 to 1e-6 within a hundred steps
    collapse = [1.0 * math.exp(rng.gauss(0, 0.2)) for _ in range(500)]
    collapse += [10 ** (-6 * min(1.0, k / 100)) for k in range(300)]
    sigs = vanish(collapse)
    warned = [s.step for s in sigs if s.severity]
    assert warned and 500 < warned[0] < 600 and sigs[-1].severity == "warning"
    assert sigs[-1].value < sigs[-1].lower < sigs[-1].expected


def test_a_zero_gradient_is_a_collapse():
    sigs = vanish([0.5] * 100 + [0.0] * 40)
    warned = [s.step for s in sigs if s.severity]
    assert warned and warned[0] <= 102


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.data())
def test_vanishing_equals_the_reference(seed, data):
    rng = random.Random(seed)
    n = data.draw(st.integers(0, 300))
    xs = [abs(rng.gauss(1, 0.3)) * rng.choice([1, 1, 1, 1e-4, 0.0, 50.0]) for _ in range(n)]
    cfg = vanishing.VanishConfig(
        warmup=data.draw(st.sampled_from([1, 5, 20])),
        horizon=50,
        quiet_every=data.draw(st.sampled_from([1, 3, 50])),
    )
    one, many = vanishing_ref.VanishState(), vanishing.VanishState()
    want = [s for i, x in enumerate(xs) for s in vanishing_ref.update(one, cfg, x, i)]
    got = []
    for lo, hi in itertools.pairwise(cuts(data.draw, n)):
        got += views(vanishing.update(many, cfg, "grad_norm", col(xs, lo, hi)))
    assert repr(got) == repr(want)
    assert repr((many.level, many.ref, many.seen, many.since)) == repr(
        (one.level, one.ref, one.seen, one.since)
    )


# ------------------------------------------------------------------------------ lr events
def events(lrs, steps=None, schedule=None, rank=0, cuts_at=()):
    st_ = lr_events.LrEventState(schedule=schedule)
    steps = list(range(len(lrs))) if steps is None else steps
    out = []
    bounds = sorted({0, len(lrs), *cuts_at})
    for lo, hi in itertools.pairwise(bounds):
        c = Column(
            np.array(lrs[lo:hi], dtype=float),
            np.array(steps[lo:hi], dtype=np.int64),
            np.arange(hi - lo, dtype=np.int64),
            rank,
        )
        out += views(lr_events.update(st_, lr_events.LrEventConfig(), "lr", c))
    return out


def test_declared_warmup_end_and_milestones_are_events_at_the_steps_the_lr_moved():
    sched = {"kind": "step", "peak_lr": 1e-3, "warmup_steps": 100, "milestones": [3000, 6000],
             "gamma": 0.1}  # fmt: skip
    steps = list(range(0, 8000, 10))

    def lr(s):  # the scheduler is stepped 12 steps late
        return (
            1e-3 * min(1.0, (s + 1) / 100)
            if s < 100
            else 1e-3 * 0.1 ** sum(s >= m + 12 for m in (3000, 6000))
        )

    lrs = [lr(s) for s in steps]
    for cut in ((), (1, 5, 400, 401), tuple(range(len(steps)))):
        got = events(lrs, steps, sched, cuts_at=cut)
        assert [(s.step, s.detail["kind"], s.detail["declared_step"]) for s in got] == [
            (100, "warmup_end", 100),
            (3020, "decay", 3000),
            (6020, "decay", 6000),
        ]
    assert (
        got[1].detail["text"]
        == "lr decayed at step 3020 (0.001 -> 0.0001); declared milestone 3000"
    )
    assert all(s.severity is None and s.score == 0.0 for s in got)


def test_cosine_decay_end_and_a_resumed_run_past_its_warmup():
    sched = {"kind": "cosine", "peak_lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 50,
             "total_steps": 1000}  # fmt: skip
    from steplens.stream_jobs.engine.signals.lr_schedule import expected_lr

    steps = list(range(0, 1200, 5))
    got = events([expected_lr(sched, s) for s in steps], steps, sched)
    assert [(s.detail["kind"], s.step) for s in got] == [("warmup_end", 50), ("decay_end", 940)]
    # resumed at step 500: already past the warmup, so no warmup event
    later = [s for s in steps if s >= 500]
    got = events([expected_lr(sched, s) for s in later], later, sched)
    assert [s.detail["kind"] for s in got] == ["decay_end"]


def test_without_a_schedule_a_step_change_is_an_event_and_a_warmup_is_not():
    lrs = [1e-3 * (i + 1) / 50 for i in range(50)] + [1e-3] * 100 + [5e-4] * 100 + [5e-5] * 50
    got = events(lrs)
    assert [(s.step, s.detail["kind"]) for s in got] == [(150, "decay"), (250, "decay")]
    assert got[0].detail["text"] == "lr decayed at step 150 (0.001 -> 0.0005)"
    assert events(lrs, rank=3) == []  # read from rank 0 only


# ------------------------------------------------------------------------------ volatility
def window(mean, std, first, last, count=None):
    n = count or last - first + 1
    return Column(
        np.array([mean]), np.array([last]), np.zeros(1, np.int64), -1,
        firsts=np.array([first]), spreads=np.array([std]), counts=np.array([n]),
    )  # fmt: skip


def test_a_window_std_is_its_relative_noise_without_its_trend():
    """A window's std over its mean is its noise; the part a linear trend between windows
    explains is taken out (a falling loss is not noisy), the first window is not judged."""
    cfg = volatility.VolatilityConfig()
    st_ = volatility.VolatilityState()
    got = []
    # a loss falling 0.01 a step: a 100-step window's std from the trend alone
    trend_std = 0.01 * math.sqrt((100**2 - 1) / 12)
    for w in range(4):
        mean = 5.0 - w  # -0.01 a step
        got += volatility.update(
            st_, cfg, "loss", window(mean, trend_std, w * 100, w * 100 + 99)
        ).views()
    assert math.isnan(got[0].score) and [round(s.value, 6) for s in got] == [0.0] * 4
    noisy = volatility.update(st_, cfg, "loss", window(1.0, 0.4, 400, 499)).views()[0]
    # the same trend, and noise: sqrt(0.4**2 - 0.083) / 1.0 = 0.28
    assert 0.1 < noisy.value < 0.3 and noisy.expected == 0.1
    # a window of few steps is one value of the step series (no std verdict)
    short = volatility.update(st_, cfg, "loss", window(1.0, 0.3, 500, 502)).views()[0]
    assert short.value == 0.0 and math.isnan(short.score)


# ------------------------------------------------------------------------------ update share
def update_alerts(schedule, lr_at, share_at, steps):
    """The incidents a run logging ``update_ratio`` (and its lr) every 10 steps opens, through
    the worker's detector: (rule, step) of each opened."""
    from steplens.schema import Record
    from steplens.stream_jobs.engine.detector import RunDetector

    det = RunDetector("r")
    if schedule is not None:
        det.process(Record("run_meta", "r", 0, 0, "h", 1, 0, 1, {"lr_schedule": schedule}))
    out = []
    for step in steps:
        cols = {"update_ratio": [share_at(step)], "lr": [lr_at(step)]}
        got = det.evaluate(det.process_columns(0, [step], [step], cols), 1, [step])
        out += [(a.rule, a.started_step) for a in got if a.state == "firing"]
    return out


COSINE = {"kind": "cosine", "peak_lr": 1e-3, "warmup_steps": 100, "total_steps": 2000}


def test_update_share_follows_the_lr_a_cosine_to_zero_is_not_paged():
    """An HF Trainer run: cosine to zero at step 2000, the update share about proportional to
    the lr (0.6 at the peak, 0.0078 at step 1970). Its end is not a collapse, declared or
    only logged; a share of 1 % at the peak lr (a broken optimizer state) still warns."""
    from steplens.stream_jobs.engine.signals.lr_schedule import expected_lr

    def lr(step):
        return expected_lr(COSINE, step)

    def share(step):
        return 0.6 * lr(step) / 1e-3

    steps = range(0, 2000, 10)
    assert share(1970) < 0.01  # the value: 0.0078 < 0.05 paged
    assert update_alerts(COSINE, lr, share, steps) == []
    assert update_alerts(None, lr, share, steps) == []  # the logged lr only

    def broken(step):
        return 0.01 if 500 <= step < 600 else share(step)

    for schedule in (COSINE, None):
        got = update_alerts(schedule, lr, broken, steps)
        assert [r for r, _ in got] == ["training:update_ratio"]
        assert 500 <= got[0][1] <= 530
