"""The 7-day baselines' refits: a run's series that want a band (``RunDetector.baselines_due``:
none yet, or refitted ``--baseline-refit-s`` ago, hourly by default) go to the fit pool as one
jobs of ``SERIES_PER_JOB`` series, each of which reads their last ``days`` of rollups from
InfluxDB (``baseline_history``), adds the in-run minutes and fits every band
(``seasonal_baseline.fit_bands``); the bands are applied on the event loop when the job comes
back. One job at a time, of a few seconds: the fits are background work, the ARIMA fits wait
at most one job, and none runs on the event loop. After a job of ``t`` seconds the next waits
``JOB_SPACING * t``: a wide run's series (four a GPU) are thousands of jobs, and back to back
they kept a pool process and InfluxDB's reads busy for minutes, beside the worker.

Fails soft: a store that cannot be read (none configured, down, slower than ``timeout_s``)
leaves the job with the in-run minutes, so the series get the in-run baseline (their signals
say ``"baseline": "in-run"``), and the next jobs for ``STORES_RETRY_S`` do not ask it; each kind
of failure is logged once and every job without the stores is counted
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

from steplens.schema.log_limit import LimitedLog
from steplens.stream_jobs.engine import run_keys
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.history import DAY_NS
from steplens.stream_jobs.engine.signals.seasonal_baseline import Band, BaselineConfig, fit_bands
from steplens.stream_jobs.worker import baseline_history

log = logging.getLogger("steplens.stream_jobs")
refused = LimitedLog(log)  # a broken pool refuses every job until it is started again

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
    why = None if read else "not asked (history off, or the stores failed lately)"
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
                name = run_keys.run_of(run)  # a shard's series are its run's
                stored = baseline_history.read_rollups(influx, name, since, now, live)
        except Exception as exc:  # slow or down: the in-run minutes alone
            why = f"{type(exc).__name__}: {exc}"[:300]
    return fit_bands(baseline_history.merged(stored, live), cfg), why


# series per pool job at most (a run's due series go in several, of the same hosts and ranks
# where they can): a job takes seconds, and the ARIMA fits queued behind it wait that long
SERIES_PER_JOB = 16
STORES_RETRY_S = 600.0  # a store that failed (down, or slower than timeout_s) is left alone
JOB_SPACING = 3.0  # a job of t seconds is followed by the next one this many times t later


def chunks(live: baseline_history.Series, n: int = SERIES_PER_JOB) -> list[baseline_history.Series]:
    """``live`` cut into parts of ``n`` series, in key order (a host's or rank's together)."""
    keys = sorted(live)
    return [{k: live[k] for k in keys[i : i + n]} for i in range(0, len(keys), n)]


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
        self.parts: deque[tuple[str, baseline_history.Series]] = deque()  # due, not yet sent
        self.in_flight: str | None = None
        self.logged: set[str] = set()  # kinds of load failure already logged
        self.down_until = 0.0  # monotonic: the stores failed; not read again before this
        self.started = 0.0  # monotonic: when the job in flight was submitted
        self.next_at = 0.0  # monotonic: no job is submitted before this (``JOB_SPACING``)
        self.spacing: asyncio.TimerHandle | None = None  # the submit waiting for ``next_at``

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
        wait = self.next_at - time.monotonic()
        if wait > 0:  # spaced: submitted then
            if self.spacing is None:
                self.spacing = asyncio.get_running_loop().call_later(
                    wait, functools.partial(self._spaced, runs)
                )
            return
        now = time.time_ns()
        while not self.parts and self.queue:
            run = self.queue.popleft()
            self.queued.discard(run)
            det = runs.get(run)
            live = det.baselines_due(now) if det is not None else {}
            self.parts.extend((run, part) for part in chunks(live))
        if self.parts:
            run, live = self.parts.popleft()
            job = functools.partial(
                load_and_fit,
                run,
                live,
                self.cfg,
                days=self.days,
                timeout_s=self.timeout_s,
                read=self.read and time.monotonic() >= self.down_until,
            )
            try:
                fut = asyncio.get_running_loop().run_in_executor(self.pool, job)
            except Exception as exc:  # a broken or closed pool: asked again at the next retry
                refused.warning("fit pool", "baseline fit pool refused a job: %r", exc)
                self.count("refused", 1)
                self.parts.clear()
                return
            self.in_flight = run
            self.started = time.monotonic()
            fut.add_done_callback(functools.partial(self._finished, run, runs))

    def _finished(
        self, run: str, runs: Mapping[str, RunDetector], fut: asyncio.Future[Any]
    ) -> None:
        self.in_flight = None
        now = time.monotonic()
        self.next_at = now + JOB_SPACING * (now - self.started)
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
                if self.read and time.monotonic() >= self.down_until:  # not read for a while
                    self.down_until = time.monotonic() + STORES_RETRY_S
                kind = why.split(":", 1)[0]
                if kind not in self.logged:
                    self.logged.add(kind)
                    log.warning("baselines: stores not read (%s); in-run baselines", why)
            self.count("bands", sum(b is not None for b in bands.values()))
            self.apply(run, bands)
        self._submit(runs)

    def _spaced(self, runs: Mapping[str, RunDetector]) -> None:
        self.spacing = None
        self._submit(runs)
