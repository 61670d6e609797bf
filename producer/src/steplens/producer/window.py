"""Pure math of "sampling that never hides a spike".

Every value updates a per-window aggregate (count, mean, min, max, last, non-finite count); raw
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
    total: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    last: float = math.nan
    nonfinite: int = 0

    def add(self, x: float) -> None:
        self.last = x
        if not math.isfinite(x):
            self.nonfinite += 1
            return
        self.count += 1
        self.total += x
        self.min = min(self.min, x)
        self.max = max(self.max, x)

    def summary(self) -> dict[str, Any]:
        """Wire form: finite count/mean/min/max; ``last`` may be non-finite."""
        if self.count:
            mean, lo, hi = self.total / self.count, self.min, self.max
        else:
            mean = lo = hi = math.nan
        return {
            "count": self.count,
            "mean": mean,
            "min": lo,
            "max": hi,
            "last": self.last,
            "nonfinite": self.nonfinite,
        }


@dataclass
class Window:
    """Aggregates of all metrics between two emissions."""

    step_first: int | None = None
    step_last: int = 0
    steps: int = 0
    started_ns: int = 0
    metrics: dict[str, MetricStats] = field(default_factory=dict)

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
        return data


@dataclass
class Guard:
    """Local spike guard per metric: exponentially weighted mean and variance.

    A value is flagged when it is non-finite, or, after ``warmup`` values, when it lies more than
    ``sigma`` standard deviations from the running mean. The deviation scale has a floor of a
    small share of the mean's magnitude, so a flat series does not flag rounding noise. Flagged
    values do not update the statistics, so a run of spikes keeps being flagged.
    """

    sigma: float = 6.0
    warmup: int = 20
    alpha: float = 0.05
    rel_floor: float = 0.01
    _state: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    def check(self, name: str, x: float) -> bool:
        if not math.isfinite(x):
            return True
        n, mean, var = self._state.get(name, (0, 0.0, 0.0))
        if n >= self.warmup:
            scale = max(math.sqrt(var), self.rel_floor * abs(mean), 1e-12)
            if abs(x - mean) > self.sigma * scale:
                return True
        if n == 0:
            mean, var = x, 0.0
        else:
            # warm-up uses the plain running mean/variance, then an EWMA
            a = max(self.alpha, 1.0 / (n + 1))
            delta = x - mean
            mean += a * delta
            var = (1 - a) * (var + a * delta * delta)
        self._state[name] = (n + 1, mean, var)
        return False
