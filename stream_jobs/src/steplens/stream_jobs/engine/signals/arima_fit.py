"""ARIMA fits (statsmodels, tens to hundreds of ms; in a process pool in the worker): the
parameters ``arima.apply_fit`` takes. Everything here is picklable for process pools."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ArimaParams:
    ar: list[float]
    ma: list[float]
    const: float
    sigma: float
    # the coefficients as the recursion takes them (derived: neither compared nor stored)
    ar_a: np.ndarray = field(init=False, repr=False, compare=False)
    ma_a: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.ar_a = np.array(self.ar, dtype=float)
        self.ma_a = np.array(self.ma, dtype=float)


def fit(values: np.ndarray, order: tuple[int, int, int], method: str) -> ArimaParams | None:
    """Fit ARIMA on ``values``; ``None`` when statsmodels cannot. Picklable for process pools.

    ``hannan_rissanen`` (the default) is statsmodels' estimator on the demeaned (differenced)
    series: one pass of its two regressions, about 0.5 ms. Through ``ARIMA.fit`` the
    same method iterates feasible GLS around it for the mean (5-20x slower) and its bias
    correction often fails on random-walk-like series, leaving no model at all. Any other
    method goes through ``ARIMA.fit``.
    """
    p, d, q = order
    series = np.diff(values) if d else np.asarray(values, float)
    if len(series) < 2 * (p + q) + 8 or not np.all(np.isfinite(series)):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if method == "hannan_rissanen":
                return _fit_hannan_rissanen(series, p, q)
            return _fit_arima(series, p, q, method)
    except Exception:
        return None


def fit_many(
    series: Sequence[np.ndarray], order: tuple[int, int, int], method: str
) -> list[ArimaParams | None]:
    """``fit`` of each of ``series``: one pool job, one round trip, for many fits."""
    return [fit(values, order, method) for values in series]


def _fit_hannan_rissanen(series: np.ndarray, p: int, q: int) -> ArimaParams | None:
    """statsmodels' ``hannan_rissanen(centred, p, q, demean=False, unbiased=False)``, equal to
    it to rounding (a test holds them together), in a fifth of its time: the long
    autoregression is statsmodels' Yule-Walker, as there; the second step, one least-squares
    regression on ``p`` lags of the series and ``q`` lags of the first step's residuals, is
    done here with numpy. statsmodels' function spends four fifths of its 3 ms building
    specification and model objects, and the worker fits every series of every rank."""
    from statsmodels.regression.linear_model import yule_walker

    mu = float(series.mean())
    x = series - mu
    n = len(x)
    if not np.any(x):
        return ArimaParams([0.0] * p, [0.0] * q, mu, 1e-12)
    if p == q == 0:
        return _params([], [], mu, float(np.var(x)), series)
    start = p
    cols = []
    if q:
        k = max(int(math.log(n) ** 2), 2 * max(p, q))  # statsmodels' initial AR order
        if k >= n:
            return None
        a, _ = yule_walker(x, order=k, method="mle")
        lags = np.lib.stride_tricks.sliding_window_view(x, k + 1)[:, ::-1]
        resid = lags[:, 0] - lags[:, 1:] @ a  # resid[j]: the residual at t = k + j
        start = k + q
        cols = [resid[q - j : len(resid) - j] for j in range(1, q + 1)]
    X = np.column_stack([x[start - i : n - i] for i in range(1, p + 1)] + cols)
    y = x[start:]
    if len(y) <= X.shape[1]:
        return None
    beta, _, rank, _ = np.linalg.lstsq(X, y, rcond=None)
    err = y - X @ beta
    return _params(
        [float(v) for v in beta[:p]],
        [float(v) for v in beta[p:]],
        mu,
        float(err @ err) / (len(y) - rank),
        series,
    )


def _fit_arima(series: np.ndarray, p: int, q: int, method: str) -> ArimaParams | None:
    from statsmodels.tsa.arima.model import ARIMA

    model = ARIMA(
        series,
        order=(p, 0, q),
        trend="c",
        enforce_stationarity=False,
        enforce_invertibility=False,
    )
    # the bare parameters: building a results object would cost a third of the fit
    named = dict(
        zip(
            model.param_names,
            (float(v) for v in model.fit(method=method, return_params=True)),
            strict=True,
        )
    )
    return _params(
        [named.get(f"ar.L{i}", 0.0) for i in range(1, p + 1)],
        [named.get(f"ma.L{i}", 0.0) for i in range(1, q + 1)],
        named.get("const", 0.0),
        named.get("sigma2", float("nan")),
        series,
    )


def _params(
    ar: list[float], ma: list[float], const: float, sigma2: float, series: np.ndarray
) -> ArimaParams | None:
    if not all(math.isfinite(v) for v in (*ar, *ma, const)):
        return None
    if not math.isfinite(sigma2) or sigma2 <= 0:
        sigma2 = float(np.var(series)) or 1e-12
    # clipped into the stationary and invertible range so the recursion cannot blow up
    return ArimaParams(
        ar=[min(0.98, max(-0.98, v)) for v in ar] if len(ar) == 1 else ar,
        ma=[min(0.98, max(-0.98, v)) for v in ma],
        const=const,
        sigma=math.sqrt(sigma2),
    )


def warm_up() -> None:
    """Load statsmodels (about 2 s once per process) before the first fit needs it."""
    from statsmodels.regression.linear_model import yule_walker  # noqa: F401
