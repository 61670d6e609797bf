"""The 7-day baselines' refits: a run's series that want a band (``RunDetector.baselines_due``:
none yet, or refitted ``--baseline-refit-s`` ago, hourly by default) go to the fit pool as one
job, which reads the run's last ``days`` of rollups from InfluxDB (``baseline_history``), adds
the in-run minutes and fits every band (``seasonal_baseline.fit_bands``); the bands are applied
on the event loop when the job comes back. One job at a time: the fits are background work,
behind the ARIMA fits, never on the event loop.

Fails soft: a store that cannot be read (none configured, down, slower than ``timeout_s``)
leaves the job with the in-run minutes, so the series get the in-run baseline (their signals
say ``"baseline": "in-run"``); each kind of failure is logged once and every one is counted
(``steplens_worker_baseline_loads{outcome}``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.history import DAY_NS
from steplens.stream_jobs.engine.signals.seasonal_baseline import Band, BaselineConfig, fit_bands
from steplens.stream_jobs.worker import baseline_history

log = logging.getLogger("steplens.stream_jobs")

Bands = dict[str, Band | None]
Outcome = Callable[[str, int], None]  # (what, how many): "loaded", "load_failed", "bands", ...


def load_and_fit(
    run: str,
    live: baseline_history.Series,
    cfg: BaselineConfig,
    *,
    days: float,
    timeout_s: float,
    read: bool = True,
) -> tuple[Bands, str | None]:
    """A pool job: ``run``'s stored minutes of the series in ``live`` (its in-run minutes)
    joined to them, and every band fitted; the reason the stores were not read, if any."""
    stored: baseline_history.Series = {}
    why = None if read else "history off"
    if read:
        try:
            from steplens.sinks.query import Stores

            influx = Stores.from_env().influx
            if influx is None:
                why = "no InfluxDB configured"
            else:
                influx = replace(influx, timeout_ms=max(1, int(timeout_s * 1000)))
                now = time.time_ns()
                since = now - int(days * DAY_NS)
                stored = baseline_history.read_rollups(influx, run, since, now)
        except Exception as exc:  # slow or down: the in-run minutes alone
            why = f"{type(exc).__name__}: {exc}"[:300]
    return fit_bands(baseline_history.merged(stored, live), cfg), why


class BaselineFits:
    def __init__(
        self,
        cfg: BaselineConfig,
        *,
        days: float,
        timeout_s: float,
        read: bool,
        apply: Callable[[str, Bands], None],
        count: Outcome,
    ) -> None:
        self.cfg = cfg
        self.days = days
        self.timeout_s = timeout_s
        self.read = read  # read the stores (the worker's history setting)
        self.apply = apply  # called on the event loop with a run's bands
        self.count = count
        self.pool: concurrent.futures.Executor | None = None
        self.queue: deque[str] = deque()
        self.queued: set[str] = set()
        self.in_flight: str | None = None
        self.logged: set[str] = set()  # kinds of load failure already logged

    def tick(self, runs: Mapping[str, RunDetector]) -> None:
        """Queue every run (those with series due are fitted, one job at a time)."""
        for run in runs:
            if run not in self.queued:
                self.queued.add(run)
                self.queue.append(run)
        self._submit(runs)

    def _submit(self, runs: Mapping[str, RunDetector]) -> None:
        if self.pool is None or self.in_flight is not None:
            return
        now = time.time_ns()
        while self.queue:
            run = self.queue.popleft()
            self.queued.discard(run)
            det = runs.get(run)
            live = det.baselines_due(now) if det is not None else {}
            if not live:
                continue
            job = functools.partial(
                load_and_fit,
                run,
                live,
                self.cfg,
                days=self.days,
                timeout_s=self.timeout_s,
                read=self.read,
            )
            try:
                fut = asyncio.get_running_loop().run_in_executor(self.pool, job)
            except Exception:  # a broken or closed pool: asked again at the next retry
                log.warning("baseline fit pool refused a job", exc_info=True)
                self.count("refused", 1)
                return
            self.in_flight = run
            fut.add_done_callback(functools.partial(self._finished, run, runs))
            return

    def _finished(
        self, run: str, runs: Mapping[str, RunDetector], fut: asyncio.Future[Any]
    ) -> None:
        self.in_flight = None
        if fut.cancelled() or fut.exception() is not None:
            self.count("job_failed", 1)
            log.warning(
                "baseline fits of %s failed: %r", run, None if fut.cancelled() else fut.exception()
            )
        else:
            bands, why = fut.result()
            if why is None:
                self.count("loaded", 1)
            else:
                self.count("load_failed", 1)
                kind = why.split(":", 1)[0]
                if kind not in self.logged:
                    self.logged.add(kind)
                    log.warning("baselines: stores not read (%s); in-run baselines", why)
            self.count("bands", sum(b is not None for b in bands.values()))
            self.apply(run, bands)
        self._submit(runs)
