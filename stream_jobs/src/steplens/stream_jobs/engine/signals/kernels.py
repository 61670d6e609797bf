"""What the detectors' compiled loops (numba) share. Each signal module holds its own loop, over
a run of new values from any state (a baseline still filling included): the one implementation
of that detector, for a record (a run of one value) and a batch alike; the tests hold each equal,
value by value, to the per-value reference in ``tests/stream_jobs/reference``.

Compiled once and cached on disk (``NUMBA_CACHE_DIR`` to move the cache);
``registry.warm_up`` loads them before the first batch. Floats follow IEEE as Python's do (no
fastmath); a division by zero gives inf or nan.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# the kernels keep the GIL: each runs for microseconds, and releasing it makes the event loop
# wait for it at the end of every call
jit = numba.njit(cache=True, error_model="numpy")

NAN = math.nan


@jit
def score(r: float) -> float:
    """``core.score_of``: ``r / (r + 1)`` for ``0 < r < inf``; 1 at inf; else 0."""
    if 0.0 < r < math.inf:
        return r / (r + 1.0)
    if r == math.inf:
        return 1.0
    return 0.0


@jit
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


@jit
def _insert(buf: np.ndarray, n: int, x: float) -> None:
    """``insort(x)`` into the sorted ``buf[:n]`` (``buf`` holds ``n + 1``)."""
    j = n
    while j > 0 and buf[j - 1] > x:
        buf[j] = buf[j - 1]
        j -= 1
    buf[j] = x


@jit
def _remove(buf: np.ndarray, n: int, old: float) -> None:
    """Delete the first value equal to ``old`` from the sorted ``buf[:n]``, as ``bisect``
    on a list leaves it."""
    j = 0
    while buf[j] < old:
        j += 1
    while j < n - 1:
        buf[j] = buf[j + 1]
        j += 1


@jit
def _median_sorted(s: np.ndarray, n: int) -> float:
    h = n // 2
    return s[h] if n % 2 else (s[h - 1] + s[h]) / 2
