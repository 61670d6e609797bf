"""A table recovery that reads nothing is started over; one that reads is left alone."""

from __future__ import annotations

import asyncio
from collections import Counter

from steplens.stream_jobs.worker.recovery_watch import RecoveryWatch


class Recovery:
    """What the watch reads of Faust's ``Recovery``: its state, offsets and highwaters."""

    def __init__(self) -> None:
        self.in_recovery = True
        self.active_offsets: Counter[int] = Counter({2: -1, 3: -1})
        self.active_highwaters: Counter[int] = Counter({2: 35, 3: 40})
        self.signal_recovery_start = asyncio.Event()

    def need_recovery(self) -> bool:
        return any(self.active_offsets[tp] < hw for tp, hw in self.active_highwaters.items())


def test_a_recovery_that_reads_nothing_starts_over_once_per_stall() -> None:
    rec = Recovery()
    watch = RecoveryWatch(rec, stall_s=20.0)
    assert not watch.check(0.0)
    assert not watch.check(19.0)
    assert watch.check(21.0) and rec.signal_recovery_start.is_set()
    rec.signal_recovery_start.clear()
    assert not watch.check(25.0)  # the next stall is timed from here
    assert not watch.check(44.0)
    assert watch.check(46.0) and watch.restarts == 2


def test_a_slow_recovery_that_reads_and_a_finished_one_are_left_alone() -> None:
    rec = Recovery()
    watch = RecoveryWatch(rec, stall_s=20.0)
    for t in range(0, 200, 15):  # one record read every 15 s
        rec.active_offsets[2] += 1
        assert not watch.check(float(t))
    rec.active_offsets[2], rec.active_offsets[3] = 35, 40  # caught up
    assert not watch.check(300.0) and not watch.check(400.0)
    rec.in_recovery = False
    assert not watch.check(500.0)
    assert not rec.signal_recovery_start.is_set() and watch.restarts == 0
