"""Compiled loops of the detectors' batch paths (numba), per value the same arithmetic, in the
same order, as the modules' ``update``: spike, ARIMA (1, 1, 1) and volatility.

The modules keep their state and call these on numpy arrays; the equivalence tests hold
``update_many`` equal to ``update`` value by value. Compiled once and cached on disk
(``NUMBA_CACHE_DIR`` to move the cache); ``warm_up`` loads them before the first batch.
Floats follow IEEE as Python's do (no fastmath); a division by zero gives inf or nan, as numpy.
"""

# ruff: noqa: PLR1730 (the comparisons are written out: ``max`` may pick another of two
# equal floats, 0.0 and -0.0, than the modules' code does)

from __future__ import annotations

import math

import numba
import numpy as np

from steplens.stream_jobs.core import CRITICAL, WARNING

# The kernels keep the GIL: each runs for microseconds, thousands of times a second, and one
# that released it let the Kafka client's and the fit pool's threads take it, so the event loop
# waited at the end of each call to get it back.
_jit = numba.njit(cache=True, error_model="numpy")

# severity codes in the kernels' outputs
NONE, WARN, CRIT = 0, 1, 2
_NAMES = (None, WARNING, CRITICAL)


def severities(codes: np.ndarray) -> list[str | None]:
    """A kernel's severity codes as the signals' severities."""
    if not np.count_nonzero(codes):  # the common case
        return [None] * len(codes)
    return list(map(_NAMES.__getitem__, codes.tolist()))


@_jit
def score(r: float) -> float:
    """``core.score_of``: ``r / (r + 1)`` for ``0 < r < inf``; 1 at inf; else 0."""
    if 0.0 < r < math.inf:
        return r / (r + 1.0)
    if r == math.inf:
        return 1.0
    return 0.0


@_jit
def _mad_sorted(s: np.ndarray, center: float) -> float:
    """The median of ``|s - center|`` over the sorted ``s``, without sorting: the distances
    below and above ``center`` are two ascending runs, merged up to the middle."""
    n = len(s)
    hi = np.searchsorted(s, center)  # s[:hi] < center <= s[hi:]
    lo = hi - 1
    want = n // 2
    prev = cur = 0.0
    for _ in range(want + 1):
        if lo < 0 or (hi < n and s[hi] - center <= center - s[lo]):
            d = s[hi] - center
            hi += 1
        else:
            d = center - s[lo]  # the same float as abs(s[lo] - center)
            lo -= 1
        prev, cur = cur, d
    return cur if n % 2 else (prev + cur) / 2


@_jit
def _insert_remove(buf: np.ndarray, n: int, x: float, old: float) -> None:
    """In the sorted ``buf[:n]`` (``buf`` holds ``n + 1``): ``insort(x)``, then delete the
    first value equal to ``old``, as ``bisect`` on a list leaves it."""
    j = n
    while j > 0 and buf[j - 1] > x:
        buf[j] = buf[j - 1]
        j -= 1
    buf[j] = x
    j = 0
    while buf[j] < old:
        j += 1
    while j < n:
        buf[j] = buf[j + 1]
        j += 1


@_jit
def spike_full(  # noqa: PLR0917
    fl: np.ndarray,
    old_diffs: np.ndarray,
    ordered: np.ndarray,
    scale: float,
    since: int,
    every: int,
    trend_tolerant: bool,
    up: bool,
    z_cfg: float,
    ratio_cfg: float,
    min_rel_change: float,
    rel_floor: float,
    abs_floor: float,
    near_zero: float,
) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, int
]:
    """``spike.update`` over the last ``len(fl) - w`` values of ``fl``, whose first ``w`` are
    the baseline window (``ordered``: sorted, ``old_diffs``: its ``w`` differences).

    Returns (scores, severities, medians, lower, upper, the window sorted after the batch,
    old_diffs then the new differences, scale, since). The scale is ``spike._scale_of``
    over the window of differences (and of values), each kept sorted as ``ordered`` is."""
    w = len(ordered)
    m = len(fl) - w
    scores = np.empty(m)
    sev = np.zeros(m, np.int8)
    meds = np.empty(m)
    lower = np.empty(m)
    upper = np.empty(m)
    dl = np.empty(w + m)  # after learning x_i the differences are dl[i + 1 : i + 1 + w]
    dl[:w] = old_diffs
    buf = np.empty(w + 1)
    buf[:w] = ordered
    sd = np.empty(w + 1)  # the differences, sorted
    sd[:w] = np.sort(old_diffs)
    h = w // 2
    odd = w % 2
    root2 = math.sqrt(2.0)
    for i in range(m):
        med = buf[h] if odd else 0.5 * (buf[h - 1] + buf[h])
        x = fl[w + i]
        # the score, as spike._score computes it with the scale before learning x
        amed = abs(med)
        sc = scale
        floor = rel_floor * amed
        if floor > sc:
            sc = floor
        if abs_floor > sc:
            sc = abs_floor
        dev = x - med
        if not up:
            dev = abs(dev)
        z = dev / sc
        moved = dev >= min_rel_change * amed
        s = NONE
        if moved and z >= z_cfg:
            s = CRIT if z >= 2.0 * z_cfg else WARN
        ratio = 0.0
        if amed > near_zero and amed > 3.0 * sc and x * med > 0:
            ratio = x / med
            if not up:
                inv = med / x
                if inv > ratio:
                    ratio = inv
            if ratio >= ratio_cfg:
                s = CRIT
        sco = score(z / z_cfg) if moved else 0.0
        if ratio >= 1.0:
            by_ratio = score(ratio / ratio_cfg)
            if by_ratio > sco:
                sco = by_ratio
        band = z_cfg * sc
        scores[i] = sco
        sev[i] = s
        meds[i] = med
        lower[i] = med - band
        upper[i] = med + band
        # learn x
        d = x - fl[w + i - 1]
        dl[w + i] = d
        _insert_remove(sd, w, d, dl[i])
        _insert_remove(buf, w, x, fl[i])
        since += 1
        if since >= every or scale == 0.0:
            mid = sd[h] if odd else (sd[h - 1] + sd[h]) / 2
            scale = _mad_sorted(sd[:w], mid) / root2
            if not trend_tolerant:
                # the smaller is the noise when the series trends, the larger when it is
                # heavy-tailed around a level
                mad_level = _mad_sorted(buf[:w], buf[h])
                if mad_level > scale:
                    scale = mad_level
            scale *= 1.4826
            since = 0
    return scores, sev, meds, lower, upper, buf[:w].copy(), dl, scale, since


@_jit
def arima_111(  # noqa: PLR0917
    xs: np.ndarray,
    ar: float,
    ma: float,
    sigma: float,
    mu: float,
    var: float,
    last: float,
    n_out: int,
    prev_d: float,
    prev_e: float,
    has_d: bool,
    has_e: bool,
    seen: int,
    next_fit: int,
    z: float,
    rel: float,
    consecutive: int,
    noise_alpha: float,
    drift_alpha: float,
) -> tuple[
    int,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    tuple[float, float, float, int, float, float, int],
]:
    """``arima.update`` with a fitted (1, 1, 1) model over ``xs`` until ``seen`` reaches
    ``next_fit`` (or the end). ``has_d``, ``has_e``: ``prev_d``, ``prev_e`` hold the last
    difference, error (else there is none yet).

    Returns (taken, scores, severities, expected, lower, upper, learnt values,
    (mu, var, last, n_out, prev_d, prev_e, seen))."""
    n = len(xs)
    scores = np.empty(n)
    sev = np.zeros(n, np.int8)
    expected_ = np.empty(n)
    lower = np.empty(n)
    upper = np.empty(n)
    learnt = np.empty(n)
    i = 0
    while i < n:
        x = xs[i]
        pred = mu
        if has_d:
            pred += ar * (prev_d - mu)
        if has_e:
            pred += ma * prev_e
        expected = last + pred
        band = sigma
        noise = math.sqrt(var)
        if noise > band:
            band = noise
        noise = rel * abs(expected)
        if noise > band:
            band = noise
        band *= z
        dev = abs(x - expected)
        outside = dev > band
        n_out = n_out + 1 if outside else 0
        ratio = dev / band
        scores[i] = score(ratio)
        if n_out >= consecutive:
            sev[i] = WARN
        expected_[i] = expected
        lower[i] = expected - band
        upper[i] = expected + band
        if outside and n_out < consecutive:
            x = expected
        learnt[i] = x
        y = x - last
        err = y - pred
        prev_d, prev_e, has_d, has_e = y, err, True, True
        lim = band / z * 3.0
        e = abs(err)
        if lim < e:
            e = lim
        var += noise_alpha * (e * e - var)
        mu += drift_alpha * (y - mu)
        last = x
        seen += 1
        i += 1
        if seen >= next_fit:
            break
    state = (mu, var, last, n_out, prev_d, prev_e, seen)
    return i, scores[:i], sev[:i], expected_[:i], lower[:i], upper[:i], learnt[:i], state


@_jit
def volatility_full(  # noqa: PLR0917
    vals: np.ndarray,
    w: int,
    old_diffs: np.ndarray,
    window: int,
    sum_v: float,
    sum_d: float,
    sum_d2: float,
    threshold: float,
    abs_floor: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float, float]:
    """``volatility.update`` once the window is full: ``vals`` is the window's ``w`` values
    then the new ones, ``old_diffs`` the window's differences (at least 2); the running sums
    as the module keeps them.

    Returns (cvs, scores, severities, old_diffs and the new differences, sum_v, sum_d,
    sum_d2)."""
    k = len(old_diffs)
    m = len(vals) - w
    ds = np.empty(k + m)
    ds[:k] = old_diffs
    cvs = np.empty(m)
    scores = np.empty(m)
    sev = np.zeros(m, np.int8)
    prev = vals[w - 1]
    for j in range(m):
        x = vals[w + j]
        d = x - prev
        prev = x
        ds[k + j] = d
        sum_d += d
        sum_d2 += d * d
        old = ds[j]
        sum_d -= old
        sum_d2 -= old * old
        sum_v += x
        sum_v -= vals[j]
        var = (sum_d2 - sum_d * sum_d / k) / (k - 1)
        if not var > 0.0:
            var = 0.0
        noise = math.sqrt(var / 2.0)
        floor = abs(sum_v / window)
        if abs_floor > floor:
            floor = abs_floor
        cv = noise / floor
        cvs[j] = cv
        scores[j] = score(cv / threshold)
        if cv > threshold:
            sev[j] = WARN
    return cvs, scores, sev, ds, sum_v, sum_d, sum_d2


@_jit
def lr_recent(
    recent: np.ndarray, lr: np.ndarray, window: int, warmup: int, jump: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``lr_schedule._judge`` without a schedule over finite lrs: each against ``jump`` x the
    largest of the (at most ``window``) lrs before it. ``recent``: those before the first.

    Returns (scores, breaches, tops, limits, the last ``window`` lrs)."""
    r0 = len(recent)
    n = len(lr)
    seq = np.empty(r0 + n)
    seq[:r0] = recent
    seq[r0:] = lr
    scores = np.empty(n)
    breach = np.zeros(n, np.bool_)
    tops = np.empty(n)
    limits = np.empty(n)
    for i in range(n):
        k = r0 + i  # the window before this lr ends at seq[k]
        top = 0.0
        start = k - window if k > window else 0
        if k > start:
            top = seq[start]
            for j in range(start + 1, k):
                if seq[j] > top:
                    top = seq[j]
        x = lr[i]
        limit = jump * top
        size = k + 1 if k + 1 < window else window
        ready = size > warmup and top > 0
        breach[i] = ready and x > limit
        tops[i] = top
        limits[i] = limit
        scores[i] = score(x / limit) if ready else 0.0
    keep = r0 + n if r0 + n < window else window
    return scores, breach, tops, limits, seq[r0 + n - keep :].copy()


@_jit
def stragglers(
    times: np.ndarray, recents: np.ndarray, factor: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``ranks._judge`` over consecutive steps (rows of ``times``: each rank's step time, in
    the same rank order; ``recents``: each rank's ``keep`` latest ratios, oldest first).
    Returns each step's median, each rank's typical ratio and score at each step, and each
    rank's latest ratios after the last step. Medians as ``core.median`` takes them."""
    n_steps, n_ranks = times.shape
    keep = recents.shape[1]
    window = recents.copy()
    med = np.empty(n_steps)
    typical = np.empty((n_steps, n_ranks))
    scores = np.empty((n_steps, n_ranks))
    h, g = n_ranks // 2, keep // 2
    row = np.empty(n_ranks)
    w = np.empty(keep)
    for j in range(n_steps):
        _sorted_into(times[j], row)
        m = row[h] if n_ranks % 2 else (row[h - 1] + row[h]) / 2
        med[j] = m
        for k in range(n_ranks):
            ratio = times[j, k] / m if m > 0 else 1.0
            for q in range(keep - 1):
                window[k, q] = window[k, q + 1]
            window[k, keep - 1] = ratio
            _sorted_into(window[k], w)
            ty = w[g] if keep % 2 else (w[g - 1] + w[g]) / 2
            typical[j, k] = ty
            scores[j, k] = score(ty / factor)
    return med, typical, scores, window


@_jit
def _sorted_into(xs: np.ndarray, out: np.ndarray) -> None:
    """``out`` = ``xs`` sorted ascending (insertion sort: the rows here are short)."""
    for i in range(len(xs)):
        x = xs[i]
        q = i
        while q > 0 and out[q - 1] > x:
            out[q] = out[q - 1]
            q -= 1
        out[q] = x


def warm_up() -> None:
    """Compile the kernels, or load them from the cache, before the first batch needs them."""
    one = np.ones(8)
    spike_full(one, one[:4], one[:4], 1.0, 0, 16, True, True, 7.0, 10.0, 0.1, 1e-3, 1e-12, 1e-8)
    arima_111(
        one, 0.5, 0.5, 1.0, 0.0, 1.0, 1.0, 0, 0.0, 0.0, True, True, 0, 8, 4.0, 1e-3, 3, 0.02, 0.05
    )
    volatility_full(one, 4, one[:3], 4, 4.0, 0.0, 0.0, 0.1, 1e-3)
    lr_recent(one[:2], one, 4, 2, 2.0)
    stragglers(np.ones((2, 4)), np.ones((4, 3)), 1.5)
