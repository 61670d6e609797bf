"""The 7-day dynamic baseline's fit: order selection, daily seasonality, band coverage and the
in-run fallback (pure: no stores)."""

from __future__ import annotations

import numpy as np
import pytest

from steplens.stream_jobs.engine.signals import seasonal_baseline as sb

T0 = 28_333_333 * sb.MINUTE_NS  # a minute's start (the grid's phase is the epoch's)
DAY = sb.DAY_MIN


def _times(n: int) -> np.ndarray:
    return T0 + np.arange(n, dtype=np.int64) * sb.MINUTE_NS


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float = 1.0) -> np.ndarray:
    e = rng.normal(scale=sd, size=n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


def _daily(t: np.ndarray, amp: float) -> np.ndarray:
    return amp * np.sin(2 * np.pi * ((t // sb.MINUTE_NS) % DAY) / DAY)


def test_order_selection_finds_the_generating_model() -> None:
    rng = np.random.default_rng(3)
    ar2 = np.empty(4000)
    e = rng.normal(size=4000)
    ar2[:2] = e[:2]
    for i in range(2, 4000):
        ar2[i] = 0.5 * ar2[i - 1] + 0.3 * ar2[i - 2] + e[i]
    choice = sb.select_order(ar2, sb.BaselineConfig().candidates)
    assert choice is not None and choice.order == (2, 0, 0)
    assert choice.params.ar_params == pytest.approx([0.5, 0.3], abs=0.06)
    # an integrated MA(1): the differenced candidates win
    walk = np.cumsum(e + 0.6 * np.r_[0.0, e[:-1]])
    choice = sb.select_order(walk, sb.BaselineConfig().candidates)
    assert choice is not None and choice.order[1] == 1
    assert set(choice.bic) == set(sb.BaselineConfig().candidates)


def test_a_daily_cycle_gets_the_seasonal_term_and_noise_does_not() -> None:
    rng = np.random.default_rng(5)
    n = 7 * DAY
    t = _times(n)
    cycle = 70 + _daily(t, 10.0) + _ar1(rng, n, 0.6)
    band = sb.fit_band(t, cycle, sb.BaselineConfig())
    assert band is not None and band.seasonal and band.baseline == sb.SEVEN_DAYS
    assert sb.daily_share(int(t[0] // sb.MINUTE_NS), cycle, 3) > 0.8
    for noise in (70 + rng.normal(size=n), 70 + np.cumsum(rng.normal(size=n)) * 0.2):
        band = sb.fit_band(t, noise, sb.BaselineConfig())
        assert band is not None and not band.seasonal and band.baseline == sb.SEVEN_DAYS
    # the band follows the cycle: its expected value a quarter day on is the cycle's
    band = sb.fit_band(t, cycle, sb.BaselineConfig(horizon=DAY // 4 + 1))
    assert band is not None
    truth = 70 + _daily(np.array([band.start_ns + DAY // 4 * sb.MINUTE_NS]), 10.0)[0]
    assert band.expected[-1] == pytest.approx(truth, abs=1.0)


def test_the_band_covers_about_the_nominal_share_of_healthy_minutes() -> None:
    cfg = sb.BaselineConfig(coverage=0.99, horizon=60)
    inside = total = 0
    for seed in range(12):
        rng = np.random.default_rng(100 + seed)
        n = 7 * DAY + cfg.horizon
        t = _times(n) + seed * 97 * sb.MINUTE_NS
        y = 60 + _daily(t, 8.0) + _ar1(rng, n, 0.8, 1.5)
        cut = 7 * DAY
        band = sb.fit_band(t[:cut], y[:cut], cfg)
        assert band is not None and band.start_ns == t[cut]
        held = y[cut:]
        inside += int(np.sum((held >= band.lower) & (held <= band.upper)))
        total += len(held)
    assert inside / total == pytest.approx(0.99, abs=0.02)


def test_less_than_a_day_falls_back_to_the_in_run_model() -> None:
    rng = np.random.default_rng(9)
    n = 600
    t = _times(n)
    y = 50 + _ar1(rng, n, 0.5)
    band = sb.fit_band(t, y, sb.BaselineConfig())
    assert band is not None and band.baseline == sb.IN_RUN and band.order == (1, 1, 1)
    assert band.detail()["baseline"] == "in-run" and not band.seasonal
    assert band.at(int(t[-1])) is None  # the band starts after the newest minute
    e, lo, up = band.at(int(t[-1]) + sb.MINUTE_NS)  # type: ignore[misc]
    assert lo < 50 < up and lo < e < up
    assert sb.fit_band(t[:10], y[:10], sb.BaselineConfig()) is None  # too few minutes


def test_minute_grid_means_and_gaps() -> None:
    t = np.array([0, 10, 70, 200], dtype=np.int64) * 10**9 + T0
    start, grid = sb.minute_grid(t, np.array([1.0, 3.0, 5.0, np.nan]), 100)
    assert start == (T0 // sb.MINUTE_NS) * sb.MINUTE_NS
    assert grid[:2].tolist() == [2.0, 5.0] and len(grid) == 2
