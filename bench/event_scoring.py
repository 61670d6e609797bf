"""Detection quality against labelled events: event-level precision, recall, F1 and delay.

An *event* is a labelled stretch of rows ``[start, end]`` (inclusive; a point event has
``start == end``). An *onset* is the row where an alert starts firing. An onset at or after an
event's start and at most ``tolerance`` rows after its end belongs to that event (to each of
overlapping ones: one incident seen in two metrics, labelled twice); an event is detected when
at least one onset belongs to it. No point adjustment: a long event caught once
counts once, and every onset outside every event is a false alarm.

* recall = detected events / events
* precision = onsets that belong to some event / onsets
* F1 = their harmonic mean (0 when both are 0)
* delay = rows from an event's start to its first onset (detected events only)

``average_precision`` is the threshold-free view of a per-row score against per-row labels
(scikit-learn's definition: the precision at each threshold weighted by the recall it adds).
A score that ranks rows no better than chance scores the share of anomalous rows.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Quality:
    events: int
    detected: int
    onsets: int
    true_onsets: int
    delays: tuple[int, ...]  # per detected event, in rows

    @property
    def recall(self) -> float:
        return self.detected / self.events if self.events else math.nan

    @property
    def precision(self) -> float:
        return self.true_onsets / self.onsets if self.onsets else math.nan

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        p = 0.0 if math.isnan(p) else p
        r = 0.0 if math.isnan(r) else r
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    @property
    def median_delay(self) -> float:
        return float(statistics.median(self.delays)) if self.delays else math.nan

    def __add__(self, other: Quality) -> Quality:
        return Quality(
            self.events + other.events,
            self.detected + other.detected,
            self.onsets + other.onsets,
            self.true_onsets + other.true_onsets,
            self.delays + other.delays,
        )


NO_QUALITY = Quality(0, 0, 0, 0, ())


def events_of(labels: Sequence[int | bool]) -> list[tuple[int, int]]:
    """The maximal runs of true labels as ``(first row, last row)``."""
    out: list[tuple[int, int]] = []
    start = -1
    for i, v in enumerate(labels):
        if v and start < 0:
            start = i
        elif not v and start >= 0:
            out.append((start, i - 1))
            start = -1
    if start >= 0:
        out.append((start, len(labels) - 1))
    return out


def onsets_of(firing: Sequence[int | bool]) -> list[int]:
    """The rows where a per-row "an alert is firing" flag turns on."""
    return [i for i, v in enumerate(firing) if v and (i == 0 or not firing[i - 1])]


def score(
    events: Iterable[tuple[int, int]], onsets: Iterable[int], tolerance: int = 0, before: int = 0
) -> Quality:
    """Match ``onsets`` (rows) to ``events`` (inclusive row ranges) as the module says;
    ``before``: an onset up to this many rows before an event's start belongs to it too (an
    onset labelled from a log, known to a few rows)."""
    evs = sorted((s - before, e) for s, e in events)
    ons = sorted(onsets)
    first: list[int | None] = [None] * len(evs)
    true_onsets = 0
    starts = [s for s, _ in evs]
    reach = max((e - s for s, e in evs), default=0) + tolerance  # the widest window
    for t in ons:
        # the events whose window holds t (no event starting before t - reach can hold it)
        lo = bisect.bisect_left(starts, t - reach)
        hi = bisect.bisect_right(starts, t)
        held = [k for k in range(lo, hi) if t <= evs[k][1] + tolerance]
        true_onsets += bool(held)
        for k in held:
            if first[k] is None:
                first[k] = t
    delays = tuple(f - evs[k][0] - before for k, f in enumerate(first) if f is not None)
    return Quality(len(evs), len(delays), len(ons), true_onsets, delays)


def average_precision(scores: Sequence[float], labels: Sequence[int | bool]) -> float:
    """Average precision of ``scores`` ranking the rows with true ``labels`` first (ties share
    one threshold; NaN scores rank last)."""
    s = np.nan_to_num(np.asarray(scores, dtype=float), nan=-np.inf)
    y = np.asarray(labels, dtype=bool)
    positives = int(y.sum())
    if positives == 0:
        return math.nan
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    tp = np.cumsum(y)
    last = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]  # the last row of each distinct score
    tp_at = tp[last]
    precision = tp_at / (last + 1)
    recall_gain = np.diff(np.r_[0, tp_at]) / positives
    return float(np.sum(precision * recall_gain))


def false_onsets(
    events: Iterable[tuple[int, int]], onsets: Iterable[int], tolerance: int = 0, before: int = 0
) -> list[int]:
    """The ``onsets`` that belong to no event (the false alarms of ``score``)."""
    windows = sorted((s - before, e + tolerance) for s, e in events)
    starts = [s for s, _ in windows]
    reach = max((e - s for s, e in windows), default=0)
    out = []
    for t in onsets:
        lo = bisect.bisect_left(starts, t - reach)
        hi = bisect.bisect_right(starts, t)
        if not any(windows[k][1] >= t for k in range(lo, hi)):
            out.append(t)
    return out
