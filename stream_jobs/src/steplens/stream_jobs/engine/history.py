"""A run's history from the stores: what its detectors would have seen, for a warm start.

Per rank, the rows the detectors score live, oldest first: step records (every step at full
resolution, the raw samples in windowed mode) with the step fields the series detectors read,
and step windows (each metric's mean, with the window's first and last step). Read from S3
(every record) and InfluxDB's hot bucket (the last hour, which S3 may not have yet),
stitched by ``steplens.sinks``' query code; older than the first record the worker scores
live (``until_ns``) and newer than ``days``. Where neither has a span (S3 unreachable, or not
configured), the rollup bucket's minutes stand for it as windows (``<field>_mean`` over
``step_min``..``step_max``).

Bounded: the stores say first where the run's rows begin and end (``extent``: nothing to
read for a run they have never seen); they are then read newest first in spans of time
growing 4x from 15 minutes, until every rank has ``max_points`` rows or 4x that was read,
or ``days`` are covered; each rank keeps its newest ``max_points`` rows.

The effective history (``lineage``): a run restarted from a checkpoint repeats steps, and what
its detectors should know at a step is the surviving line of steps up to it, as if the
abandoned steps after the checkpoint never happened. A row is kept when every later row has a
larger step (a window's step is its last); rows at or past a rank's ``cut`` (the step it
resumes at) are dropped. A reference run (``run_meta.baseline_run``, else
``lineage.parent_run``: a run resumed under a new id, or one to compare with) comes before the
run's own rows, so its rows from the run's first step on give way to the run's own.

Pure: the stores are read through a ``HistorySource`` (``history_source.Source`` for the real
ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

FIRST_SPAN_NS = 15 * 60 * 10**9
DAY_NS = 86_400 * 10**9
READ_FACTOR = 4  # rows read per rank at most, in units of max_points
NO_FIRST = -1  # ``Rows.first`` of a step row (not a window)


class HistoryBounds(Protocol):
    """What a history read is bounded by (the worker's ``HistorySettings``)."""

    @property
    def days(self) -> float: ...

    @property
    def max_points(self) -> int: ...


@dataclass
class Rows:
    """One rank's history, oldest first: each row a step (``first`` ``NO_FIRST``) or a window
    (its first step; ``step`` its last); ``values`` metric -> value per row (NaN: none)."""

    time_ns: np.ndarray
    step: np.ndarray
    first: np.ndarray
    values: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.step)

    def take(self, idx: np.ndarray) -> Rows:
        return Rows(
            self.time_ns[idx],
            self.step[idx],
            self.first[idx],
            {m: v[idx] for m, v in self.values.items()},
        )

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        parts = [p for p in parts if len(p)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            none = np.empty(0, np.int64)
            return Rows(none, none, none, {})
        names = dict.fromkeys(m for p in parts for m in p.values)
        return Rows(
            np.concatenate([p.time_ns for p in parts]),
            np.concatenate([p.step for p in parts]),
            np.concatenate([p.first for p in parts]),
            {
                m: np.concatenate([p.values.get(m, np.full(len(p), math.nan)) for p in parts])
                for m in names
            },
        )


@dataclass
class History:
    rows: dict[int, Rows] = field(default_factory=dict)  # rank -> its effective rows
    meta: dict[str, Any] = field(default_factory=dict)  # the latest run_meta's fields
    runs: list[str] = field(default_factory=list)  # the runs read, the reference first
    read: int = 0  # rows read from the stores (before lineage and the cap)
    queries: int = 0


class HistorySource(Protocol):
    """Where history is read from: ``history_source.Source`` (the stores)."""

    def meta(self, run: str, since_ns: int, until_ns: int) -> dict[str, Any]: ...

    def extent(self, run: str, since_ns: int, until_ns: int) -> tuple[int, int] | None: ...

    def rows(self, run: str, lo: int, hi: int, metrics: list[str]) -> dict[int, Rows]: ...


def reference_of(meta: dict[str, Any]) -> str | None:
    """The run a run_meta names for its baselines: ``baseline_run``, else its lineage's
    ``parent_run``."""
    ref = meta.get("baseline_run")
    if not isinstance(ref, str) or not ref:
        lineage = meta.get("lineage")
        ref = lineage.get("parent_run") if isinstance(lineage, dict) else None
    return ref if isinstance(ref, str) and ref else None


def lineage(steps: np.ndarray, cut: int | None = None) -> np.ndarray:
    """Which rows (in time order) survive: those before ``cut`` that no later row steps back
    to (a later row at the same step replaces one: the step sent again after a restart)."""
    n = len(steps)
    keep = np.ones(n, np.bool_)
    if n > 1:
        later = np.minimum.accumulate(steps[::-1])[::-1]  # the smallest step from each row on
        keep[:-1] = steps[:-1] < later[1:]
    if cut is not None:
        keep &= steps < cut
    return keep


def effective(rows: Rows, cut: int | None, max_points: int) -> Rows:
    """``rows`` (time order) as the detectors should know them: ``lineage``, the newest
    ``max_points``."""
    keep = np.flatnonzero(lineage(rows.step, cut))
    return rows.take(keep[-max_points:])


# --------------------------------------------------------------------------- reading


Reader = Callable[[str, int, int], dict[int, Rows]]  # (run, lo_ns, hi_ns) -> rank -> rows


def read_run(
    read: Reader,
    run: str,
    *,
    since_ns: int,
    until_ns: int,
    max_points: int,
    cuts: dict[int, int] | None = None,
    ranks: Iterable[int] | None = None,
    counts: list[int] | None = None,
) -> dict[int, Rows]:
    """``run``'s rows in [since_ns, until_ns), read newest first by ``read`` in spans growing
    4x, until each rank (of ``ranks``, or every rank seen) has ``max_points`` effective rows,
    or ``READ_FACTOR`` x that many rows per rank were read (a rank that sends rarely does not
    make the others read days). A rank keeps its newest ``READ_FACTOR x max_points`` rows;
    ``counts`` gets [rows read, reads]."""
    cuts = cuts or {}
    only = None if ranks is None else set(ranks)
    limit = READ_FACTOR * max_points
    got: dict[int, Rows] = {}
    total = 0
    hi, span = until_ns, FIRST_SPAN_NS
    while hi > since_ns:
        lo = max(since_ns, hi - span)
        part = read(run, lo, hi)
        n = sum(len(r) for r in part.values())
        total += n
        if counts is not None:
            counts[0] += n
            counts[1] += 1
        for rank, rows in part.items():
            if only is None or rank in only:
                both = Rows.concat([rows, got[rank]]) if rank in got else rows
                got[rank] = both.take(np.arange(max(0, len(both) - limit), len(both)))
        hi, span = lo, span * 4
        enough = all(
            len(rows) >= limit or len(effective(rows, cuts.get(rank), max_points)) >= max_points
            for rank, rows in got.items()
        )
        if got and (enough or total >= limit * len(got)):
            break
    return got


def read_history(
    source: HistorySource,
    run: str,
    *,
    until_ns: int,
    settings: HistoryBounds,
    metrics: list[str],
    meta: dict[str, Any] | None = None,
    cuts: dict[int, int] | None = None,
    ranks: Iterable[int] | None = None,
) -> History:
    """``run``'s effective history per rank, and its reference run's before it when it names
    one (in ``meta``, its live run_meta's fields, else in its stored run_meta). ``metrics``: the
    step fields to read (``DetectorConfig.metrics``)."""
    cuts = cuts or {}
    ranks = None if ranks is None else list(ranks)
    since = until_ns - int(settings.days * DAY_NS)
    counts = [0, 0]
    out = History()
    out.meta = meta if meta is not None else source.meta(run, since, until_ns)
    reference = reference_of(out.meta)

    def one(name: str, until: int) -> dict[int, Rows]:
        stored = source.extent(name, since, until)
        if stored is None:  # nothing stored: no spans to read
            return {}
        got = read_run(
            lambda r, lo, hi: source.rows(r, lo, hi, metrics),
            name,
            since_ns=stored[0],
            until_ns=stored[1],
            max_points=settings.max_points,
            cuts=cuts,
            ranks=ranks,
            counts=counts,
        )
        if got:
            out.runs.append(name)
        return got

    own = one(run, until_ns)
    parts: dict[int, list[Rows]] = {rank: [rows] for rank, rows in own.items()}
    if (
        reference
        and reference != run
        and (  # the run's own rows leave room for its reference's
            not own
            or any(
                len(effective(r, cuts.get(k), settings.max_points)) < settings.max_points
                for k, r in own.items()
            )
        )
    ):
        first = min((int(r.time_ns[0]) for r in own.values() if len(r)), default=until_ns)
        ref = one(reference, first)
        if not out.meta.get("lr_schedule"):
            out.meta = {**source.meta(reference, since, first), **out.meta}
        for rank, rows in ref.items():
            parts.setdefault(rank, []).insert(0, rows)
        out.runs.reverse()
    for rank, ps in parts.items():
        rows = effective(Rows.concat(ps), cuts.get(rank), settings.max_points)
        if len(rows):
            out.rows[rank] = rows
    out.read, out.queries = counts
    return out
