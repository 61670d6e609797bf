"""Which quiet signals the worker publishes: breaches always, the rest thinned out.

A quiet signal (no severity, score below the alert threshold) carries the detector's score for
dashboards; publishing every one would cost more than detecting it. One goes out per run, rank
and rule when both ``every`` steps and ``interval_s`` seconds have passed since the last one, so
a series sent as 100-step windows is not published at every window either. A series' first wait
is a fixed fraction of both, from a hash of its key: the series of a run start together (every
rank at once) and would otherwise come due in the same second each interval, thousands of sends
at once that stall the worker's producer.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from steplens.stream_jobs.core import Signal, SignalGrid, SignalRun


@dataclass
class QuietLimiter:
    every: int = 50  # steps; <= 0: quiet signals are never published
    interval_s: float = 5.0
    max_keys: int = 100_000  # bounded memory: forget everything past this many series
    # series -> (step of its last quiet signal, steps to wait after it, time it may go again)
    last: dict[tuple[str, int, str, str], tuple[int, int, float]] = field(default_factory=dict)

    def _after(
        self, key: tuple[str, int, str, str], step: int, now: float, first: bool
    ) -> tuple[int, int, float]:
        """Record a quiet signal of ``key`` published at ``step``; returns what it records."""
        if len(self.last) >= self.max_keys:
            self.last.clear()
        f = _phase(key) if first else 1.0
        got = self.last[key] = (step, max(1, math.ceil(self.every * f)), now + self.interval_s * f)
        return got

    def wanted(self, run: str, sig: Signal, now: float) -> bool:
        if sig.severity is not None or sig.score >= 0.5:
            return True
        if self.every <= 0 or sig.step is None:
            return False
        key = (run, sig.rank, sig.name, sig.metric)
        prev = self.last.get(key)
        if prev is not None:
            too_soon = now < prev[2]
            too_close = prev[0] <= sig.step < prev[0] + prev[1]  # a step back: publish
            if too_soon or too_close:
                return False
        self._after(key, sig.step, now, prev is None)
        return True

    def picked(self, run: str, sigs: SignalRun, now: float) -> list[int]:
        """Which signals of a run of one detector (consecutive steps, one clock reading)
        ``wanted`` would let through, asked one after the other: every breach, and the quiet
        ones the limits allow."""
        scores, severities = sigs.scores, sigs.severities
        if severities.count(None) == len(severities) and (not scores or max(scores) < 0.5):
            loud = None  # the common case: nothing loud
            out: list[int] = []
        else:
            loud = [sev is not None or scores[k] >= 0.5 for k, sev in enumerate(severities)]
            out = [k for k, is_loud in enumerate(loud) if is_loud]
        if self.every <= 0 or len(out) == len(scores):
            return out
        quiet = self._quiet((run, sigs.rank, sigs.name, sigs.metric), sigs.steps, loud, now)
        return sorted(out + quiet) if quiet else out

    def picked_grid(self, run: str, grid: SignalGrid, now: float) -> list[Signal]:
        """The signals of a grid (steps x ranks) that ``wanted`` would let through, asked one
        after the other (each rank's series in step order): every breach, and the quiet ones
        the limits allow. A rank with no breach whose time limit has not passed is skipped
        whole, without building its signals."""
        loud = grid.breach | (grid.scores >= 0.5)
        loud_ranks: list[bool] = np.any(loud, axis=0).tolist()
        out: list[Signal] = []
        for k, rank in enumerate(grid.ranks):
            key = (run, rank, grid.name, grid.metric)
            prev = self.last.get(key)
            if not loud_ranks[k] and (self.every <= 0 or (prev is not None and now < prev[2])):
                continue  # the common case
            column: list[bool] = loud[:, k].tolist()
            picks = [j for j, is_loud in enumerate(column) if is_loud]
            if self.every > 0:
                picks = sorted(picks + self._quiet(key, grid.steps, column, now))
            out += [grid.signal(j, k) for j in picks]
        return out

    def _quiet(
        self,
        key: tuple[str, int, str, str],
        steps: Sequence[int | None],
        loud: Sequence[bool] | None,
        now: float,
    ) -> list[int]:
        """The quiet signals (not ``loud``; None: none is) of one series over consecutive
        steps that the limits let through, recorded as published."""
        prev = self.last.get(key)
        out: list[int] = []
        for k, step in enumerate(steps):
            if step is None or (loud is not None and loud[k]):
                continue
            if prev is not None:
                if now < prev[2]:
                    break  # the clock does not move within the run: no later one either
                if prev[0] <= step < prev[0] + prev[1]:
                    continue
            prev = self._after(key, step, now, prev is None)
            out.append(k)
        return out


def _phase(key: tuple[str, int, str, str]) -> float:
    """A series' fixed fraction in (0, 1]: the same on every worker and after a restart."""
    run, rank, name, metric = key
    return (zlib.crc32(f"{run}|{rank}|{name}|{metric}".encode()) % 1024 + 1) / 1024
