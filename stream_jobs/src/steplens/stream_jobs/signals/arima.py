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
            res = model.fit(method=method)
    except Exception:
        return None
    named = dict(zip(res.param_names, (float(v) for v in res.params), strict=True))
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
    state.wants_fit = False
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
    if p is not None and (state.last is not None or not d):
        mu = state.mean
        pred = mu
        for coef, past in zip(p.ar, reversed(state.diffs), strict=False):
            pred += coef * (past - mu)
        for coef, err in zip(p.ma, reversed(state.errors), strict=False):
            pred += coef * err
        base = state.last if d and state.last is not None else 0.0
        expected = base + pred
        band = cfg.z * max(p.sigma, math.sqrt(state.var), cfg.rel_floor * abs(expected))
        dev = abs(x - expected)
        state.outside = state.outside + 1 if dev > band else 0
        severity = WARNING if state.outside >= cfg.consecutive else None
        signals.append(
            Signal(
                "arima",
                metric,
                step,
                x,
                score_of(dev / band),
                rank,
                severity=severity,
                expected=expected,
                lower=expected - band,
                upper=expected + band,
            )
        )
        if dev > band and state.outside < cfg.consecutive:
            # an isolated outlier is not learnt: the next forecast starts from the expected value
            # (once it lasts ``consecutive`` values it is a new regime and is followed)
            x = expected
        y = x - base
        err = y - pred
        state.errors.append(err)
        lim = band / cfg.z * 3.0  # outliers may widen the noise estimate only so far
        e = min(abs(err), lim)
        state.var += cfg.noise_alpha * (e * e - state.var)
        state.mean += cfg.drift_alpha * (y - state.mean)
    else:
        y = x - state.last if d and state.last is not None else x
        state.errors.append(0.0)
        signals.append(Signal("arima", metric, step, x, 0.0, rank))
    if state.last is not None or not d:
        state.diffs.append(y)
    keep = max(len(p.ar), len(p.ma), 1) if p is not None else max(cfg.order[0], cfg.order[2], 1)
    while len(state.diffs) > keep:
        state.diffs.popleft()
    while len(state.errors) > keep:
        state.errors.popleft()
    state.last = x
    state.history.append(x)
    if len(state.history) > cfg.fit_window:
        state.history.popleft()
    state.seen += 1
    if state.next_fit == 0:
        _schedule(state, cfg)
    if state.seen >= state.next_fit and not state.wants_fit:
        state.wants_fit = True
        _schedule(state, cfg)
    return state, signals
