"""ARIMA dynamic baseline: a value outside the one-step prediction interval is an anomaly.

Fitting (``arima_fit``) happens rarely: at ``first_fit`` values, then on a quadrupling schedule
up to every ``refit_every`` values, always on the last ``fit_window`` values. ``update`` never
fits: when a value asks for one, the column's ``fitter`` fits it at once (offline), or, without
one, the column notes the ask (``asked``) for its caller to queue the fit for a process pool (the
worker), whose result ``apply_fit`` takes. Between
refits each value costs one step of the ARMA recursion on the differenced series with the fitted
coefficients, which is what the Kalman filter converges to. The model is fitted with a mean (the
drift of a d = 1 series); online, that mean follows an EMA of the recent differences, so a loss
curve whose slope changes between refits does not lag behind its forecast. The stored history
makes a resumed run refit from where it was (warm start) instead of starting cold.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from steplens.stream_jobs.engine.core import Column, Signals, concat
from steplens.stream_jobs.engine.policy import Policy
from steplens.stream_jobs.engine.signals.arima_fit import ArimaParams, fit, fit_many, warm_up
from steplens.stream_jobs.engine.signals.kernels import jit, score

__all__ = ["ArimaConfig", "ArimaParams", "ArimaState", "apply_fit", "fit", "fit_many", "update"]
__all__ += ["fit_input", "warm_up"]

NAN = math.nan
_EMPTY = np.empty(0)


@dataclass
class ArimaConfig:
    order: tuple[int, int, int] = (1, 1, 1)  # d must be 0 or 1
    method: str = "hannan_rissanen"  # any ARIMA.fit method; "statespace" is the slow exact one
    fit_window: int = 256
    first_fit: int = 64
    refit_every: int = 2000
    z: float = 4.0  # interval half-width in noise standard deviations
    consecutive: int = 3  # values outside in a row before they are learnt (a new regime)
    rel_floor: float = 1e-3  # noise floor relative to |value| (smooth series)
    drift_alpha: float = 0.05  # EMA weight of the online mean of the differenced series
    noise_alpha: float = 0.02  # EMA weight of the online forecast-error variance
    retry_after: int = 16  # values before a failed or skipped first fit is asked again
    # a change of regime: rarer than 1 in 1,000, 10 % off the forecast, three values in a
    # row; of the metrics of ``notes_only`` (which the spike detectors judge) it is a note
    policy: Policy = field(
        default_factory=lambda: Policy(rarity=0.999, measure="deviation", warning=0.1, persist=3)
    )
    notes_only: frozenset[str] = frozenset({"loss", "grad_norm", "grad_norm_preclip"})


@dataclass
class ArimaState:
    history: np.ndarray = field(default_factory=lambda: _EMPTY)  # the last fit_window values
    params: ArimaParams | None = None
    diffs: np.ndarray = field(default_factory=lambda: _EMPTY)  # the last max(p, q, 1)
    errors: np.ndarray = field(default_factory=lambda: _EMPTY)
    last: float | None = None
    seen: int = 0
    next_fit: int = 0
    wants_fit: bool = False
    outside: int = 0
    mean: float = 0.0  # online mean of the differenced series
    var: float = 0.0  # online variance of the forecast errors
    failed_fits: int = 0  # first fits that failed or were skipped, for the retry backoff


def fit_input(state: ArimaState, cfg: ArimaConfig) -> np.ndarray:
    return state.history.copy()


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


def update(state: ArimaState, cfg: ArimaConfig, metric: str, col: Column) -> Signals:
    """Score and learn the column's values; a value that asks for a fit is fitted by
    ``col.fitter`` before the next is scored, or, without one, sets ``col.asked``."""
    parts: list[Signals] = []
    xs = col.xs
    i, n = 0, len(xs)
    p, d, q = cfg.order
    while i < n:
        params = state.params
        ar, ma = (params.ar_a, params.ma_a) if params else _unfitted(p, q)
        last = state.last
        ints = np.array(
            (last is not None, state.outside, state.seen, state.next_fit, state.wants_fit),
            dtype=np.int64,
        )
        floats = np.array((state.mean, state.var, 0.0 if last is None else last))
        taken, out, diffs, errors = _arima(
            xs[i:] if i else xs,
            params is not None,
            ar,
            ma,
            float(params.sigma) if params else 1.0,
            int(d),
            state.diffs,
            state.errors,
            ints,
            floats,
            int(cfg.first_fit),
            int(cfg.refit_every),
            float(cfg.z),
            float(cfg.rel_floor),
            int(cfg.consecutive),
            float(cfg.noise_alpha),
            float(cfg.drift_alpha),
        )
        state.outside, state.seen, state.next_fit = int(ints[1]), int(ints[2]), int(ints[3])
        asked = not state.wants_fit and bool(ints[4])
        state.wants_fit = bool(ints[4])
        state.mean, state.var, state.last = float(floats[0]), float(floats[1]), float(floats[2])
        state.diffs, state.errors = diffs, errors
        h = np.concatenate((state.history, out[4]))
        state.history = h[-cfg.fit_window :] if len(h) > cfg.fit_window else h
        part = slice(i, i + taken)
        parts.append(
            Signals(
                "arima",
                metric,
                col.rows[part],
                col.steps[part],
                xs[part],
                out[0],
                np.zeros(taken, np.int8),
                out[1],
                out[2],
                out[3],
                col.rank,
            )
        )
        i += taken
        if asked:
            if col.fitter is None:
                col.asked = True
            else:
                apply_fit(state, cfg, col.fitter(fit_input(state, cfg)))
    return concat(parts) if parts else Signals.of("arima", metric, col.rows, col.steps, xs, NAN)


@functools.cache
def _unfitted(p: int, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients of a series without a model: none used, their number (the order) is."""
    return np.zeros(p), np.zeros(q)


@jit
def _arima(  # noqa: PLR0917
    xs: np.ndarray,
    fitted: bool,
    ar: np.ndarray,
    ma: np.ndarray,
    sigma: float,
    d: int,
    diffs: np.ndarray,
    errors: np.ndarray,
    ints: np.ndarray,
    floats: np.ndarray,
    first_fit: int,
    refit_every: int,
    z: float,
    rel: float,
    consecutive: int,
    noise_alpha: float,
    drift_alpha: float,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """ARIMA(p, d, q) with the fitted ``ar``, ``ma``, ``sigma`` (``fitted``; else each value
    is learnt without a score) over ``xs`` until a value asks for a fit (or the end).
    ``diffs``/``errors``: the last differences and errors (oldest first); ``ints`` (updated
    in place): has_last, outside, seen, next_fit, wants_fit; ``floats`` (in place): mean, var,
    last.

    Returns (taken, rows of scores, expected, lower, upper and the values learnt,
    the differences and the errors after them)."""
    n = len(xs)
    p, q = len(ar), len(ma)
    keep = max(p, q, 1)
    has_last, n_out, seen, next_fit, wants = ints[0], ints[1], ints[2], ints[3], ints[4]
    mu, var, last = floats[0], floats[1], floats[2]
    nd, ne = len(diffs), len(errors)
    dbuf = np.empty(nd + n)
    dbuf[:nd] = diffs
    ebuf = np.empty(ne + n)
    ebuf[:ne] = errors
    # rows: scores, expected, lower, upper, the values learnt
    out = np.empty((5, n))
    out[:4] = NAN  # no score before a model
    i = 0
    while i < n:
        x = xs[i]
        if fitted and (has_last or d == 0):
            pred = mu
            for j in range(min(p, nd)):
                pred += ar[j] * (dbuf[nd - 1 - j] - mu)
            for j in range(min(q, ne)):
                pred += ma[j] * ebuf[ne - 1 - j]
            base = last if d else 0.0
            expected = base + pred
            band = sigma
            noise = math.sqrt(var)
            band = max(band, noise)
            noise = rel * abs(expected)
            band = max(band, noise)
            band *= z
            dev = abs(x - expected)
            outside = dev > band
            n_out = n_out + 1 if outside else 0
            out[0, i] = score(dev / band)
            out[1, i] = expected
            out[2, i] = expected - band
            out[3, i] = expected + band
            if outside and n_out < consecutive:
                # an isolated outlier is not learnt: the next forecast starts from the
                # expected value (once it lasts ``consecutive`` values it is a new regime)
                x = expected
            y = x - base
            err = y - pred
            dbuf[nd] = y
            nd += 1
            ebuf[ne] = err
            ne += 1
            lim = band / z * 3.0  # outliers may widen the noise estimate only so far
            e = abs(err)
            e = min(e, lim)
            var += noise_alpha * (e * e - var)
            mu += drift_alpha * (y - mu)
        else:
            ebuf[ne] = 0.0
            ne += 1
            if has_last or d == 0:
                dbuf[nd] = x - last if d else x
                nd += 1
        out[4, i] = x
        last = x
        has_last = 1
        seen += 1
        i += 1
        if seen >= next_fit:  # next_fit is 0 until the first value schedules it
            if next_fit == 0:
                next_fit = first_fit if seen < first_fit else min(seen * 4, seen + refit_every)
            if seen >= next_fit and not wants:
                wants = 1
                next_fit = first_fit if seen < first_fit else min(seen * 4, seen + refit_every)
                break
    ints[0], ints[1], ints[2], ints[3], ints[4] = has_last, n_out, seen, next_fit, wants
    floats[0], floats[1], floats[2] = mu, var, last
    return (
        i,
        out[:, :i],
        dbuf[max(0, nd - keep) : nd].copy(),
        ebuf[max(0, ne - keep) : ne].copy(),
    )


def warm_up_kernel() -> None:
    one = np.ones(8)
    st = ArimaState(params=ArimaParams([0.5], [0.5], 0.0, 1.0), last=1.0)
    update(st, ArimaConfig(), "m", Column(one, np.zeros(8, np.int64), np.zeros(8, np.int64)))
