"""Calibrated scores: the compiled kernel against the per-value reference, and what a score means
(its exceedance rate) on light- and heavy-tailed series."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_calibration import Reference

from steplens.stream_jobs.engine.calibration import CalibrationConfig, CalibrationState, calibrate

raw_scores = st.lists(
    st.one_of(
        st.floats(0, 1e6, allow_nan=False),
        st.sampled_from([0.0, 1.0, math.inf, math.nan, -1.0]),
    ),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(raw_scores, st.sampled_from([2, 5, 64]), st.data())
def test_kernel_equals_reference_for_any_batching(xs, warmup, data):
    cfg = CalibrationConfig(warmup=warmup)
    ref = Reference(cfg)
    want = [ref.update(x) for x in xs]
    state = CalibrationState()
    cuts = sorted({0, len(xs), *data.draw(st.lists(st.integers(0, len(xs)), max_size=4))})
    got: list[float] = []
    for lo, hi in itertools.pairwise(cuts):
        got += calibrate(state, cfg, np.array(xs[lo:hi], dtype=float)).tolist()
    assert repr(got) == repr(want)  # nan == nan as text
    assert (state.u, state.m1, state.m2, state.seen) == (ref.u, ref.m1, ref.m2, ref.seen)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1e-6, 3.0, 1e5]))
def test_scores_do_not_depend_on_the_raw_scores_unit(seed, c):
    xs = np.random.default_rng(seed).exponential(1.0, 500)
    cfg = CalibrationConfig()
    a = calibrate(CalibrationState(), cfg, xs)
    b = calibrate(CalibrationState(), cfg, xs * c)
    assert np.allclose(a, b, rtol=0, atol=1e-9, equal_nan=True)


def test_a_larger_raw_score_is_never_less_anomalous():
    cfg = CalibrationConfig()
    state = CalibrationState()
    calibrate(state, cfg, np.random.default_rng(1).exponential(1.0, 3000))
    probe = np.linspace(0, 30, 200)
    scores = [calibrate(_copy(state), cfg, np.array([x]))[0] for x in probe]
    assert all(b >= a for a, b in itertools.pairwise(scores))
    assert scores[0] == 0.0 and scores[-1] > 0.9999


def test_a_short_series_claims_no_rarity_it_cannot_have_seen():
    """After n values no score passes 1 - 1 / (4 n): 0.999 needs 250 values, 0.9999 2,500."""
    cfg = CalibrationConfig()
    xs = np.random.default_rng(3).exponential(1.0, 3000)
    xs[[100, 300, 2900]] = 1e6  # far in the tail
    got = calibrate(CalibrationState(), cfg, xs)
    assert got[100] == 1 - 1 / (4 * 101) < 0.999
    assert 0.999 < got[300] < 0.9999 and got[2900] > 0.9999


def _copy(s: CalibrationState) -> CalibrationState:
    return CalibrationState(s.u, s.m1, s.m2, s.seen, s.warm.copy())


def _exceedance(xs: np.ndarray, level: float) -> float:
    scores = calibrate(CalibrationState(), CalibrationConfig(), xs)[64:]
    return float(np.mean(scores >= level))


def test_the_same_score_means_the_same_rarity_on_light_and_heavy_tails():
    """|N(0,1)| (light tail), exponential, log-normal and Pareto (heavy tails: a raw score of
    ten times the median is common): the share of values scoring 0.99 and above is close to 1 %
    on each, 0.999 and above close to 0.1 %, and 0.9999 within a few times 0.01 %, where the raw
    thresholds differ by far."""
    rng = np.random.default_rng(7)
    n = 400_000
    series = {
        "half-normal": np.abs(rng.standard_normal(n)),
        "exponential": rng.exponential(1.0, n),
        "log-normal": rng.lognormal(0.0, 1.0, n),
        "pareto 2.5": rng.pareto(2.5, n),
        "pareto 1.5": rng.pareto(1.5, n),
    }
    for name, xs in series.items():
        for level, lo, hi in ((0.99, 0.7, 1.3), (0.999, 0.5, 2.0), (0.9999, 0.1, 5.0)):
            ratio = _exceedance(xs, level) / (1 - level)
            assert lo <= ratio <= hi, (name, level, ratio)


def test_routine_saturated_scores_are_learnt_not_alerted():
    """An idle series with bursts (disk bytes: zeros, then a burst): its detector's noise scale
    is at its floor, so every burst's raw score saturates (inf). Bursting in 2 % of values is
    routine: after a few bursts they score about 0.98, far from an alert."""
    rng = np.random.default_rng(3)
    raw = np.where(rng.random(5000) < 0.02, math.inf, rng.exponential(1.0, 5000))
    scores = calibrate(CalibrationState(), CalibrationConfig(), raw)
    late = scores[2000:][raw[2000:] == math.inf]
    assert len(late) > 30
    assert late.max() < 0.99, late.max()


def test_a_first_saturated_score_is_as_rare_as_the_series_can_tell():
    """The first burst after 10,000 quiet values: rarer than 1 in 10,000; the same burst
    50 values into the series is not (it has not seen enough values to say)."""
    cfg = CalibrationConfig()
    quiet = np.random.default_rng(4).exponential(1.0, 10_000)
    late = calibrate(CalibrationState(), cfg, np.append(quiet, math.inf))[-1]
    assert late > 0.9999
    early = calibrate(CalibrationState(), cfg, np.append(quiet[:100], math.inf))[-1]
    assert 0.99 < early < 0.999
