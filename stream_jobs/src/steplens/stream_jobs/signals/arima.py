"""ARIMA dynamic baseline: a value outside the one-step prediction interval is an anomaly.

Fitting (statsmodels, tens to hundreds of ms) happens rarely: at ``first_fit`` values, then on a
quadrupling schedule up to every ``refit_every`` values, always on the last ``fit_window`` values.
``update`` never fits: it sets ``state.wants_fit`` and the caller runs ``fit`` (in a process
pool in the worker) and hands the result to ``apply_fit``. Between refits each value costs one
step of the ARMA recursion on the differenced series with the fitted coefficients (a few µs),
which is what the Kalman filter converges to. The model is fitted with a mean (the drift of a
d = 1 series); online, that mean follows an EMA of the recent differences, so a loss curve
whose slope changes between refits does not lag behind its forecast. The stored history makes
a resumed run refit from where it was (warm start) instead of starting cold.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from steplens.stream_jobs.core import WARNING, Signal, score_of


@dataclass
class ArimaConfig:
    order: tuple[int, int, int] = (1, 1, 1)  # d must be 0 or 1
    method: str = "hannan_rissanen"  # any ARIMA.fit method; "statespace" is the slow exact one
    fit_window: int = 256
    first_fit: int = 64
    refit_every: int = 2000
    z: float = 4.0  # interval half-width in noise standard deviations
    consecutive: int = 3  # values outside in a row before it warns
    rel_floor: float = 1e-3  # noise floor relative to |value| (smooth series)
    drift_alpha: float = 0.05  # EMA weight of the online mean of the differenced series
    noise_alpha: float = 0.02  # EMA weight of the online forecast-error variance
    retry_after: int = 16  # values before a failed or skipped first fit is asked again


@dataclass
class ArimaParams:
    ar: list[float]
    ma: list[float]
    const: float
    sigma: float


@dataclass
class ArimaState:
    history: deque[float] = field(default_factory=deque)
    params: ArimaParams | None = None
    diffs: deque[float] = field(default_factory=deque)
    errors: deque[float] = field(default_factory=deque)
    last: float | None = None
    seen: int = 0
    next_fit: int = 0
    wants_fit: bool = False
    outside: int = 0
    mean: float = 0.0  # online mean of the differenced series
    var: float = 0.0  # online variance of the forecast errors
    failed_fits: int = 0  # first fits that failed or were skipped, for the retry backoff


def fit(values: np.ndarray, order: tuple[int, int, int], method: str) -> ArimaParams | None:
    """Fit ARIMA on ``values``; ``None`` when statsmodels cannot. Picklable for process pools."""
    from statsmodels.tsa.arima.model import ARIMA

    p, d, q = order
    series = np.diff(values) if d else values
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ARIMA(
                series,
                order=(p, 0, q),
                trend="c",
                enforce_stationarity=False,
                enforce_invertibility=False,
            )
            # the bare parameters: building a results object would cost a third of the fit
            params = model.fit(method=method, return_params=True)
    except Exception:
        return None
    named = dict(zip(model.param_names, (float(v) for v in params), strict=True))
    sigma2 = named.get("sigma2", float("nan"))
    if not math.isfinite(sigma2) or sigma2 <= 0:
        sigma2 = float(np.var(series)) or 1e-12
    return ArimaParams(
        ar=[named.get(f"ar.L{i}", 0.0) for i in range(1, p + 1)],
        # clipped into the invertible range so the recursion cannot blow up
        ma=[min(0.98, max(-0.98, named.get(f"ma.L{i}", 0.0))) for i in range(1, q + 1)],
        const=named.get("const", 0.0),
        sigma=math.sqrt(sigma2),
    )


def fit_input(state: ArimaState, cfg: ArimaConfig) -> np.ndarray:
    return np.fromiter(state.history, float, len(state.history))


def apply_fit(state: ArimaState, cfg: ArimaConfig, params: ArimaParams | None) -> ArimaState:
    """Take a fit's result; ``None`` (failed, or skipped by a busy pool) before any model exists
    asks again after ``retry_after`` values (doubling with each failure) instead of waiting for
    the next scheduled refit."""
    state.wants_fit = False
    if params is None and state.params is None:
        state.next_fit = min(state.next_fit, state.seen + (cfg.retry_after << state.failed_fits))
        state.failed_fits = min(state.failed_fits + 1, 8)
    if params is not None:
        if state.params is None:
            state.mean = params.const
        state.var = max(state.var, params.sigma**2)
        state.params = params
    return state


def _schedule(state: ArimaState, cfg: ArimaConfig) -> None:
    if state.seen < cfg.first_fit:
        state.next_fit = cfg.first_fit
    else:
        state.next_fit = min(state.seen * 4, state.seen + cfg.refit_every)


def update(  # noqa: PLR0917
    state: ArimaState, cfg: ArimaConfig, metric: str, x: float, step: int | None, rank: int = -1
) -> tuple[ArimaState, list[Signal]]:
    if not math.isfinite(x):
        return state, []
    p = state.params
    signals: list[Signal] = []
    d = cfg.order[1]
    last = state.last
    diffs, errors = state.diffs, state.errors
    if p is not None and (last is not None or not d):
        mu = state.mean
        pred = mu
        ar, ma = p.ar, p.ma
        if ar:
            n = len(diffs)
            for i in range(min(len(ar), n)):
                pred += ar[i] * (diffs[n - 1 - i] - mu)
        if ma:
            n = len(errors)
            for i in range(min(len(ma), n)):
                pred += ma[i] * errors[n - 1 - i]
        base = last if d and last is not None else 0.0
        expected = base + pred
        band = cfg.z * max(p.sigma, math.sqrt(state.var), cfg.rel_floor * abs(expected))
        dev = abs(x - expected)
        outside = dev > band
        state.outside = state.outside + 1 if outside else 0
        severity = WARNING if state.outside >= cfg.consecutive else None
        signals.append(
            Signal(
                "arima",
                metric,
                step,
                x,
                score_of(dev / band),
                rank,
                "run",
                severity,
                expected,
                expected - band,
                expected + band,
            )
        )
        if outside and state.outside < cfg.consecutive:
            # an isolated outlier is not learnt: the next forecast starts from the expected value
            # (once it lasts ``consecutive`` values it is a new regime and is followed)
            x = expected
        y = x - base
        err = y - pred
        errors.append(err)
        lim = band / cfg.z * 3.0  # outliers may widen the noise estimate only so far
        e = min(abs(err), lim)
        state.var += cfg.noise_alpha * (e * e - state.var)
        state.mean += cfg.drift_alpha * (y - state.mean)
        keep = max(len(ar), len(ma), 1)
    else:
        y = x - last if d and last is not None else x
        errors.append(0.0)
        signals.append(Signal("arima", metric, step, x, 0.0, rank))
        keep = max(cfg.order[0], cfg.order[2], 1) if p is None else max(len(p.ar), len(p.ma), 1)
    if last is not None or not d:
        diffs.append(y)
    while len(diffs) > keep:
        diffs.popleft()
    while len(errors) > keep:
        errors.popleft()
    state.last = x
    history = state.history
    history.append(x)
    if len(history) > cfg.fit_window:
        history.popleft()
    state.seen += 1
    if state.next_fit == 0:
        _schedule(state, cfg)
    if state.seen >= state.next_fit and not state.wants_fit:
        state.wants_fit = True
        _schedule(state, cfg)
    return state, signals
