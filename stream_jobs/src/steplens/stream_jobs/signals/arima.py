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
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from steplens.stream_jobs.core import WARNING, Signal, SignalRun, score_of
from steplens.stream_jobs.signals import kernels

isfinite, sqrt = math.isfinite, math.sqrt
_INF = math.inf


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


def update(  # noqa: PLR0917
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
        if noise > band:  # noqa: PLR1730 (no call on the hot path)
            band = noise
        noise = cfg.rel_floor * abs(expected)
        if noise > band:  # noqa: PLR1730 (no call on the hot path)
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
            WARNING if n_out >= consecutive else None,
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
        if lim < e:  # noqa: PLR1730
            e = lim
        var = state.var
        state.var = var + cfg.noise_alpha * (e * e - var)
        state.mean = mu + cfg.drift_alpha * (y - mu)
    else:
        y = x - last if d and last is not None else x
        errors.append(0.0)
        signal = Signal("arima", metric, step, x, 0.0, rank)
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


def _learn_unfitted(
    state: ArimaState,
    cfg: ArimaConfig,
    xs: Sequence[float],
    steps: Sequence[int | None],
    out: SignalRun,
) -> None:
    """``update`` over finite values before any model, none of which asks for a fit: each
    gets a signal with no score, and is learnt as ``update`` learns it (the differences and
    errors keep their last ``max(p, q, 1)``, the history its last ``fit_window``)."""
    k = len(xs)
    d = cfg.order[1]
    keep = max(cfg.order[0], cfg.order[2], 1)
    last = state.last
    added: list[float] = []  # the last differences these values append
    for t in range(max(0, k - keep), k):
        if not d:
            added.append(xs[t])
        elif t:
            added.append(xs[t] - xs[t - 1])
        elif last is not None:
            added.append(xs[0] - last)
    diffs, errors = state.diffs, state.errors
    diffs.extend(added)
    errors.extend([0.0] * min(k, keep))
    _trim(diffs, errors, keep)
    state.last = xs[-1]
    history = state.history
    room = max(0, cfg.fit_window - len(history))
    history.extend(xs)
    for _ in range(max(0, k - room)):  # update drops one per value once past fit_window
        history.popleft()
    state.seen += k
    none: list[None] = [None] * k
    out.steps += steps
    out.values += xs
    out.scores += [0.0] * k
    out.severities += none
    out.expected += none
    out.lower += none
    out.upper += none


def update_many(  # noqa: PLR0917
    state: ArimaState,
    cfg: ArimaConfig,
    metric: str,
    xs: Sequence[float],
    steps: Sequence[int | None],
    rank: int = -1,
    out: SignalRun | None = None,
) -> tuple[SignalRun, int]:
    """``update`` over finite values until one asks for a fit: their signals as columns and how
    many values were taken (appended to ``out`` when given). The caller applies the fit (or
    not) and passes the rest again.

    With a fitted model of the default order (1, 1, 1) the recursion runs compiled
    (``kernels.arima_111``, the same arithmetic as ``update``); otherwise, per value."""
    if out is None:
        out = SignalRun("arima", metric, rank)
    i, n = 0, len(xs)
    d = cfg.order[1]
    while i < n:
        p = state.params
        if (
            p is None
            or d != 1
            or state.last is None
            or len(p.ar) != 1
            or len(p.ma) != 1
            or state.diffs.maxlen != 1
            or state.errors.maxlen != 1
        ):
            if p is None and state.next_fit and state.history.maxlen is None:
                # before any model: the values up to the one that asks for a fit, at once
                k = n - i if state.wants_fit else min(n - i, state.next_fit - state.seen - 1)
                if k > 1:
                    _learn_unfitted(state, cfg, xs[i : i + k], steps[i : i + k], out)
                    i += k
                    continue
            asked = state.wants_fit
            out.add(update(state, cfg, metric, xs[i], steps[i], rank)[1][0])
            i += 1
            if state.wants_fit and not asked:
                return out, i
            continue
        diffs, errors, history = state.diffs, state.errors, state.history
        prev_d = diffs[-1] if diffs else None
        prev_e = errors[-1] if errors else None
        seen, next_fit = state.seen, state.next_fit
        taken, scores, sev, expected, lower, upper, learnt, after = kernels.arima_111(
            np.asarray(xs[i:] if i else xs, dtype=float),
            float(p.ar[0]),
            float(p.ma[0]),
            float(p.sigma),
            float(state.mean),
            float(state.var),
            float(state.last),
            int(state.outside),
            0.0 if prev_d is None else float(prev_d),
            0.0 if prev_e is None else float(prev_e),
            prev_d is not None,
            prev_e is not None,
            seen,
            next_fit,
            float(cfg.z),
            float(cfg.rel_floor),
            int(cfg.consecutive),
            float(cfg.noise_alpha),
            float(cfg.drift_alpha),
        )
        out.steps += steps[i : i + taken]
        out.values += xs[i : i + taken]
        out.scores += scores.tolist()
        out.severities += kernels.severities(sev)
        out.expected += expected.tolist()
        out.lower += lower.tolist()
        out.upper += upper.tolist()
        i += taken
        state.mean, state.var, state.last, state.outside, prev_d, prev_e, seen = after
        state.seen = seen
        diffs.append(prev_d)
        errors.append(prev_e)
        # as update keeps it: each value appended, then the oldest dropped past fit_window
        # (a history bounded at the fit by apply_fit drops them itself)
        history.extend(learnt.tolist())
        for _ in range(min(taken, len(history) - cfg.fit_window)):
            history.popleft()
        asked = False
        if seen >= next_fit:  # as update schedules it
            if next_fit == 0:
                _schedule(state, cfg)
            if seen >= state.next_fit and not state.wants_fit:
                state.wants_fit = asked = True
                _schedule(state, cfg)
            if asked:
                return out, i
    return out, i
