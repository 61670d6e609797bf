"""The worker's pool of fit processes, started again when one of its processes died.

A ``ProcessPoolExecutor`` whose process died (killed for memory, a crash inside a fit) is
broken for good: it fails the jobs it held and refuses every later one, so the worker would
fit no ARIMA model and no 7-day baseline again until it restarted. ``FitPool`` starts the
pool afresh at the next job after that (the jobs it held failed; their callers ask again), then
at most once per ``restart_every_s`` so a fit that kills its process each time does not spawn
processes in a loop (a job refused meanwhile fails as it did before), and counts each start.
Written here: the standard library's pools do not replace themselves, and loky's reusable
executor, which does, is one per process and another dependency.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from steplens.stream_jobs.worker.fit_queue import pool_initializer

log = logging.getLogger("steplens.stream_jobs")


class FitPool(concurrent.futures.Executor):
    """An executor over the pool ``make`` returns, made again when it broke."""

    def __init__(
        self,
        make: Callable[[], concurrent.futures.Executor],
        restart_every_s: float = 10.0,
        on_restart: Callable[[], None] | None = None,
    ) -> None:
        self._make = make
        self._pool = make()
        self._lock = threading.Lock()
        self._restart_every_s = restart_every_s
        self._started = -math.inf  # when it was last started again
        self._on_restart = on_restart
        self.restarts = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        pool = self._pool
        try:
            return pool.submit(fn, *args, **kwargs)
        except concurrent.futures.BrokenExecutor:
            if not self._restart(pool):
                raise
        return self._pool.submit(fn, *args, **kwargs)

    def _restart(self, broken: concurrent.futures.Executor) -> bool:
        """A new pool for ``broken`` (unless another call made one since); False while the
        last start again is younger than ``restart_every_s``."""
        with self._lock:
            if self._pool is not broken:
                return True
            if time.monotonic() - self._started < self._restart_every_s:
                return False
            broken.shutdown(wait=False, cancel_futures=True)
            self._pool = self._make()
            self._started = time.monotonic()
            self.restarts += 1
        log.warning(
            "a fit process died; the fit pool was started again (%d times so far)", self.restarts
        )
        if self._on_restart is not None:
            self._on_restart()
        return True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def spawned(
    workers: int, warm_up: Callable[[], Any], on_restart: Callable[[], None] | None = None
) -> FitPool:
    """A ``FitPool`` of ``workers`` spawned processes at the fit pool's priority, dying with
    this one; each runs ``warm_up`` (its imports, compiled loops) at once, not at the first
    job, and again whenever the pool is started again."""

    def make() -> concurrent.futures.ProcessPoolExecutor:
        pool = concurrent.futures.ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=pool_initializer,
            initargs=(os.getpid(),),
        )
        for _ in range(workers):
            pool.submit(warm_up)
        return pool

    return FitPool(make, on_restart=on_restart)
