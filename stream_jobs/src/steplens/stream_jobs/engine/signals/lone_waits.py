"""One rank waiting for its data while the other ranks do not: a straggler that waits on data.

Every rank's share of a step spent waiting for data is judged against its line
(``thresholds.data_wait``). In a run of several ranks, a rank over the line while the others'
shares of the same steps are low is not the run's input pipeline: it is that rank's, and the
others wait for it at their collectives (their step time rises with its, their data wait does
not). Its breach is then a straggler, ``straggler:data_wait_share``, that names the rank and
says it waits on data, in place of the data wait's warning. When most ranks wait (a slow
shared store) the breach stays the run's data wait.

The others' records of its steps may come after its own (a rank sends its steps that stand
out at once, the others' windows of the same steps come up to a window later): a warning is
held (sent as a note) until records of at least half of the other ranks (of the first
``SAMPLE`` known) reach its step, and then judged; if they do not within ``hold_s`` seconds of
the run's records (a rank that stopped sending), it is the data wait's warning after all. A run
of one rank, or whose other ranks send no data wait, is judged as before, with no delay. A
warning of a window keeps the window's first step (``span_first``) when it is released on
another rank's record: it is an aggregate of its span, which adds to an incident it covers."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.core import INFO_SEV, WARN_SEV, Signals

SAMPLE = 64  # other ranks whose shares are compared (the first known; a median needs few)
MAX_HELD = 64  # warnings held per rank (the oldest dropped past it: the event is still held)
LONE = 0.5  # the others' median share, at most this share of the line: they do not wait


@dataclass
class LoneWaits:
    # rank -> (step, share) of its latest row
    latest: dict[int, tuple[int, float]] = field(default_factory=dict)
    # rank -> its warnings held for the others' records: (step, share, score, time_ns, the
    # first step of its window or -1), oldest first
    held: dict[int, list[tuple[int, float, float, int, int]]] = field(default_factory=dict)
    clock_ns: int = 0  # the latest time of a row judged (the run's records' clock)


def judge(  # noqa: PLR0917
    state: LoneWaits,
    waits: Signals,
    rank: int,
    row: int,
    times_ns: Sequence[int],
    hold_s: float,
    spans: Sequence[int] | None = None,
) -> list[Signals]:
    """``waits``: one rank's data wait signals (``thresholds.data_wait``) of a batch whose rows
    were taken at ``times_ns`` (``spans``: the first step each covers, for windows), changed in
    place: its warnings judged against the other ranks' shares. Returns the straggler signals
    (a warning judged at once on its own row) and the held warnings released (on batch
    ``row``, each of its own rank), then ``waits``."""
    limit = float(waits.upper[0]) if len(waits) else math.nan
    steps = waits.step
    top = int(np.argmax(steps))
    state.latest[rank] = (int(steps[top]), float(waits.value[top]))
    if times_ns:
        state.clock_ns = max(state.clock_ns, *times_ns)
    if len(state.latest) < 2:
        return [waits]
    # row, rank, step, share, score, span (and the others' median share, for a lone one)
    lone: list[tuple[int, int, int, float, float, int, float]] = []
    shared: list[tuple[int, int, int, float, float, int]] = []
    for k in np.flatnonzero(waits.severity == WARN_SEV).tolist():
        step = int(steps[k])
        others = _others(state, rank, step)
        span = -1 if spans is None else int(spans[int(waits.row[k])])
        waits.severity[k] = INFO_SEV  # a note until judged, a straggler or released below
        if others is None:
            at = times_ns[int(waits.row[k])] if times_ns else state.clock_ns
            held = state.held.setdefault(rank, [])
            held.append((step, float(waits.value[k]), float(waits.score[k]), at, span))
            del held[:-MAX_HELD]
        elif others <= LONE * limit:
            got = (int(waits.row[k]), rank, step, float(waits.value[k]), float(waits.score[k]))
            lone.append((*got, span, others))
        else:
            waits.severity[k] = WARN_SEV
    for q in list(state.held):
        _release(state, q, row, int(hold_s * 1e9), limit, lone, shared)
    out: list[Signals] = []
    if lone:
        rows, r, s, v, sc, sp, exp = zip(*sorted(lone), strict=True)
        detail: list[dict[str, Any] | None] = [
            {"rank": q, "waits_on": "data", **_span(f)} for q, f in zip(r, sp, strict=True)
        ]
        out.append(_warnings("straggler", rows, r, s, v, sc, list(exp), limit, detail))
    if shared:
        rows, r, s, v, sc, sp = zip(*sorted(shared), strict=True)
        spanned: list[dict[str, Any] | None] = [_span(f) or None for f in sp]
        out.append(_warnings("threshold", rows, r, s, v, sc, limit, limit, spanned))
    out.append(waits)
    return out


def _span(first: int) -> dict[str, int]:
    """A window's warning's evidence of its span (none for a step's)."""
    return {"span_first": first} if first >= 0 else {}


def _warnings(  # noqa: PLR0917
    name: str,
    rows: tuple[int, ...],
    ranks: tuple[int, ...],
    steps: tuple[int, ...],
    shares: tuple[float, ...],
    scores: tuple[float, ...],
    expected: float | list[float],
    limit: float,
    detail: list[dict[str, Any] | None] | None = None,
) -> Signals:
    """``<name>:data_wait_share`` warnings, each of its own rank."""
    return Signals.of(
        name,
        "data_wait_share",
        list(rows),
        np.array(steps, dtype=np.int64),
        list(shares),
        list(scores),
        WARN_SEV,
        expected,
        None,
        limit,
        np.array(ranks, dtype=np.int64),
        [f"rank:{q}" for q in ranks],
        detail,
    )


def _release(  # noqa: PLR0917
    state: LoneWaits,
    rank: int,
    row: int,
    hold_ns: int,
    limit: float,
    lone: list[tuple[int, int, int, float, float, int, float]],
    shared: list[tuple[int, int, int, float, float, int]],
) -> None:
    """Judge ``rank``'s held warnings whose steps the others' records reached; release the
    ones held ``hold_ns`` of the run's clock as the data wait's."""
    held = state.held[rank]
    keep = []
    for entry in held:
        step, share, score, at = entry[:4]
        span = entry[4] if len(entry) > 4 else -1  # held before spans: none
        others = _others(state, rank, step)
        if others is not None and others <= LONE * limit:
            lone.append((row, rank, step, share, score, span, others))
        elif others is not None or state.clock_ns - at >= hold_ns:
            shared.append((row, rank, step, share, score, span))
        else:
            keep.append((step, share, score, at, span))
    if keep:
        state.held[rank] = keep
    else:
        del state.held[rank]


def _others(state: LoneWaits, rank: int, step: int) -> float | None:
    """The median share of the other ranks whose latest row reached ``step`` (of the first
    ``SAMPLE`` others), once at least half of them did; None before."""
    seen = 0
    reached = []
    for q, (at, share) in state.latest.items():
        if q == rank:
            continue
        seen += 1
        if at >= step:
            reached.append(share)
        if seen >= SAMPLE:
            break
    if not reached or 2 * len(reached) < seen:
        return None
    return statistics.median(reached)
