"""The drift detectors' Theil-Sen line against scipy's, on the series they fit: noisy and
integer-valued (ties) hardware samples, leaks that start mid-window, outliers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import theilslopes

from steplens.stream_jobs.engine.signals.headroom import theil_sen


def _series(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    t = np.cumsum(rng.uniform(8.0, 12.0, n))
    if kind == "noise":
        return t, 60 + rng.normal(0, 0.7, n)
    if kind == "integer":  # temperatures: many equal values
        return t, np.round(70 + 0.01 * t + rng.normal(0, 0.6, n))
    if kind == "leak":  # flat, then a rise from the middle
        return t, 40 + np.maximum(0.0, t - t[n // 2]) * 0.05 + rng.normal(0, 0.2, n)
    if kind == "outliers":
        y = 50 + 0.02 * t + rng.normal(0, 0.3, n)
        y[rng.choice(n, max(1, n // 10), replace=False)] += rng.choice([-30.0, 30.0])
        return t, y
    # equal times and values (a repeated sample): ties in both
    t = np.repeat(np.arange(n // 2, dtype=float) * 10.0, 2)
    return t, np.round(rng.normal(50, 0.5, t.size))


@pytest.mark.parametrize("kind", ["noise", "integer", "leak", "outliers", "repeats"])
@pytest.mark.parametrize("n", [2, 3, 20, 41, 120])
@pytest.mark.parametrize("confidence", [0.95, 0.999])
def test_the_line_is_scipys(kind, n, confidence):
    rng = np.random.default_rng(n * 7 + len(kind))
    for _ in range(5):
        t, y = _series(kind, n, rng)
        if np.ptp(t) == 0:
            continue
        want = theilslopes(y, t, alpha=confidence)
        got = theil_sen(t, y, confidence)
        for a, b in zip(got, want, strict=True):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12)


def test_a_rise_has_an_interval_above_zero_and_noise_one_around_it():
    rng = np.random.default_rng(3)
    t = np.arange(60) * 10.0
    rising = theil_sen(t, 50 + 0.01 * t + rng.normal(0, 0.1, 60), 0.95)
    assert 0 < rising.low < rising.slope < rising.high
    assert rising.slope == pytest.approx(0.01, rel=0.2)
    flat = theil_sen(t, 50 + rng.normal(0, 0.1, 60), 0.95)
    assert flat.low < 0 < flat.high
