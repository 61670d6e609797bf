"""The loss back on its pre-incident trend: built series with a known answer."""

from __future__ import annotations

import numpy as np

from steplens.sinks.recovery import RecoveryConfig, recovery, trend


def _descending(n: int, noise: float = 0.01, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(n, dtype="float64")
    return steps, 4.0 - 0.002 * steps + rng.normal(0.0, noise, n)


def test_trend_ignores_a_spike_in_its_window():
    steps, loss = _descending(60)
    loss[30] += 5.0
    slope, intercept, spread = trend(steps, loss)
    assert abs(slope + 0.002) < 5e-4 and abs(intercept - 4.0) < 0.02
    assert 0.005 < spread < 0.02  # the noise's standard deviation, not the spike's


def test_steps_until_back_on_trend():
    steps, loss = _descending(300)
    loss[200:230] += np.linspace(2.0, 0.5, 30)  # a spike decaying over 30 steps
    got = recovery(steps, loss, onset=200)
    assert got.reason == "recovered"
    assert got.steps == 30 and got.back_step == 230
    assert got.text() == "back on trend after 30 steps (step 230)"
    assert abs(got.level - (4.0 - 0.002 * 200)) < 0.02


def test_not_back_by_the_end():
    steps, loss = _descending(300)
    loss[200:] += 0.5  # the loss stays above its old trend
    got = recovery(steps, loss, onset=200)
    assert got.steps is None and got.text() == "not recovered by the end"


def test_needs_m_consecutive_steps_and_a_finite_loss():
    steps, loss = _descending(300)
    loss[200:260] += 1.0
    loss[210:214] -= 1.0  # four steps back, then up again: not yet
    loss[262] = np.nan  # a non-finite step breaks the run
    got = recovery(steps, loss, onset=200, cfg=RecoveryConfig(m=5))
    assert got.back_step == 263


def test_never_left_is_zero_steps_and_below_the_trend_is_fine():
    steps, loss = _descending(300)
    loss[200:] -= 0.3
    assert recovery(steps, loss, onset=200).steps == 0


def test_the_trend_is_held_flat_past_the_window():
    # the slope of steps 50..99 (-0.01 a step) extrapolated to step 1500 would ask for a loss
    # of -10; held flat from step 150 on, the line asks for 3.5
    steps = np.arange(2000, dtype="float64")
    loss = np.where(steps < 100, 5.0 - 0.01 * steps, 3.5)
    loss[100:1500] = 6.0
    got = recovery(steps, loss, onset=100, cfg=RecoveryConfig(window=50))
    assert got.back_step == 1500


def test_too_few_steps_before_the_onset():
    steps, loss = _descending(300)
    got = recovery(steps, loss, onset=5)
    assert got.steps is None and got.reason == "too few steps before the onset"


def test_sparse_unordered_steps():
    steps, loss = _descending(300, noise=0.0)
    keep = np.arange(0, 300, 10)  # every tenth step logged, given in reverse
    s, v = steps[keep][::-1], loss[keep][::-1].copy()
    v[(s >= 200) & (s < 240)] += 2.0
    got = recovery(s, v, onset=200)
    assert got.steps == 40
