"""The per-value reference of the package's compiled ARIMA detector (its code before the
columnar rewrite): the property tests hold the package equal to it, value by value."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from steplens.stream_jobs.engine.core import Signal, score_of
from steplens.stream_jobs.engine.signals.arima import ArimaConfig, ArimaParams

isfinite, sqrt = math.isfinite, math.sqrt
_INF = math.inf


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
    if state.params is not None:
        # with a model, ``update`` only appends: the recursion reads the last max(p, q) values,
        # and deques bounded to that many trim themselves (a state stored before bounded
        # deques is bounded here, at its next fit)
        keep = max(len(state.params.ar), len(state.params.ma), 1)
        if state.diffs.maxlen != keep:
            state.diffs = deque(state.diffs, maxlen=keep)
        if state.errors.maxlen != keep:
            state.errors = deque(state.errors, maxlen=keep)
        window = cfg.fit_window
        if state.history.maxlen != window and len(state.history) <= window:
            state.history = deque(state.history, maxlen=window)
    return state


def _schedule(state: ArimaState, cfg: ArimaConfig) -> None:
    if state.seen < cfg.first_fit:
        state.next_fit = cfg.first_fit
    else:
        state.next_fit = min(state.seen * 4, state.seen + cfg.refit_every)


def update(
    state: ArimaState, cfg: ArimaConfig, metric: str, x: float, step: int | None, rank: int = -1
) -> tuple[ArimaState, list[Signal]]:
    if not isfinite(x):
        return state, []
    p = state.params
    d = cfg.order[1]
    last = state.last
    diffs, errors = state.diffs, state.errors
    if p is not None and (last is not None or not d):
        mu = state.mean
        pred = mu
        ar, ma = p.ar, p.ma
        if len(ar) == 1:  # the default order, without the loop
            if diffs:
                pred += ar[0] * (diffs[-1] - mu)
        else:
            for a, v in zip(ar, reversed(diffs), strict=False):
                pred += a * (v - mu)
        if len(ma) == 1:
            if errors:
                pred += ma[0] * errors[-1]
        else:
            for b, e in zip(ma, reversed(errors), strict=False):
                pred += b * e
        base = last if d and last is not None else 0.0
        expected = base + pred
        # max(sigma, sqrt(var), rel_floor * |expected|), compared as max() compares
        band = p.sigma
        noise = sqrt(state.var)
        if noise > band:
            band = noise
        noise = cfg.rel_floor * abs(expected)
        if noise > band:
            band = noise
        z = cfg.z
        band *= z
        dev = abs(x - expected)
        outside = dev > band
        n_out = state.outside + 1 if outside else 0
        state.outside = n_out
        consecutive = cfg.consecutive
        ratio = dev / band
        signal = Signal(
            "arima",
            metric,
            step,
            x,
            ratio / (ratio + 1.0) if 0.0 < ratio < _INF else score_of(ratio),
            rank,
            "run",
            None,
            expected,
            expected - band,
            expected + band,
        )
        if outside and n_out < consecutive:
            # an isolated outlier is not learnt: the next forecast starts from the expected value
            # (once it lasts ``consecutive`` values it is a new regime and is followed)
            x = expected
        y = x - base
        err = y - pred
        diffs.append(y)
        errors.append(err)
        lim = band / z * 3.0  # outliers may widen the noise estimate only so far
        e = abs(err)
        if lim < e:
            e = lim
        var = state.var
        state.var = var + cfg.noise_alpha * (e * e - var)
        state.mean = mu + cfg.drift_alpha * (y - mu)
    else:
        y = x - last if d and last is not None else x
        errors.append(0.0)
        signal = Signal("arima", metric, step, x, math.nan, rank)
        keep = max(cfg.order[0], cfg.order[2], 1) if p is None else max(len(p.ar), len(p.ma), 1)
        if last is not None or not d:
            diffs.append(y)
        _trim(diffs, errors, keep)
    state.last = x
    history = state.history
    history.append(x)
    if len(history) > cfg.fit_window:
        history.popleft()
    seen = state.seen = state.seen + 1
    if seen >= state.next_fit:  # next_fit is 0 until the first value schedules it
        if state.next_fit == 0:
            _schedule(state, cfg)
        if seen >= state.next_fit and not state.wants_fit:
            state.wants_fit = True
            _schedule(state, cfg)
    return state, [signal]


def _trim(diffs: deque[float], errors: deque[float], keep: int) -> None:
    while len(diffs) > keep:
        diffs.popleft()
    while len(errors) > keep:
        errors.popleft()
