"""Which quiet signals the worker publishes: breaches and events always, the rest thinned out.

A quiet signal (no severity, score below the alert threshold) carries the detector's score for
dashboards; publishing every one would cost more than detecting it. One goes out per run, rank
and rule when both ``every`` steps and ``interval_s`` seconds have passed since the last one, so
a series sent as 100-step windows is not published at every window either. A series' first wait
is a fixed fraction of both, from a hash of its key: the series of a run start together (every
rank at once) and would otherwise come due in the same second each interval, thousands of sends
at once that stall the worker's producer.

A run wider than ``width_ranks`` has its ranks' quiet series spread further: each waits
``width / width_ranks`` times both limits, first wait included, so a run sends about as many
quiet signals as one of ``width_ranks`` ranks, however wide. The InfluxDB sink keeps the series
of about that many ranks of a run (``rank_budget``, 256 first come and the ranks alerts name);
at 16,384 ranks the quiet scores of the others were 500 sends a second, kept only in S3.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from steplens.stream_jobs.engine.core import NO_STEP, Signal, Signals
from steplens.stream_jobs.engine.signals import dynamic_baseline, lengths

# signals that are records for the board (an lr decay, a window's length histogram: not
# judgements; a series' minute against its 7-day band: one a minute already): every one is
# published
EVENTS = frozenset({"lr_event", lengths.NAME, dynamic_baseline.NAME})


@dataclass
class QuietLimiter:
    every: int = 50  # steps; <= 0: quiet signals are never published
    interval_s: float = 5.0
    max_keys: int = 100_000  # bounded memory: forget everything past this many series
    width_ranks: int = 256  # a wider run's quiet series wait width / width_ranks times longer
    # series -> (step of its last quiet signal, steps to wait after it, time it may go again)
    last: dict[tuple[str, int, str, str], tuple[int, int, float]] = field(default_factory=dict)

    def _after(
        self, key: tuple[str, int, str, str], step: int, now: float, f: float
    ) -> tuple[int, int, float]:
        """Record a quiet signal of ``key`` published (or, first in a wide run, due) at
        ``step``, the next one ``f`` times the limits later; returns what it records."""
        if len(self.last) >= self.max_keys:
            self.last.clear()
        got = self.last[key] = (step, max(1, math.ceil(self.every * f)), now + self.interval_s * f)
        return got

    def _spread(self, width: int) -> float:
        return max(1.0, width / self.width_ranks) if self.width_ranks > 0 else 1.0

    def _first(self, key: tuple[str, int, str, str], step: int, now: float, spread: float) -> bool:
        """A series' first quiet signal: published at once in a run of at most ``width_ranks``
        ranks; in a wider one it only sets the series' first wait (every rank starts at once)."""
        self._after(key, step, now, _phase(key) * spread)
        return spread == 1.0

    def wanted(self, run: str, sig: Signal, now: float, width: int = 1) -> bool:
        if sig.severity is not None or sig.score >= 0.5 or sig.name in EVENTS:
            return True
        if self.every <= 0 or sig.step is None:
            return False
        key = (run, sig.rank, sig.name, sig.metric)
        prev = self.last.get(key)
        spread = self._spread(width)
        if prev is None:
            return self._first(key, sig.step, now, spread)
        too_soon = now < prev[2]
        too_close = prev[0] <= sig.step < prev[0] + prev[1]  # a step back: publish
        if too_soon or too_close:
            return False
        self._after(key, sig.step, now, spread)
        return True

    def picked(self, run: str, sigs: Signals, now: float, width: int = 1) -> list[int]:
        """Which of ``sigs`` (one detector's, in order; one clock reading) ``wanted`` would let
        through, asked one after the other (``width``: the run's ranks, ``RunDetector.width``):
        every breach, and the quiet ones the limits allow,
        each rank's series on its own. A rank with nothing loud whose time limit has not passed
        is skipped whole, without reading its signals."""
        if sigs.name in EVENTS:  # an event (an lr decay): every one
            return list(range(len(sigs)))
        loud = sigs.loud()
        any_loud = bool(loud.any())
        out: list[int] = np.flatnonzero(loud).tolist() if any_loud else []
        if self.every <= 0 or len(out) == len(sigs):
            return out
        one_rank = isinstance(sigs.rank, int)
        ranks: list[int] = [int(sigs.rank)] if one_rank else np.unique(sigs.rank).tolist()
        steps = sigs.step
        spread = self._spread(width)
        for rank in ranks:
            key = (run, rank, sigs.name, sigs.metric)
            prev = self.last.get(key)
            if prev is not None and now < prev[2]:
                continue  # the common case: the clock does not move within a batch
            if one_rank:
                flags = loud.tolist() if any_loud else None
                out += self._quiet(key, steps.tolist(), flags, now, spread)
            else:
                at = np.flatnonzero(sigs.rank == rank)
                got = self._quiet(key, steps[at].tolist(), loud[at].tolist(), now, spread)
                out += at[got].tolist() if got else []
        return sorted(out)

    def _quiet(
        self,
        key: tuple[str, int, str, str],
        steps: Sequence[int],
        loud: Sequence[bool] | None,
        now: float,
        spread: float,
    ) -> list[int]:
        """The quiet signals (not ``loud``; None: none is) of one series over consecutive
        steps that the limits let through, recorded as published."""
        prev = self.last.get(key)
        out: list[int] = []
        for k, step in enumerate(steps):
            if step == NO_STEP or (loud is not None and loud[k]):
                continue
            if prev is None:
                if self._first(key, step, now, spread):
                    out.append(k)
                prev = self.last[key]
                continue
            if now < prev[2]:
                break  # the clock does not move within the run: no later one either
            if prev[0] <= step < prev[0] + prev[1]:
                continue
            prev = self._after(key, step, now, spread)
            out.append(k)
        return out


def _phase(key: tuple[str, int, str, str]) -> float:
    """A series' fixed fraction in (0, 1]: the same on every worker and after a restart."""
    run, rank, name, metric = key
    return (zlib.crc32(f"{run}|{rank}|{name}|{metric}".encode()) % 1024 + 1) / 1024
