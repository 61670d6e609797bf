"""A table recovery that stops moving is started again.

After each rebalance Faust reads a worker's newly active table partitions from their changelog
before the worker scores anything. In busy runs of the group test about one takeover in eight
read nothing at all from the changelog while it was watched (60 s and more), every thread
idle, so a killed worker's runs never moved; started over, the same recovery read everything
within a second. Faust starts its recovery over when another rebalance comes during one
(``signal_recovery_start``); ``RecoveryWatch`` does the same when no active changelog offset
has moved for ``stall_s`` while some are still short of their highwater (checked every
second). A recovery that reads, however slowly, is left alone.
"""

from __future__ import annotations

from typing import Any

# seconds without a changelog offset moving before the recovery starts over: a recovery reads
# its changelog in milliseconds here, and starting over keeps the offsets already read
STALL_S = 3.0


class RecoveryWatch:
    """Watches ``recovery`` (Faust's ``app.tables.recovery``); ``check`` is called now and
    then (a timer) and returns True when it started the recovery over."""

    def __init__(self, recovery: Any, stall_s: float = STALL_S) -> None:
        self.recovery = recovery
        self.stall_s = stall_s
        self.restarts = 0
        self._mark: tuple[float, tuple[tuple[Any, int], ...]] | None = None

    def check(self, now_s: float) -> bool:
        rec = self.recovery
        if not rec.in_recovery or not rec.need_recovery():
            self._mark = None
            return False
        offsets = tuple(sorted(rec.active_offsets.items()))
        if self._mark is None or self._mark[1] != offsets:
            self._mark = (now_s, offsets)  # moved (or first seen): the clock starts again
            return False
        if now_s - self._mark[0] < self.stall_s:
            return False
        self._mark = None
        self.restarts += 1
        rec.signal_recovery_start.set()  # as a rebalance during the recovery would
        return True
