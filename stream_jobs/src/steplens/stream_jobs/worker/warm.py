"""Warm starts: a run's history replayed through its detectors, alerting off.

``replay`` feeds each rank's effective history (``history``) to
``RunDetector.process_columns``, the code live records go through, and drops the signals: the
rules and incidents never see them. Every state, the calibrations included, is then what a
detector that never stopped would have after those values (bounded by the cap: a rank's newest
``max_points`` rows). ARIMA models are fitted as the values ask for them (``fit_inline``).

The ranks are replayed side by side, ``CHUNK`` rows of each in turn, so the cross-rank state
(stragglers) sees their steps together as it did live. Afterwards no straggler judgement of a
history step is left pending, and each replayed rank's last progress is the warm start's time
(a history hours old is no hang).

``warm_job`` is what the worker runs in its history process: read, replay, and return the
state as ``state``'s plain data, from which the worker builds the run's detector.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.config import DetectorConfig
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.history import (
    NO_FIRST,
    History,
    HistorySettings,
    Rows,
    read_history,
)
from steplens.stream_jobs.engine.signals import lr_schedule
from steplens.stream_jobs.worker.history_source import Source

CHUNK = 256  # rows of one rank replayed before the next rank's
# the signals of a warmed rank say so for this many of its values: by then the detectors'
# windows (spike 64, volatility 50, ARIMA's fit window 256) hold live values only
MARK_VALUES = 256


def replay(det: RunDetector, hist: History, now_ns: int) -> None:
    """Feed ``hist``'s rows to ``det`` (its signals dropped), then settle the run's clock."""
    meta = hist.meta
    if meta.get("lr_schedule") is not None and det.schedule is None:
        # one refused live as well (a dead letter): the run goes on without one
        with contextlib.suppress(ValueError):
            det.schedule = lr_schedule.check_schedule(meta["lr_schedule"])
    world = meta.get("world_size")
    if isinstance(world, (int, float)) and math.isfinite(world):
        det.ranks.world_size = max(det.ranks.world_size, int(world))
    done = dict.fromkeys(hist.rows, 0)
    while done:
        for rank, rows in hist.rows.items():
            a = done.get(rank)
            if a is None:
                continue
            b = min(a + CHUNK, len(rows))
            _feed(det, rank, rows, a, b)
            if b >= len(rows):
                del done[rank]
            else:
                done[rank] = b
    state = det.ranks
    state.pending.clear()
    for rank in hist.rows:
        state.progress_ns[rank] = now_ns
    det.records = 0


def _feed(det: RunDetector, rank: int, rows: Rows, a: int, b: int) -> None:
    """Rows ``a:b`` of a rank: each stretch of step rows, and of windows, as one batch."""
    kinds = rows.first[a:b] == NO_FIRST
    cuts = np.flatnonzero(kinds[1:] != kinds[:-1]) + 1 + a
    for lo, hi in zip([a, *cuts.tolist()], [*cuts.tolist(), b], strict=True):
        columns = {m: v[lo:hi] for m, v in rows.values.items() if not np.isnan(v[lo:hi]).all()}
        windows = rows.first[lo] != NO_FIRST
        det.process_columns(
            rank,
            rows.step[lo:hi].tolist(),
            rows.time_ns[lo:hi].tolist(),
            columns,
            firsts=rows.first[lo:hi].tolist() if windows else None,
        )


@dataclass(frozen=True)
class WarmJob:
    """A warm start to run in the history process: the whole run (``ranks`` None), or a
    restart's re-seed of ``ranks`` at the step they resume at (``cuts``)."""

    run: str
    cfg: DetectorConfig
    settings: HistorySettings
    until_ns: int
    meta: dict[str, Any] | None = None  # the live run_meta's fields (None: the stored one)
    cuts: dict[int, int] = field(default_factory=dict)
    ranks: tuple[int, ...] | None = None


@dataclass
class WarmResult:
    head: bytes  # ``state.dump_state``'s values
    ranks: dict[int, bytes]
    points: dict[int, int]  # rank -> rows replayed
    runs: list[str]  # the runs read, the reference first
    read: int  # rows read from the stores
    queries: int
    read_s: float
    replay_s: float


def warm_job(job: WarmJob, source: Any = None) -> WarmResult:
    """Read the run's history (``source``, else the stores of the environment) and replay
    it; the state as plain data."""
    from steplens.stream_jobs.engine.state import dump_state

    t0 = time.perf_counter()
    hist = read_history(
        source or Source.from_env(),
        job.run,
        until_ns=job.until_ns,
        settings=job.settings,
        cfg=job.cfg,
        meta=job.meta,
        cuts=job.cuts,
        ranks=job.ranks,
    )
    t1 = time.perf_counter()
    det = RunDetector(job.run, job.cfg, fit_inline=True)
    replay(det, hist, job.until_ns)
    head, ranks = dump_state(det, det.series)
    return WarmResult(
        head,
        ranks,
        {rank: len(rows) for rank, rows in hist.rows.items()},
        hist.runs,
        hist.read,
        hist.queries,
        t1 - t0,
        time.perf_counter() - t1,
    )


def warm_up() -> None:
    """The history process's imports and compiled loops, before the first run needs them."""
    import steplens.sinks.query  # noqa: F401
    from steplens.stream_jobs.engine.signals import arima, kernels

    kernels.warm_up()
    arima.warm_up()
