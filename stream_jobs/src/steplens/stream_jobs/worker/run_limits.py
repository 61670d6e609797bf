"""Bounds on what producers' input makes a worker keep: runs, and ranks of a run.

* **Runs.** A worker keeps at most ``max_runs`` runs (those of its by-run partitions, in its
  table or in memory). A message of a run it does not keep, past that, is not scored: it is
  acknowledged and counted, and a warning names the run, at most once a minute (its records
  are still stored by the sinks, which read the raw topic themselves).
* **Idle runs.** A run with no record scored for ``idle_s`` is retired: its state leaves the
  table (a tombstone in the changelog) and memory. If it comes back it is warmed from its
  history like a run this worker never saw. The retirement happens where table writes may: a
  sweep sends the run an empty by-run message (``compat.NUDGE``), and the detect agent retires it
  when that message comes and the run is still idle, holds no messages and loads nothing.
* **Ranks.** A run scores at most ``max_ranks`` ranks; a record of a further rank is a dead
  letter that names the limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from steplens.schema import RUN_RANK
from steplens.stream_jobs.engine.state import RANK_SEP
from steplens.stream_jobs.worker.settings import LimitSettings

log = logging.getLogger("steplens.stream_jobs")

WARN_EVERY_S = 60.0  # a refused run is named in a warning at most this often
SWEEP_MAX = 1000  # retirement nudges sent by one sweep at most


class RunLimits:
    """Which runs a worker keeps (``known``: those whose state its table holds, or will at the
    next checkpoint) and when each last had a record scored."""

    def __init__(
        self,
        settings: LimitSettings,
        table_keys: Callable[[], Iterable[bytes]],
        count: Callable[[str, int], None] = lambda outcome, n: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.s = settings
        self.table_keys = table_keys
        self.count = count  # (outcome, n): refused_messages, retired_runs, refused_records
        self.clock = clock
        self._known: set[str] | None = None  # read from the table at first use
        self.seen: dict[str, float] = {}
        self.warned_at: float | None = None  # refusals are logged at most every WARN_EVERY_S
        self.unwarned = 0

    @property
    def known(self) -> set[str]:
        if self._known is None:  # a run's head is under its id, its ranks' keys hold RANK_SEP
            sep = RANK_SEP.encode()
            self._known = {k.decode() for k in self.table_keys() if sep not in k}
        return self._known

    def admits(self, run: str) -> bool:
        """Whether a message of ``run`` is scored: a run kept, or room for one more."""
        known = self.known
        if run in known or len(known) < self.s.max_runs:
            known.add(run)
            self.seen[run] = self.clock()
            return True
        self.count("refused_messages", 1)
        self.unwarned += 1
        now = self.clock()
        if self.warned_at is None or now - self.warned_at >= WARN_EVERY_S:
            log.warning(
                "run %s is not scored: this worker keeps %d runs (--max-runs); its records "
                "are still stored (%d messages of runs past the limit since the last warning)",
                run,
                self.s.max_runs,
                self.unwarned,
            )
            self.warned_at, self.unwarned = now, 0
        return False

    def idle(self, run: str) -> bool:
        """No record of ``run`` scored for ``idle_s`` (a run first met in the table counts
        from then)."""
        now = self.clock()
        return now - self.seen.setdefault(run, now) >= self.s.idle_s

    def idle_runs(self, busy: Callable[[str], bool]) -> list[str]:
        """Kept runs to retire (at most ``SWEEP_MAX``), leaving out those ``busy`` says hold
        messages or load their history."""
        out: list[str] = []
        for run in self.known:
            if len(out) >= SWEEP_MAX:
                break
            if self.idle(run) and not busy(run):
                out.append(run)
        return out

    def retired(self, run: str) -> None:
        self.known.discard(run)
        self.seen.pop(run, None)
        self.count("retired_runs", 1)

    def forget(self) -> None:
        """The partitions moved: read the kept runs from the table again at next use."""
        self._known = None
        self.seen.clear()


def rank_admitted(
    series: dict[int, Any], rank: int, max_ranks: int, pending: int | None = None
) -> bool:
    """Whether a record of ``rank`` is scored by a run whose ranks are ``series``' keys and
    ``pending`` (a rank admitted, its records not scored yet)."""
    if rank in series or rank in (RUN_RANK, pending):
        return True
    extra = pending is not None and pending != RUN_RANK and pending not in series
    return len(series) - (RUN_RANK in series) + extra < max_ranks
