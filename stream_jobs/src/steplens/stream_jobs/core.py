"""Plain data shared by every signal module: the samples they read and the signals they emit."""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Sequence
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
class SignalGrid:
    """One detector's signals over steps x ranks as arrays (stragglers judged for many steps
    at once): ``signals()`` is the list that judging step by step gives, each step's ranks in
    the order it has them. The worker publishes and the rules evaluate only what they need of
    it; building a ``Signal`` for every step of every rank cost more than the judgement."""

    name: str
    metric: str
    steps: list[int]
    ranks: list[int]  # column k's rank
    scopes: list[str]  # column k's scope
    values: np.ndarray  # (steps, ranks)
    scores: np.ndarray
    breach: np.ndarray  # bool: the signal has ``severity``
    severity: str
    expected: list[float]  # per step
    upper: list[float]
    order: list[list[int]] | None = None  # per step, its columns in signal order (None: 0..n-1)

    @property
    def rule(self) -> str:
        return f"{self.name}:{self.metric}"

    def any_breach(self) -> bool:
        return bool(self.breach.any())

    def signal(self, j: int, k: int) -> Signal:
        """The signal of step ``steps[j]`` and rank ``ranks[k]``."""
        return Signal(
            self.name,
            self.metric,
            self.steps[j],
            float(self.values[j, k]),
            float(self.scores[j, k]),
            self.ranks[k],
            self.scopes[k],
            self.severity if self.breach[j, k] else None,
            self.expected[j],
            None,
            self.upper[j],
        )

    def signals(self, firing: Container[tuple[str, str]] | None = None) -> list[Signal]:
        """Every signal, in order; with ``firing`` (the rules' firing keys) only those the rules
        act on, in the same order: the breaches, the quiet signals of ranks that fire or breach
        here (a quiet one may resolve them) and the last signal (its step is the row's)."""
        n_steps, n_ranks = self.values.shape
        order = self.order
        keep: Container[int] = range(n_ranks)
        if firing is not None:
            rule = self.rule
            hit: list[bool] = np.any(self.breach, axis=0).tolist()
            keep = {k for k in range(n_ranks) if hit[k] or (rule, self.scopes[k]) in firing}
        out: list[Signal] = []
        for j in range(n_steps):
            ks = order[j] if order is not None else range(n_ranks)
            out += [self.signal(j, k) for k in ks if k in keep]
        last = order[-1][-1] if order is not None else n_ranks - 1
        if last not in keep:
            out.append(self.signal(n_steps - 1, last))
        return out


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
