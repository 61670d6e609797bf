"""Plain data shared by every signal module: the samples they read and the signals they emit."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.producer.schema import RUN_RANK

WARNING, CRITICAL, INFO = "warning", "critical", "info"


@dataclass(slots=True)
class Signal:
    """One detector's verdict on one sample. ``severity`` is set when a rule is breached."""

    name: str  # detector: "spike", "nonfinite", "volatility", "arima", "threshold", ...
    metric: str
    step: int | None
    value: float
    score: float  # 0..1; 0.5 at the alert threshold
    rank: int = RUN_RANK
    scope: str = "run"
    severity: str | None = None
    expected: float | None = None
    lower: float | None = None
    upper: float | None = None
    detail: dict[str, Any] | None = None

    @property
    def rule(self) -> str:
        return f"{self.name}:{self.metric}"


@dataclass(slots=True)
class SignalRun:
    """One detector's signals for one metric over consecutive values, as columns (what the
    detectors' ``update_many`` return): ``signal(k)`` is the k-th as ``update`` returns it."""

    name: str
    metric: str
    rank: int = RUN_RANK
    steps: list[int | None] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    severities: list[str | None] = field(default_factory=list)
    expected: list[float | None] = field(default_factory=list)
    lower: list[float | None] = field(default_factory=list)
    upper: list[float | None] = field(default_factory=list)
    # None: no signal has a detail (``add`` and ``extend`` append none)
    details: list[dict[str, Any] | None] | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def rule(self) -> str:
        return f"{self.name}:{self.metric}"

    def signal(self, k: int) -> Signal:
        return Signal(
            self.name,
            self.metric,
            self.steps[k],
            self.values[k],
            self.scores[k],
            self.rank,
            "run",
            self.severities[k],
            self.expected[k],
            self.lower[k],
            self.upper[k],
            None if self.details is None else self.details[k],
        )

    def signals(self) -> list[Signal]:
        return [self.signal(k) for k in range(len(self))]

    def add(self, sig: Signal) -> None:
        """Append ``sig`` (of this run's detector, metric and rank; no detail)."""
        self.steps.append(sig.step)
        self.values.append(sig.value)
        self.scores.append(sig.score)
        self.severities.append(sig.severity)
        self.expected.append(sig.expected)
        self.lower.append(sig.lower)
        self.upper.append(sig.upper)

    def extend(  # noqa: PLR0917
        self,
        steps: Sequence[int | None],
        values: Sequence[float],
        scores: Sequence[float],
        severities: Sequence[str | None],
        expected: Sequence[float | None],
        lower: Sequence[float | None],
        upper: Sequence[float | None],
    ) -> None:
        self.steps += steps
        self.values += values
        self.scores += scores
        self.severities += severities
        self.expected += expected
        self.lower += lower
        self.upper += upper


@dataclass(slots=True)
class Alert:
    """An alert transition: ``state`` is "firing" once, then "resolved" once."""

    rule: str
    severity: str
    state: str
    scope: str
    hint: str
    fingerprint: str
    run_id: str
    step: int | None
    started_step: int | None
    summary: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def score_of(ratio: float) -> float:
    """Map ``measure / threshold`` (>= 0) to [0, 1): 0.5 at the threshold, 1 far above it."""
    if math.isnan(ratio) or ratio <= 0.0:
        return 0.0
    if math.isinf(ratio):
        return 1.0
    return ratio / (ratio + 1.0)


def scores_of(ratios: np.ndarray) -> np.ndarray:
    """``score_of`` elementwise."""
    with np.errstate(invalid="ignore"):
        inside = (ratios > 0) & (ratios < math.inf)
        return np.where(inside, ratios / (ratios + 1.0), np.where(ratios == math.inf, 1.0, 0.0))


def median(values: Iterable[float]) -> float:
    """``statistics.median`` of a non-empty series, the same arithmetic without its overhead."""
    data = sorted(values)
    n = len(data)
    i = n // 2
    return data[i] if n % 2 else (data[i - 1] + data[i]) / 2


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
