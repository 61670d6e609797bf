"""The 7-day dynamic baseline: the normal range of a series for the next interval, from the
previous 7 days at the rollup resolution (1 minute).

Model (dynamic harmonic regression): ``y_t = s(t) + eta_t``, where ``s`` is a daily profile of
``harmonics`` Fourier pairs (sin/cos of 2 pi k t / 1440 min) and ``eta`` is ARIMA(p, d, q), its
order chosen per series by BIC among ``candidates``. A period of 1,440 minutes is far beyond
what SARIMAX's seasonal lags can take (a state vector of 1,440+ elements per Kalman step), and
coarser resolutions would blur the minute-level dynamics the band must follow; Fourier terms
need ``2 * harmonics`` regressors whatever the period.

Two stages, both with statsmodels: the profile by least squares over the whole history, then
the ARMA of the remainder (``order_window`` newest minutes: its short-term dynamics do not need
a week) by Hannan-Rissanen for every candidate. Candidates are compared on their one-step
innovation variance over the same newest points: a d = 1 model and a d = 0 model predict the
same quantity, ``y_t`` given its past, so their BICs are comparable. The band is the fitted
model's forecast (mean and standard error, statsmodels' Kalman filter over the newest minutes)
plus the profile, ``z`` standard errors wide.

Seasonality: a daily profile is used only where the history shows one: fitted on all days but
the newest, it must explain at least ``min_daily_share`` of the newest day's variation around
its own mean (a held-out check, so a random walk's spurious shape or white noise do not get
one; a level shift on the last day does not hide a real cycle). It needs two days at least.

Fallback: with less than ``min_history_s`` of history (a day) the band is today's in-run model
(``arima_fit``'s ARIMA(1, 1, 1) on the newest ``ArimaConfig.fit_window`` values), and says so
(``Band.baseline`` ``"in-run"``).

Pure and picklable (the worker's fit pool runs ``fit_band``); statsmodels is imported on use.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.signals import arima_fit

MINUTE_NS = 60 * 10**9
DAY_MIN = 1440
SEVEN_DAYS = "7d"
IN_RUN = "in-run"

Order = tuple[int, int, int]


@dataclass(frozen=True)
class BaselineConfig:
    candidates: tuple[Order, ...] = ((1, 0, 0), (2, 0, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1))
    harmonics: int = 3  # Fourier pairs of the daily profile
    min_daily_share: float = 0.2  # of the held-out day's variation the profile must explain
    min_history_s: float = 86_400.0  # less: the in-run fallback
    max_minutes: int = 7 * DAY_MIN  # the newest minutes used (7 days)
    order_window: int = 2 * DAY_MIN  # newest minutes the ARMA orders are fitted on
    filter_window: int = 240  # newest minutes the forecast's Kalman filter runs over
    horizon: int = 120  # minutes forecast (two hourly refits)
    coverage: float = 0.999  # two-sided share of healthy minutes inside the band
    rel_floor: float = 0.01  # half-width at least this share of |expected|
    in_run_order: Order = (1, 1, 1)
    in_run_window: int = 256
    min_points: int = 32  # fewer minutes: no band


@dataclass
class Band:
    """The forecast band of ``len(expected)`` minutes from ``start_ns`` (a minute's start)."""

    start_ns: int
    expected: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    baseline: str  # SEVEN_DAYS or IN_RUN
    order: tuple[int, int, int]
    seasonal: bool
    history_min: int  # minutes of history it was fitted on

    def at(self, t_ns: int) -> tuple[float, float, float] | None:
        """(expected, lower, upper) of the minute holding ``t_ns``; None outside the band."""
        i = (t_ns - self.start_ns) // MINUTE_NS
        if i < 0 or i >= len(self.expected):
            return None
        return float(self.expected[i]), float(self.lower[i]), float(self.upper[i])

    def detail(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "order": list(self.order),
            "seasonal": self.seasonal,
            "history_min": self.history_min,
        }


@dataclass
class OrderChoice:
    order: Order
    params: Any  # statsmodels' SARIMAXParams
    sigma2: float
    bic: dict[Order, float] = field(default_factory=dict)  # every candidate's


def minute_grid(
    times_ns: np.ndarray, values: np.ndarray, max_minutes: int
) -> tuple[int, np.ndarray]:
    """The series on a minute grid (first minute's start, values; NaN where none), the newest
    ``max_minutes`` minutes at most; several values of a minute: their mean."""
    ok = np.isfinite(values)
    t, v = np.asarray(times_ns, np.int64)[ok], np.asarray(values, float)[ok]
    if not len(t):
        return 0, np.empty(0)
    idx = t // MINUTE_NS
    last = int(idx.max())
    first = max(int(idx.min()), last - max_minutes + 1)
    keep = idx >= first
    idx, v = idx[keep] - first, v[keep]
    n = last - first + 1
    sums = np.bincount(idx, weights=v, minlength=n)
    counts = np.bincount(idx, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        grid = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return first * MINUTE_NS, grid


def fourier(minutes: np.ndarray, harmonics: int) -> np.ndarray:
    """The daily profile's regressors at ``minutes`` (minutes since the epoch: the same phase
    for every series): a constant, then sin and cos of each harmonic."""
    w = 2 * np.pi * (np.asarray(minutes, float) % DAY_MIN) / DAY_MIN
    cols = [np.ones(len(w))]
    for k in range(1, harmonics + 1):
        cols += [np.sin(k * w), np.cos(k * w)]
    return np.column_stack(cols)


def _profile(minutes: np.ndarray, y: np.ndarray, harmonics: int) -> np.ndarray:
    from statsmodels.regression.linear_model import OLS

    ok = np.isfinite(y)
    return np.asarray(OLS(y[ok], fourier(minutes[ok], harmonics)).fit().params)


def daily_share(first_min: int, grid: np.ndarray, harmonics: int) -> float:
    """The share of the newest day's variation (around its own mean) that the daily profile of
    the days before it explains; NaN with less than two days."""
    n = len(grid)
    if n < 2 * DAY_MIN:
        return math.nan
    minutes = first_min + np.arange(n)
    cut = n - DAY_MIN
    beta = _profile(minutes[:cut], grid[:cut], harmonics)
    y = grid[cut:]
    ok = np.isfinite(y)
    if ok.sum() < DAY_MIN // 2 or not np.isfinite(beta).all():
        return math.nan
    shape = fourier(minutes[cut:][ok], harmonics)[:, 1:] @ beta[1:]
    y = y[ok]
    total = float(np.var(y))
    if total <= 0:
        return 0.0
    return 1.0 - float(np.var(y - shape)) / total


def select_order(eta: np.ndarray, candidates: tuple[Order, ...]) -> OrderChoice | None:
    """The candidate with the lowest BIC on ``eta`` (gap-free), each fitted by Hannan-Rissanen
    (the mean removed; d = 1: on the differences); None when none fits."""
    from statsmodels.tsa.arima.estimators.hannan_rissanen import hannan_rissanen

    fitted: dict[Order, tuple[Any, np.ndarray]] = {}
    for order in candidates:
        p, d, q = order
        x = np.diff(eta) if d else eta
        if len(x) < 4 * (p + q + 8):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                params, other = hannan_rissanen(x - x.mean(), ar_order=p, ma_order=q, demean=False)
        except (ValueError, np.linalg.LinAlgError):
            continue
        resid = np.asarray(other["resid"], float)
        if len(resid) and np.isfinite(resid).all() and np.isfinite(params.params).all():
            fitted[order] = (params, resid)
    if not fitted:
        return None
    # the same newest points for every candidate: the shortest residual series
    m = min(len(r) for _, r in fitted.values())
    bic: dict[Order, float] = {}
    for order, (_, resid) in fitted.items():
        s2 = max(float(np.mean(resid[-m:] ** 2)), 1e-300)
        k = order[0] + order[2] + 2  # the coefficients, the mean and the variance
        bic[order] = m * math.log(s2) + k * math.log(m)
    best = min(bic, key=bic.__getitem__)
    s2 = float(np.mean(fitted[best][1][-m:] ** 2))
    return OrderChoice(best, fitted[best][0], s2, bic)


def forecast(
    eta: np.ndarray, order: Order, ar: Any, ma: Any, sigma2: float, *, horizon: int
) -> tuple[np.ndarray, np.ndarray]:
    """The mean and standard error of ``horizon`` forecasts of ``eta`` after its last value by
    ARIMA ``order`` with the given coefficients (d = 0: around the mean of ``eta``; d = 1:
    without drift: a normal range does not trend)."""
    from statsmodels.tsa.arima.model import ARIMA

    p, d, q = order
    mu = 0.0 if d else float(eta.mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ARIMA(
            eta - mu,
            order=order,
            trend="n",
            enforce_stationarity=False,
            enforce_invertibility=False,
        )
        params = np.r_[np.asarray(ar, float)[:p], np.asarray(ma, float)[:q], sigma2]
        fc = model.filter(params).get_forecast(horizon)
    return np.asarray(fc.predicted_mean, float) + mu, np.sqrt(np.asarray(fc.var_pred_mean, float))


def _gap_free(x: np.ndarray) -> np.ndarray:
    """Missing minutes linearly interpolated (the ARMA needs a regular series)."""
    ok = np.isfinite(x)
    if ok.all():
        return x
    i = np.arange(len(x))
    return np.interp(i, i[ok], x[ok])


def _band(
    start_ns: int,
    mean: np.ndarray,
    se: np.ndarray,
    cfg: BaselineConfig,
    **how: Any,
) -> Band:
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + cfg.coverage / 2))
    half = np.maximum(z * se, cfg.rel_floor * np.abs(mean))
    return Band(start_ns, mean, mean - half, mean + half, **how)


def fit_band(times_ns: np.ndarray, values: np.ndarray, cfg: BaselineConfig) -> Band | None:
    """The band of the ``cfg.horizon`` minutes after the newest value (its minute's end): the
    7-day model, else (less than a day) the in-run one; None with too few values or when no
    model fits."""
    start, grid = minute_grid(times_ns, values, cfg.max_minutes)
    # trim to the first and last minute with a value (the grid starts and ends with one)
    ok = np.isfinite(grid)
    if ok.sum() < cfg.min_points:
        return None
    first_min = start // MINUTE_NS
    next_ns = (first_min + len(grid)) * MINUTE_NS
    span_s = len(grid) * 60.0
    if span_s < cfg.min_history_s:
        return _in_run(grid[ok], next_ns, cfg)
    share = daily_share(first_min, grid, cfg.harmonics)
    seasonal = bool(share >= cfg.min_daily_share)
    minutes = first_min + np.arange(len(grid))
    future = first_min + len(grid) + np.arange(cfg.horizon)
    if seasonal:
        beta = _profile(minutes, grid, cfg.harmonics)
        eta = grid - fourier(minutes, cfg.harmonics) @ beta
        ahead = fourier(future, cfg.harmonics) @ beta
    else:
        eta, ahead = grid, np.zeros(cfg.horizon)
    eta = _gap_free(eta)
    choice = select_order(eta[-cfg.order_window :], cfg.candidates)
    if choice is None:
        return _in_run(grid[ok], next_ns, cfg)
    mean, se = forecast(
        eta[-cfg.filter_window :],
        choice.order,
        choice.params.ar_params,
        choice.params.ma_params,
        choice.sigma2,
        horizon=cfg.horizon,
    )
    return _band(
        next_ns,
        mean + ahead,
        se,
        cfg,
        baseline=SEVEN_DAYS,
        order=choice.order,
        seasonal=seasonal,
        history_min=int(ok.sum()),
    )


def _in_run(values: np.ndarray, next_ns: int, cfg: BaselineConfig) -> Band | None:
    """Today's in-run model (``arima_fit.fit``, the ARIMA detector's) over the newest values."""
    x = values[-cfg.in_run_window :]
    params = arima_fit.fit(x, cfg.in_run_order, "hannan_rissanen")
    if params is None:
        return None
    mean, se = forecast(
        x, cfg.in_run_order, params.ar, params.ma, params.sigma**2, horizon=cfg.horizon
    )
    return _band(
        next_ns,
        mean,
        se,
        cfg,
        baseline=IN_RUN,
        order=cfg.in_run_order,
        seasonal=False,
        history_min=len(values),
    )


def fit_bands(
    series: dict[Any, tuple[np.ndarray, np.ndarray]], cfg: BaselineConfig
) -> dict[Any, Band | None]:
    """``fit_band`` of each series (key -> (times, values)): one pool job for many."""
    out: dict[Any, Band | None] = {}
    for key, (t, v) in series.items():
        try:
            out[key] = fit_band(t, v, cfg)
        except Exception:  # one bad series costs its band, not the others'
            out[key] = None
    return out
