"""The default fit (statsmodels' Hannan-Rissanen estimator on the demeaned series)."""

import numpy as np
import pytest

from steplens.stream_jobs.engine.signals import arima_fit as arima


def arma11(n, phi, theta, mu, seed):
    rng = np.random.default_rng(seed)
    e = rng.normal(0.0, 1.0, n + 1)
    y = np.zeros(n + 1)
    for t in range(1, n + 1):
        y[t] = phi * y[t - 1] + e[t] + theta * e[t - 1]
    return mu + y[1:]


def test_hannan_rissanen_recovers_arma_coefficients_and_mean():
    p = arima.fit(arma11(2000, 0.6, 0.3, 5.0, 1), (1, 0, 1), "hannan_rissanen")
    assert p is not None
    assert abs(p.ar[0] - 0.6) < 0.1 and abs(p.ma[0] - 0.3) < 0.1
    assert abs(p.const - 5.0) < 0.3 and abs(p.sigma - 1.0) < 0.1


@pytest.mark.parametrize("seed", range(5))
def test_random_walks_with_drift_always_get_a_model(seed):
    # d = 1 on a random walk: the differences are white noise around the drift
    rng = np.random.default_rng(seed)
    walk = 3.0 + np.cumsum(rng.normal(0.001, 0.02, 256))
    p = arima.fit(walk, (1, 1, 1), "hannan_rissanen")
    assert p is not None
    assert abs(p.const - 0.001) < 0.01
    assert 0.015 < p.sigma < 0.025
    assert all(abs(c) <= 0.98 for c in (*p.ar, *p.ma))


def test_constant_and_too_short_series():
    flat = arima.fit(np.full(128, 2.5), (1, 1, 1), "hannan_rissanen")
    assert flat is not None and flat.sigma <= 1e-9 and flat.const == 0.0
    assert arima.fit(np.arange(5.0), (1, 1, 1), "hannan_rissanen") is None
    assert arima.fit(np.array([1.0, np.nan] * 40), (1, 1, 1), "hannan_rissanen") is None


def test_other_methods_still_go_through_statsmodels_arima():
    x = arma11(600, 0.7, 0.0, 0.0, 2)
    hr = arima.fit(x, (1, 0, 0), "hannan_rissanen")
    ss = arima.fit(x, (1, 0, 0), "statespace")
    assert hr is not None and ss is not None
    assert abs(hr.ar[0] - ss.ar[0]) < 0.05


@pytest.mark.parametrize("order", [(1, 1), (2, 1), (1, 2), (0, 1), (2, 0), (1, 0), (0, 0)])
@pytest.mark.parametrize("n", [13, 40, 64, 255, 1023])
def test_the_fit_is_statsmodels_hannan_rissanen(order, n):
    """The worker's fit against statsmodels' own function on drifting, noisy, near-zero and
    ARMA series: the same coefficients and noise variance, or no model where it raises."""
    from statsmodels.tsa.arima.estimators.hannan_rissanen import hannan_rissanen

    p, q = order
    rng = np.random.default_rng(n * 10 + p * 3 + q)
    shapes = [
        arma11(n, 0.6, 0.3, 5.0, n),
        np.cumsum(rng.normal(0.01, 0.2, n)),
        rng.normal(0.0, 1e-6, n),
        np.exp(-np.arange(n) / 50.0) + rng.normal(0, 0.01, n),
    ]
    for x in shapes:
        got = arima.fit(x, (p, 0, q), "hannan_rissanen")
        if n < 2 * (p + q) + 8:  # too short for any fit
            assert got is None
            continue
        c = x - x.mean()
        try:
            ref, _ = hannan_rissanen(c, ar_order=p, ma_order=q, demean=False, unbiased=False)
        except ValueError:
            assert got is None
            continue
        want = arima._params(list(ref.ar_params), list(ref.ma_params), x.mean(), ref.sigma2, x)
        assert got is not None and want is not None
        np.testing.assert_allclose(got.ar, want.ar, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got.ma, want.ma, rtol=1e-9, atol=1e-12)
        assert got.sigma == pytest.approx(want.sigma, rel=1e-9)
        assert got.const == want.const
