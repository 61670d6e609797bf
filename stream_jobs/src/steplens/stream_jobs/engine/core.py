"""Plain data shared by every signal module: ``Signals`` (the one shape every detector returns),
the ``Signal`` row view the rules and the outputs read, and ``Alert``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

from steplens.schema import RUN_RANK

WARNING, CRITICAL, INFO = "warning", "critical", "info"
# severity codes in ``Signals.severity``: 0 none; the order is the escalation order
SEVERITIES: tuple[str | None, ...] = (None, INFO, WARNING, CRITICAL)
NO_SEV, INFO_SEV, WARN_SEV, CRIT_SEV = 0, 1, 2, 3
CODE = {s: k for k, s in enumerate(SEVERITIES)}
NO_STEP = np.iinfo(np.int64).min  # ``Signals.step`` of a signal without a step
_NAN = math.nan
isnan = math.isnan


@dataclass(slots=True)
class Signal:
    """One signal as a row: what the rules, the evidence and the wire records read
    (``Signals.view``). ``severity`` is set when a rule is breached."""

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


def _floats(x: Any, n: int) -> np.ndarray:
    if x is None:
        return np.full(n, _NAN)
    if isinstance(x, np.ndarray):
        return x if x.dtype == np.float64 else x.astype(np.float64)
    if isinstance(x, (int, float)):
        return np.full(n, float(x))
    return np.array([_NAN if v is None else v for v in x], dtype=np.float64)


@dataclass(slots=True, eq=False)
class Signals:
    """One detector's signals for one metric, as columns. Row ``k`` is signal ``k``; ``row``
    is the batch row it belongs to (non-decreasing: a record is a batch of one row), the key
    the rules read a batch in. ``expected``/``lower``/``upper`` NaN: none; ``step`` ``NO_STEP``:
    none; ``severity``: codes of ``SEVERITIES``; ``rank`` and ``scope`` one for all or per
    signal; ``detail`` None or one per signal."""

    name: str
    metric: str
    row: np.ndarray  # int64
    step: np.ndarray  # int64
    value: np.ndarray  # float64
    score: np.ndarray
    severity: np.ndarray  # int8
    expected: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    rank: int | np.ndarray = RUN_RANK
    scope: str | list[str] = "run"
    detail: list[dict[str, Any] | None] | None = None

    @staticmethod
    def of(  # noqa: PLR0917
        name: str,
        metric: str,
        row: Any,
        step: Any,
        value: Any,
        score: Any,
        severity: Any = None,
        expected: Any = None,
        lower: Any = None,
        upper: Any = None,
        rank: int | np.ndarray = RUN_RANK,
        scope: str | list[str] = "run",
        detail: list[dict[str, Any] | None] | None = None,
    ) -> Signals:
        """Build from arrays, sequences or one value for all (``None``: none)."""
        if isinstance(value, (int, float)):
            n = 1 if isinstance(row, (int, np.integer)) else len(row)
        else:
            n = len(value)
        rows = np.broadcast_to(np.asarray(row, dtype=np.int64), (n,))
        if isinstance(step, np.ndarray) and step.dtype == np.int64:
            steps = step
        elif step is None or isinstance(step, int):
            steps = np.full(n, NO_STEP if step is None else step, dtype=np.int64)
        else:
            steps = np.array([NO_STEP if s is None else s for s in step], dtype=np.int64)
        if severity is None:
            sev = np.zeros(n, np.int8)
        elif isinstance(severity, np.ndarray):
            sev = severity.astype(np.int8, copy=False)
        elif isinstance(severity, (str, int)):
            sev = np.full(n, CODE[severity] if isinstance(severity, str) else severity, np.int8)
        else:
            sev = np.array([CODE[s] for s in severity], dtype=np.int8)
        return Signals(
            name,
            metric,
            rows,
            steps,
            _floats(value, n),
            _floats(score, n),
            sev,
            _floats(expected, n),
            _floats(lower, n),
            _floats(upper, n),
            rank,
            scope,
            detail,
        )

    def __len__(self) -> int:
        return len(self.score)

    @property
    def rule(self) -> str:
        return f"{self.name}:{self.metric}"

    def breach(self) -> np.ndarray:
        """Which signals have a severity."""
        return self.severity != NO_SEV

    def any_breach(self) -> bool:
        return bool(self.severity.any())

    def loud(self) -> np.ndarray:
        """Breaches and scores at or above the alert threshold (the limiter always sends)."""
        return (self.severity != NO_SEV) | (self.score >= 0.5)

    def rank_at(self, k: int) -> int:
        r = self.rank
        return r if isinstance(r, int) else int(r[k])

    def scope_at(self, k: int) -> str:
        s = self.scope
        return s if isinstance(s, str) else s[k]

    def step_at(self, k: int) -> int | None:
        st = int(self.step[k])
        return None if st == NO_STEP else st

    def view(self, k: int) -> Signal:
        """Signal ``k`` as a row."""
        e, lo, up = float(self.expected[k]), float(self.lower[k]), float(self.upper[k])
        return Signal(
            self.name,
            self.metric,
            self.step_at(k),
            float(self.value[k]),
            float(self.score[k]),
            self.rank_at(k),
            self.scope_at(k),
            SEVERITIES[self.severity[k]],
            None if isnan(e) else e,
            None if isnan(lo) else lo,
            None if isnan(up) else up,
            None if self.detail is None else self.detail[k],
        )

    def views(self, ks: Iterable[int] | None = None) -> list[Signal]:
        view = self.view
        return [view(k) for k in (range(len(self)) if ks is None else ks)]

    def take(self, idx: np.ndarray | Sequence[int]) -> Signals:
        """The signals at ``idx`` (indices or a boolean mask), in that order."""
        idx = np.asarray(idx)
        if idx.dtype == np.bool_:
            idx = np.flatnonzero(idx)
        rank = self.rank if isinstance(self.rank, int) else self.rank[idx]
        scope = self.scope if isinstance(self.scope, str) else [self.scope[k] for k in idx]
        detail = None if self.detail is None else [self.detail[k] for k in idx]
        return Signals(
            self.name,
            self.metric,
            self.row[idx],
            self.step[idx],
            self.value[idx],
            self.score[idx],
            self.severity[idx],
            self.expected[idx],
            self.lower[idx],
            self.upper[idx],
            rank,
            scope,
            detail,
        )

    def at_row(self, i: int) -> range:
        """The signals of batch row ``i``."""
        row = self.row
        return range(int(np.searchsorted(row, i)), int(np.searchsorted(row, i, "right")))


def one(name: str, metric: str, step: int | None, value: float, score: float, **at: Any) -> Signals:
    """One signal (of a record's own detectors: evaluations, data) on batch row ``at["row"]``
    (0); the arguments as ``SignalRows.add`` takes them. A detector that gives several
    signals of a record gathers them (``SignalRows``)."""
    rows = SignalRows()
    rows.add(name, metric, step, value, score, **at)
    return rows.signals()[0]


# one signal as ``SignalRows`` keeps it until built: row, step, value, score, severity code,
# expected, lower, upper, rank, scope, detail
_Item = tuple[int, int, float, float, int, float, float, float, int, str, dict[str, Any] | None]


def _item(  # noqa: PLR0917
    row: int,
    step: int | None,
    value: float,
    score: float,
    rank: int,
    scope: str,
    severity: str | None,
    expected: float | None,
    lower: float | None,
    upper: float | None,
    detail: dict[str, Any] | None,
) -> _Item:
    nan = _NAN
    return (
        row,
        NO_STEP if step is None else step,
        value,
        score,
        CODE[severity],
        nan if expected is None else expected,
        nan if lower is None else lower,
        nan if upper is None else upper,
        rank,
        scope,
        detail,
    )


def _columns(name: str, metric: str, items: list[_Item]) -> Signals:
    """One rule's signals (``items``, rows non-decreasing) as columns."""
    rows, steps, values, scores, sevs, exps, lows, ups, ranks, scopes, details = zip(
        *items, strict=True
    )
    r0, s0 = ranks[0], scopes[0]
    f64 = np.float64
    return Signals(
        name,
        metric,
        np.array(rows, np.int64),
        np.array(steps, np.int64),
        np.array(values, f64),
        np.array(scores, f64),
        np.array(sevs, np.int8),
        np.array(exps, f64),
        np.array(lows, f64),
        np.array(ups, f64),
        r0 if all(r == r0 for r in ranks) else np.array(ranks, np.int64),
        s0 if all(s == s0 for s in scopes) else list(scopes),
        None if all(d is None for d in details) else list(details),
    )


class SignalRows:
    """Signals added one at a time and built as columns: one ``Signals`` per rule (name and
    metric) in the order the rules first came, each rule's signals in the order added (rows
    non-decreasing). A hardware record's eight GPUs give each of its rules one ``Signals`` of
    eight, not eight of one: the rules and the incidents then read a handful of rules, not
    dozens of one-signal columns."""

    __slots__ = ("_rules",)

    def __init__(self) -> None:
        self._rules: dict[tuple[str, str], list[_Item]] = {}

    def add(
        self,
        name: str,
        metric: str,
        step: int | None,
        value: float,
        score: float,
        *,
        rank: int = RUN_RANK,
        scope: str = "run",
        severity: str | None = None,
        expected: float | None = None,
        lower: float | None = None,
        upper: float | None = None,
        detail: dict[str, Any] | None = None,
        row: int = 0,
    ) -> None:
        item = _item(row, step, value, score, rank, scope, severity, expected, lower, upper, detail)
        got = self._rules.get((name, metric))
        if got is None:
            self._rules[(name, metric)] = [item]
        else:
            got.append(item)

    def signals(self) -> list[Signals]:
        return [_columns(name, metric, items) for (name, metric), items in self._rules.items()]


def counter_rise(
    out: SignalRows,
    name: str,
    metric: str,
    step: int | None,
    rise: float,
    *,
    rank: int,
    scope: str,
    detail: dict[str, Any],
) -> None:
    """A counter that must stay flat (ECC and XID errors, out-of-memory errors): critical as
    soon as it rose since the last sample, with ``detail``; its value is the rise."""
    rose = rise > 0
    out.add(
        name,
        metric,
        step,
        rise,
        1.0 if rose else 0.0,
        rank=rank,
        scope=scope,
        severity=CRITICAL if rose else None,
        expected=0.0,
        upper=0.0,
        detail=detail if rose else None,
    )


def concat(parts: list[Signals]) -> Signals:
    """Signals of one detector and metric, one after the other."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    ranks = [p.rank for p in parts]
    rank: int | np.ndarray = first.rank
    if not all(isinstance(r, int) and r == first.rank for r in ranks):
        rank = np.concatenate(
            [np.full(len(p), p.rank) if isinstance(p.rank, int) else p.rank for p in parts]
        )
    scope: str | list[str] = first.scope
    if not all(p.scope == first.scope for p in parts):
        scope = [p.scope_at(k) for p in parts for k in range(len(p))]
    detail = None
    if any(p.detail is not None for p in parts):
        detail = [d for p in parts for d in (p.detail or [None] * len(p))]
    cat = np.concatenate
    return Signals(
        first.name,
        first.metric,
        cat([p.row for p in parts]),
        cat([p.step for p in parts]),
        cat([p.value for p in parts]),
        cat([p.score for p in parts]),
        cat([p.severity for p in parts]),
        cat([p.expected for p in parts]),
        cat([p.lower for p in parts]),
        cat([p.upper for p in parts]),
        rank,
        scope,
        detail,
    )


def row_views(batch: list[Signals], i: int) -> list[Signal]:
    """Batch row ``i``'s signals as rows, in order (each ``Signals`` in turn)."""
    out: list[Signal] = []
    for s in batch:
        got = s.at_row(i)
        if got:
            out += s.views(got)
    return out


def flatten(batch: list[Signals]) -> list[Signal]:
    """Every signal of a batch as rows, row after row (for tests and evidence)."""
    n = max((int(s.row[-1]) + 1 for s in batch if len(s)), default=0)
    return [sig for i in range(n) for sig in row_views(batch, i)]


def last_steps(batch: list[Signals], n: int) -> np.ndarray:
    """Each of the ``n`` rows' step of its last signal (``NO_STEP``: none, or no signal)."""
    last = np.full(n, NO_STEP, dtype=np.int64)
    for s in batch:  # in order: a row's last Signals sets it last
        k = len(s)
        if k == 1 or (k and s.row[0] == s.row[-1]):
            last[s.row[-1]] = s.step[-1]
        elif k:
            ends = np.flatnonzero(np.append(s.row[1:] != s.row[:-1], True))  # each row's last
            last[s.row[ends]] = s.step[ends]
    return last


@dataclass(slots=True)
class Column:
    """One metric's new finite values of one rank, in order, as a series detector takes them
    (a record's value is a column of one)."""

    xs: np.ndarray  # float64: the values learnt
    steps: np.ndarray  # int64 (``NO_STEP``: none)
    rows: np.ndarray  # int64: each value's batch row
    rank: int = RUN_RANK
    probes: np.ndarray | None = None  # the values scored where not ``xs`` (a window's peak)
    firsts: np.ndarray | None = None  # a window's first step (its values are means over it)
    # fits a model at once from the values it is asked for on (ARIMA); None: ``asked`` is set
    fitter: Callable[[np.ndarray], Any] | None = None
    asked: bool = False  # a model was asked for and not fitted (the caller queues the fit)
    # a window's own standard deviation of its steps' values (NaN: not sent) and how many
    # values it aggregates; None for step rows (one value each)
    spreads: np.ndarray | None = None
    counts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.xs)


@dataclass(slots=True)
class Run:
    """What a record's detectors may read of their run besides their own state."""

    train_loss: float | None = None  # EMA of the training loss (all ranks)
    last_step_ns: int = 0  # time of the latest step record
    last_step: int = -1  # the largest step of any rank (-1: none yet)
    unfollowed: int = 0  # rows of ranks past ``series_ranks``: no series of their own
    # the shard of a wide run that the detector holds (``run_keys``); one past the first pages
    # nothing that is the whole run's
    shard: int = 0

    def track_loss(self, xs: np.ndarray, alpha: float) -> None:
        """The training loss's EMA over finite values ``xs``, for the train/validation gap."""
        ema = self.train_loss
        for x in xs.tolist():
            ema = x if ema is None else (1 - alpha) * ema + alpha * x
        self.train_loss = ema


@dataclass(slots=True)
class Alert:
    """An alert transition: ``state`` is "firing" once, then "resolved" once. ``time_ns`` is
    the time of the record it fired on (a replay carries it unchanged)."""

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
    time_ns: int = 0


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


def finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
