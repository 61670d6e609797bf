"""ARIMA fits sent to a pool in batches.

Each submission to a process pool costs the submitting process about a millisecond of CPU (its
queue-management and feeder threads pickle and pipe the call, and they take the GIL from the
event loop). A new run's series all want their fits at the same counts of values, so a run of
256 ranks asked for over a thousand fits within a second, each one a submission. Here the fits
wait in a queue while ``jobs`` pool jobs run, and the next job takes up to ``max_batch`` of
them: one submission and one round trip for many fits. An idle pool gets a lone fit at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import functools
import logging
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from steplens.schema.log_limit import LimitedLog
from steplens.stream_jobs.engine.signals import arima

log = logging.getLogger("steplens.stream_jobs")
refused = LimitedLog(log)  # a broken pool refuses every job until it is started again

Done = Callable[[Hashable, "arima.ArimaParams | None"], None]

# the pool's processes run at a lower priority: fits are background work, and a new run's
# first fits, all at once, must not take the cores from the event loop and Kafka
FIT_NICENESS = 10


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def pool_initializer(parent: int) -> None:
    """A pool process's initializer: it dies with the worker ``parent`` (even one killed with
    SIGKILL), and runs at ``FIT_NICENESS`` lower CPU priority."""
    die_with_parent(parent)
    try:
        os.nice(FIT_NICENESS)
    except OSError:  # not allowed here: the fits run at the worker's priority
        log.debug("could not lower the fit pool's priority", exc_info=True)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits (Linux ``prctl(PR_SET_PDEATHSIG)``, through
    ctypes: no library offers it); a parent already gone exits it now."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError):
            log.warning("the fit pool cannot be tied to its worker", exc_info=True)
    if os.getppid() != parent:  # the parent died before the death signal was set
        os._exit(1)


class FitQueue:
    def __init__(
        self,
        pool: concurrent.futures.Executor | None,
        order: tuple[int, int, int],
        method: str,
        done: Done,
        *,
        jobs: int = 1,
        max_batch: int = 64,
        max_pending: int = 4096,
        on_job: Callable[[int], None] | None = None,
    ) -> None:
        self.pool = pool
        self.order = order
        self.method = method
        self.done = done  # called on the event loop with each fit's key and result
        self.jobs = max(1, jobs)  # jobs in flight at most (one per pool process keeps it busy)
        self.max_batch = max(1, max_batch)
        self.max_pending = max_pending  # fits queued or running; past it a fit is refused
        self.queue: deque[tuple[Hashable, Any]] = deque()
        self.running = 0  # fits in the jobs in flight
        self.in_flight = 0  # jobs
        self.submitted = 0  # jobs ever submitted
        self.on_job = on_job  # called with each job's number of fits

    @property
    def pending(self) -> int:
        return len(self.queue) + self.running

    def want(self, key: Hashable, values: Any) -> bool:
        """Queue a fit of ``values``; ``False`` when there is no pool or the queue is full (the
        caller then treats it as skipped)."""
        if self.pool is None or self.pending >= self.max_pending:
            return False
        self.queue.append((key, values))
        self._submit()
        return True

    def _submit(self) -> None:
        loop = asyncio.get_running_loop()
        while self.queue and self.in_flight < self.jobs and self.pool is not None:
            n = min(len(self.queue), self.max_batch)
            batch = [self.queue.popleft() for _ in range(n)]
            keys = [k for k, _ in batch]
            try:
                fut = loop.run_in_executor(
                    self.pool, arima.fit_many, [v for _, v in batch], self.order, self.method
                )
            except Exception as exc:  # a broken or closed pool: these fits failed, go on
                refused.warning("fit pool", "ARIMA fit pool refused a job: %r", exc)
                for key in keys:
                    self.done(key, None)
                continue
            self.in_flight += 1
            self.running += n
            self.submitted += 1
            if self.on_job is not None:
                self.on_job(n)
            fut.add_done_callback(functools.partial(self._finished, keys))

    def _finished(self, keys: list[Hashable], fut: asyncio.Future[Any]) -> None:
        self.in_flight -= 1
        self.running -= len(keys)
        ok = not fut.cancelled() and fut.exception() is None
        results = fut.result() if ok else [None] * len(keys)
        for key, params in zip(keys, results, strict=True):
            self.done(key, params)
        self._submit()
