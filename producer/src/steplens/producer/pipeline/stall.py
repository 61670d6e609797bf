"""A rank that stopped stepping while its process lives: noticed by the producer's own worker
thread, which then sends the Python stacks of every thread of the process (one ``stacks``
record per stall).

A stall is ``after_s`` seconds without a ``log_step`` since the last one; by default
``max(60 s, 20 x the median interval of the last 64 steps)``, well above a usual step, an
evaluation or a checkpoint of most jobs. One record per stall: the next one only after steps
resumed and stopped again. Nothing is judged before the first step (loading a model is no
stall). The stacks are ``sys._current_frames()`` (documented in the standard library) formatted
by ``traceback``, innermost frames kept when one is longer than a record's string allows.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections import deque
from typing import Any

from steplens.schema import MAX_STR_LEN

FLOOR_S = 60.0  # the automatic threshold is never below this ...
FACTOR = 20.0  # ... nor below this many median step intervals
PAUSE_FLOOR_S = 2.0  # steps have paused after this long without one ...
PAUSE_FACTOR = 3.0  # ... and this many median step intervals (``paused``)
MAX_THREADS = 64  # threads in one record (a record stays far below its size limit)


class StallWatch:
    """``after_s``: None for the automatic threshold, 0 for never, else seconds."""

    def __init__(self, after_s: float | None) -> None:
        self.after_s = after_s
        self.last_ns: int | None = None  # monotonic time of the last step
        self.last_step: int | None = None
        self.dumped = False  # this stall's stacks were sent
        self.intervals: deque[int] = deque(maxlen=64)

    def on_step(self, step: Any, t_ns: int) -> None:
        last = self.last_ns
        if last is not None and t_ns > last:
            self.intervals.append(t_ns - last)
        self.last_ns, self.dumped = t_ns, False
        if type(step) is int:
            self.last_step = step

    def median_s(self) -> float:
        """The median interval of the last steps (0 before two)."""
        intervals = sorted(self.intervals)
        return intervals[len(intervals) // 2] / 1e9 if intervals else 0.0

    def threshold_s(self) -> float:
        if self.after_s is not None:
            return self.after_s
        if not self.intervals:
            return FLOOR_S
        return max(FLOOR_S, FACTOR * self.median_s())

    def paused(self, now_ns: int) -> bool:
        """Whether steps have paused (none for ``PAUSE_FACTOR`` median intervals, at least
        ``PAUSE_FLOOR_S``); False before the first step. Read from the hardware sampler's
        thread: its node samples are all sent then, the ticks the stream jobs judge a hang by."""
        last = self.last_ns
        if last is None:
            return False
        try:
            median = self.median_s()
        except RuntimeError:  # appended to while read: the next sample asks again
            return False
        return (now_ns - last) / 1e9 > max(PAUSE_FLOOR_S, PAUSE_FACTOR * median)

    def stalled_s(self, now_ns: int) -> float | None:
        """Seconds since the last step when a dump is due now (at most once per stall)."""
        if self.dumped or self.last_ns is None or self.after_s == 0:
            return None
        stalled = (now_ns - self.last_ns) / 1e9
        floor = self.after_s if self.after_s is not None else FLOOR_S
        if stalled < floor or stalled < self.threshold_s():
            return None
        self.dumped = True
        return stalled


def thread_stacks(skip: int | None = None) -> list[dict[str, Any]]:
    """``[{"name", "id", "stack"}]`` of the process's threads (the main thread first; the
    thread ``skip``, the caller, left out)."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out: list[dict[str, Any]] = []
    for ident in sorted(frames, key=lambda i: (i != main, getattr(threads.get(i), "name", ""))):
        if ident == skip:
            continue
        if len(out) >= MAX_THREADS:
            break
        t = threads.get(ident)
        text = "".join(traceback.format_stack(frames[ident]))
        if len(text) > MAX_STR_LEN:
            text = "...\n" + text[-(MAX_STR_LEN - 4) :]
        out.append(
            {
                "name": t.name if t is not None else f"thread-{ident}",
                "id": (t.native_id if t is not None and t.native_id else None) or ident,
                "stack": text,
            }
        )
    return out
