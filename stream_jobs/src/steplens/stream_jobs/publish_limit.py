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
from dataclasses import dataclass, field

from steplens.stream_jobs.core import Signal, SignalRun


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
        scores, severities, steps = sigs.scores, sigs.severities, sigs.steps
        out = [k for k, sev in enumerate(severities) if sev is not None or scores[k] >= 0.5]
        if self.every <= 0 or len(out) == len(scores):
            return out
        key = (run, sigs.rank, sigs.name, sigs.metric)
        prev = self.last.get(key)
        quiet: list[int] = []
        for k, step in enumerate(steps):
            if step is None or severities[k] is not None or scores[k] >= 0.5:
                continue
            if prev is not None:
                if now < prev[2]:
                    break  # the clock does not move within the run: no later one either
                if prev[0] <= step < prev[0] + prev[1]:
                    continue
            prev = self._after(key, step, now, prev is None)
            quiet.append(k)
        return sorted(out + quiet) if quiet else out


def _phase(key: tuple[str, int, str, str]) -> float:
    """A series' fixed fraction in (0, 1]: the same on every worker and after a restart."""
    run, rank, name, metric = key
    return (zlib.crc32(f"{run}|{rank}|{name}|{metric}".encode()) % 1024 + 1) / 1024
