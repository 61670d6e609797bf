"""Pure math of "sampling that never hides a spike".

Every value updates a per-window aggregate (count, mean, population standard deviation, min,
max, last, non-finite count; mean and deviation by Welford's update, over finite values); raw
values are sent for a deterministic sample of steps and whenever the guard sees a non-finite or
spike-like value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def sample_period(rate: float) -> int:
    """Steps between two sampled steps: rate 1.0 -> every step, 0.01 -> every 100th, 0 -> never."""
    if rate <= 0:
        return 0
    return max(1, round(1.0 / rate))


def is_sampled(step: int, period: int) -> bool:
    """Deterministic and the same on every rank, so sampled steps line up across ranks."""
    return period > 0 and step % period == 0


@dataclass
class MetricStats:
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean (Welford)
    min: float = math.inf
    max: float = -math.inf
    last: float = math.nan
    nonfinite: int = 0

    def add(self, x: float) -> None:
        self.last = x
        if not math.isfinite(x):
            self.nonfinite += 1
            return
        n = self.count = self.count + 1
        delta = x - self.mean
        self.mean += delta / n
        self.m2 += delta * (x - self.mean)
        self.min = min(self.min, x)
        self.max = max(self.max, x)

    def summary(self) -> dict[str, Any]:
        """Wire form: finite count/mean/std/min/max; ``last`` may be non-finite."""
        if self.count:
            mean, lo, hi = self.mean, self.min, self.max
            std = math.sqrt(max(0.0, self.m2) / self.count)
            if not math.isfinite(mean):  # finite values whose sum overflows
                mean = std = math.nan
        else:
            mean = std = lo = hi = math.nan
        return {
            "count": self.count,
            "mean": mean,
            "std": std,
            "min": lo,
            "max": hi,
            "last": self.last,
            "nonfinite": self.nonfinite,
        }


@dataclass
class Window:
    """Aggregates of all metrics between two emissions. The first window lasts
    ``first_share`` of the steps and seconds of the others (a rank's phase: ``1 -
    Identity.phase``), so that the ranks of a wide run end theirs at different steps."""

    step_first: int | None = None
    step_last: int = 0
    steps: int = 0
    started_ns: int = 0
    metrics: dict[str, MetricStats] = field(default_factory=dict)
    first_share: float = 1.0

    def add_step(self, step: int, values: dict[str, float], now_ns: int) -> None:
        if self.step_first is None:
            self.step_first, self.started_ns = step, now_ns
        self.step_last = step
        self.steps += 1
        for name, x in values.items():
            stats = self.metrics.get(name)
            if stats is None:
                stats = self.metrics[name] = MetricStats()
            stats.add(x)

    def due(self, now_ns: int, max_steps: int, max_s: float) -> bool:
        if self.step_first is None:
            return False
        share = self.first_share
        if share < 1.0:
            max_steps, max_s = max(1, math.ceil(max_steps * share)), max_s * share
        return self.steps >= max_steps or (now_ns - self.started_ns) >= max_s * 1e9

    def emit(self, now_ns: int) -> dict[str, Any] | None:
        """The step_window payload, and reset; None when the window is empty."""
        if self.step_first is None:
            return None
        data = {
            "step_first": self.step_first,
            "step_last": self.step_last,
            "count": self.steps,
            "duration_s": max(0.0, (now_ns - self.started_ns) / 1e9),
            "metrics": {name: s.summary() for name, s in self.metrics.items()},
        }
        self.step_first, self.steps, self.metrics = None, 0, {}
        self.first_share = 1.0
        return data


@dataclass
class _Track:
    """The guard's baseline of one metric."""

    n: int = 0
    mean: float = 0.0
    var: float = 0.0
    run: list[float] = field(default_factory=list)  # the flagged values since the last quiet one
    tokens: float = 0.0  # raw sends this metric may still make now (see Guard)


@dataclass
class Guard:
    """Local spike guard per metric: a robust running baseline and a rate cap.

    A value is flagged when it is non-finite, or, after ``warmup`` values, when it lies more than
    ``sigma`` deviations from the running mean. The deviation has a floor of ``rel_floor`` of the
    mean's magnitude, so a flat series does not flag rounding noise. The baseline is an
    exponentially weighted mean and variance fed with each value clipped to the flagging band
    (a spike moves it a little, heavy-tailed jitter widens it until it stops flagging), and a
    level that holds for ``accept_after`` flagged values in a row on the same side (an lr decay,
    a new batch size, slower steps) becomes the new baseline. At most ``burst`` flags per metric
    at once, then one per ``refill_every`` values: a flag past the cap is not reported (the
    window aggregates still hold the value).
    """

    sigma: float = 6.0
    warmup: int = 20
    alpha: float = 0.05
    rel_floor: float = 0.01
    accept_after: int = 5
    burst: float = 10.0
    refill_every: int = 100
    suppressed: int = 0  # flags past the rate cap
    _state: dict[str, _Track] = field(default_factory=dict)

    def check(self, name: str, x: float) -> bool:
        t = self._state.get(name)
        if t is None:
            t = self._state[name] = _Track(tokens=self.burst)
        t.tokens = min(self.burst, t.tokens + 1.0 / self.refill_every)
        if not math.isfinite(x):
            return self._report(t)
        if t.n < self.warmup:
            self._update(t, x)
            return False
        band = self.sigma * max(math.sqrt(t.var), self.rel_floor * abs(t.mean), 1e-12)
        if abs(x - t.mean) <= band:
            t.run.clear()
            self._update(t, x)
            return False
        run = t.run
        if run and (run[-1] > t.mean) != (x > t.mean):
            run.clear()  # a spike the other way: not the same new level
        run.append(x)
        if len(run) >= self.accept_after:  # a lasting new level: the new baseline
            level = sorted(run)[len(run) // 2]
            spread = sum((v - level) ** 2 for v in run) / len(run)
            t.mean, t.var = level, max(spread, t.var)
            run.clear()
        else:
            self._update(t, t.mean + math.copysign(band, x - t.mean))
        return self._report(t)

    def _update(self, t: _Track, x: float) -> None:
        if t.n == 0:
            t.mean, t.var = x, 0.0
        else:
            # warm-up uses the plain running mean/variance, then an EWMA
            a = max(self.alpha, 1.0 / (t.n + 1))
            delta = x - t.mean
            t.mean += a * delta
            t.var = (1 - a) * (t.var + a * delta * delta)
        t.n += 1

    def _report(self, t: _Track) -> bool:
        if t.tokens >= 1.0:
            t.tokens -= 1.0
            return True
        self.suppressed += 1
        return False
