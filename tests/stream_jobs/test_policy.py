"""The alert policy over random series: the rule written out, any batching, monotone in rarity
and magnitude, persistence counted across batches, notes and the cold anchors."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steplens.stream_jobs.engine.policy import (
    CRIT,
    INFO,
    MEASURES,
    NONE,
    WARN,
    JudgeState,
    Policy,
    judge,
    magnitude,
)

policies = st.builds(
    Policy,
    rarity=st.sampled_from([None, 0.99, 0.9999]),
    measure=st.sampled_from(["ratio", "rise", "deviation", "value"]),
    warning=st.sampled_from([0.0, 0.05, 3.0]),
    critical=st.sampled_from([1.0, 10.0, math.inf]),
    persist=st.integers(1, 4),
    at_once=st.sampled_from([math.inf, 0.1, 5.0]),
    held=st.sampled_from([None, 0.02, 1.0]),
    critical_persist=st.sampled_from([0, 5]),
    alerts=st.booleans(),
    note=st.sampled_from([None, 0.02, 2.0]),
    cold_warning=st.sampled_from([math.inf, 0.15, 3.0]),
    cold_critical=st.sampled_from([math.inf, 0.5, 10.0]),
    band=st.sampled_from([None, 0.5]),
)
values = st.floats(-1e3, 1e3, allow_nan=False)
rows = st.lists(
    st.tuples(
        values,
        st.one_of(values, st.just(math.nan)),
        st.floats(0, 1),
        st.booleans(),
        st.one_of(st.floats(0, 1), st.just(math.nan)),
    ),
    max_size=60,
)


def reference(policy: Policy, series: list[tuple[float, float, float, bool, float]]) -> list[int]:
    out, run = [], 0
    note = math.inf if policy.note is None else policy.note
    band = -math.inf if policy.band is None else policy.band
    for v, e, a, cold, own in series:
        m = magnitude(MEASURES[policy.measure], v, e)
        held = policy.warning if policy.held is None else policy.held
        bar = held if run > 0 else policy.warning
        if m >= policy.critical and policy.critical < math.inf:
            run += 1
            sev = CRIT
        elif cold and policy.rarity is not None:
            warm = m >= policy.cold_warning and not own < band
            sev = CRIT if m >= policy.cold_critical else WARN if warm else NONE
        elif not ((policy.rarity is None or a >= policy.rarity) and m >= bar and not own < band):
            run = 0
            sev = INFO if m >= note and a >= policy.note_rarity else NONE
        else:
            run += 1
            crit = m >= policy.critical or (
                policy.critical_persist and run >= policy.critical_persist
            )
            noted = m >= note and a >= policy.note_rarity
            warn = run >= policy.persist or m >= policy.at_once
            sev = CRIT if crit else WARN if warn else INFO if noted else NONE
        out.append(min(sev, INFO) if sev and not policy.alerts else sev)
    return out


def columns(part: list[tuple[float, float, float, bool, float]]) -> list[np.ndarray]:
    return [np.array([r[k] for r in part], dtype=float) for k in range(3)] + [
        np.array([r[3] for r in part], dtype=np.bool_),
        np.array([r[4] for r in part], dtype=float),
    ]


@settings(max_examples=300, deadline=None)
@given(policies, rows, st.data())
def test_judge_equals_the_rule_for_any_batching(policy, series, data):
    want = reference(policy, series)
    state = JudgeState()
    cuts = sorted({0, len(series), *data.draw(st.lists(st.integers(0, len(series)), max_size=3))})
    got: list[int] = []
    for lo, hi in itertools.pairwise(cuts):
        v, e, a, cold, own = columns(series[lo:hi])
        got += judge(policy, state, v, e, a, cold=cold, own=own).tolist()
    assert got == want


@settings(max_examples=200, deadline=None)
@given(policies, values, values, st.floats(0, 1), st.floats(0, 1))
def test_more_rare_is_never_less_severe(policy, v, e, a, b):
    lo, hi = sorted((a, b))
    one = judge(policy, JudgeState(), np.array([v]), np.array([e]), np.array([lo]))
    two = judge(policy, JudgeState(), np.array([v]), np.array([e]), np.array([hi]))
    assert two[0] >= one[0]


def test_a_gradient_spike_warns_at_three_times_and_is_critical_at_ten():
    grad = Policy(rarity=0.9999, measure="ratio", warning=3.0, critical=10.0, note=2.0)
    v = np.array([1.4, 2.5, 5.0, 12.0, 12.0])
    rare = np.array([0.99999, 0.99999, 0.99999, 0.99999, 0.5])
    sev = judge(grad, JudgeState(), v, np.ones(5), rare)
    # 1.4x: a signal; 2.5x: a note; 12x: critical, even where such values were common
    assert sev.tolist() == [NONE, INFO, WARN, CRIT, CRIT]


def test_persistence_makes_a_regime_change_warn_on_its_third_value():
    arima = Policy(rarity=0.999, measure="deviation", warning=0.1, persist=3)
    v = np.array([1.2, 1.2, 1.2, 1.2, 1.0])
    sev = judge(arima, JudgeState(), v, np.ones(5), np.full(5, 0.9995))
    assert sev.tolist() == [NONE, NONE, WARN, WARN, NONE]


def test_before_the_series_knows_its_noise_only_the_cold_anchors_alert():
    loss = Policy(rarity=0.999, measure="rise", warning=0.05, cold_warning=0.15, cold_critical=0.5)
    v = np.array([1.1, 1.2, 1.6, 1.1])
    cold = np.array([True, True, True, False])
    sev = judge(loss, JudgeState(), v, np.ones(4), np.array([1.0, 1.0, 1.0, 0.9999]), cold=cold)
    assert sev.tolist() == [NONE, WARN, CRIT, WARN]


def test_a_hard_batch_is_a_note_a_spike_that_stays_or_is_large_warns():
    """The loss's policy: 8 % up for one value, back at the next, is a note (a hard batch);
    8 % up and still 2 % up at the next warns there; 10 % up warns at once."""
    loss = Policy(
        rarity=0.999, measure="rise", warning=0.08, persist=2, at_once=0.1, held=0.02, note=0.02
    )
    v = np.array([1.08, 1.0, 1.08, 1.03, 1.0, 1.12, 1.0])
    sev = judge(loss, JudgeState(), v, np.ones(7), np.where(v > 1.01, 0.9995, 0.5))
    assert sev.tolist() == [INFO, NONE, INFO, WARN, NONE, WARN, NONE]


def test_a_rare_rise_inside_the_detectors_band_does_not_warn():
    """On a noisy series a rare value 12 % up may still lie inside the detector's band (its
    own score under 0.5): with ``band`` it warns only outside it, cold or warm."""
    loss = Policy(
        rarity=0.999, measure="rise", warning=0.08, at_once=0.1, cold_warning=0.15, band=0.5
    )
    v = np.array([1.12, 1.12, 1.2, 1.2])
    own = np.array([0.3, 0.7, 0.3, 0.7])
    cold = np.array([False, False, True, True])
    sev = judge(loss, JudgeState(), v, np.ones(4), np.full(4, 0.9995), cold=cold, own=own)
    assert sev.tolist() == [NONE, WARN, NONE, WARN]


def test_a_rare_wobble_inside_the_band_scores_below_a_jump_outside_it():
    """Where a policy has a band, a value inside it scores its rarity times the detector's own
    score (under the band's 0.5), one outside it 0.5 plus half its rarity, a cold one (no
    calibration yet) its own score: a wobble inside the band scores below a jump past its
    edge even when the series found the wobble rarer; severities are unchanged."""
    from steplens.stream_jobs.engine.calibration import CalibrationConfig
    from steplens.stream_jobs.engine.core import Signals
    from steplens.stream_jobs.engine.policy import judge_signals

    loss = Policy(rarity=0.999, measure="rise", warning=0.08, at_once=0.1, band=0.5)
    cal = CalibrationConfig(warmup=16)
    rng = np.random.default_rng(3)
    own = np.r_[rng.uniform(0.0, 0.05, 400), 0.06, 0.7]  # a wobble, then a jump
    values = np.r_[np.ones(400), 1.02, 1.3]
    sigs = Signals.of("spike", "loss", np.arange(402), None, values, own, expected=np.ones(402))
    plain = Signals.of("spike", "loss", np.arange(402), None, values, own, expected=np.ones(402))
    judge_signals(JudgeState(), cal, loss, sigs)
    judge_signals(JudgeState(), cal, dataclasses.replace(loss, band=None), plain)
    wobble, jump = sigs.score[-2], sigs.score[-1]
    assert plain.score[-2] > 0.99  # rarer than any value before it
    assert wobble == pytest.approx(0.06 * plain.score[-2]) and wobble < 0.1
    assert jump == pytest.approx(0.5 + 0.5 * plain.score[-1]) and jump > 0.99
    assert sigs.severity.tolist() == plain.severity.tolist()
    cold = Signals.of("spike", "loss", [0, 1], None, [1.0, 1.3], [0.1, 0.7], expected=[1.0, 1.0])
    judge_signals(JudgeState(), cal, loss, cold)
    assert cold.score.tolist() == pytest.approx([0.1, 0.7])
