"""Plain data shared by every signal module: the samples they read and the signals they emit."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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


def median(values: Iterable[float]) -> float:
    """``statistics.median`` of a non-empty series, the same arithmetic without its overhead."""
    data = sorted(values)
    n = len(data)
    i = n // 2
    return data[i] if n % 2 else (data[i - 1] + data[i]) / 2


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
