"""Warm starts in the worker: history loads off the event loop, and the messages they hold.

A run the worker first sees (no stored state: a new worker group, a lost changelog, a run it
never had) is warmed from its history in a process of its own (``warm_job``: the history read
from the stores, replayed through a detector by ``RunDetector.replay``, and returned as its
stored form, from which the worker builds the run's detector), at the fit pool's
lower priority: reading the stores and replaying thousands of values per rank would otherwise
take the event loop's core. So is a rank whose steps go back (``restarts``), re-seeded from
its history up to the step it resumes at; every rank the run has is re-seeded at that step in
the same job, kept for a while (``REWIND_S``) and used when its own steps go back to it (a job
restarts all its ranks from one checkpoint).

Meanwhile the run's messages wait here, in order, unacknowledged (the worker's other runs go
on); when the load ends, the run is sent an empty message, on which the detect agent installs
the result and scores the held messages. Bounded: a load that passes ``timeout_s``, fails, or
would hold more than ``hold_bytes`` of messages (all runs together) ends there, and the run or
rank starts cold, as without history.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram

from steplens.stream_jobs.engine import run_keys
from steplens.stream_jobs.engine.detector import CODEC, RunDetector
from steplens.stream_jobs.engine.history import read_history
from steplens.stream_jobs.engine.signals import arima, registry
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.worker import fit_pool, run_shards
from steplens.stream_jobs.worker.history_source import Source
from steplens.stream_jobs.worker.settings import HistorySettings

log = logging.getLogger("steplens.stream_jobs")

REWIND_S = 600.0  # how long a rank's re-seed at a restart waits for its steps to go back


@dataclass(frozen=True)
class WarmJob:
    """A warm start to run in the history process: ``run`` (a by-run key: a run, or a shard
    of one, ``run_shards``) from its ranks' history (``ranks``: every rank when None, else a
    shard's, or a restart's re-seed at the step they resume at, ``cuts``)."""

    run: str
    cfg: DetectorConfig
    settings: HistorySettings
    until_ns: int
    meta: dict[str, Any] | None = None  # the live run_meta's fields (None: the stored one)
    cuts: dict[int, int] = field(default_factory=dict)
    ranks: Sequence[int] | None = None


@dataclass
class WarmResult:
    head: bytes  # ``RunDetector.dump``'s values
    ranks: dict[int, bytes]
    points: dict[int, int]  # rank -> rows replayed
    runs: list[str]  # the runs read, the reference first
    read: int  # rows read from the stores
    queries: int
    read_s: float
    replay_s: float


def warm_job(job: WarmJob, source: Any = None) -> WarmResult:
    """Read the run's history (``source``, else the stores of the environment) and replay
    it; the state as plain data."""
    t0 = time.perf_counter()
    hist = read_history(
        source or Source.from_env(),
        run_keys.run_of(job.run),
        until_ns=job.until_ns,
        settings=job.settings,
        metrics=job.cfg.metrics(),
        meta=job.meta,
        cuts=job.cuts,
        ranks=job.ranks,
    )
    t1 = time.perf_counter()
    det = RunDetector(job.run, job.cfg, fit_inline=True)
    det.replay(hist, job.until_ns)
    head, ranks = det.dump(det.series)
    return WarmResult(
        head,
        ranks,
        {rank: len(rows) for rank, rows in hist.rows.items()},
        hist.runs,
        hist.read,
        hist.queries,
        t1 - t0,
        time.perf_counter() - t1,
    )


def warm_up() -> None:
    """The history process's imports and compiled loops, before the first run needs them."""
    import steplens.sinks.query  # noqa: F401

    registry.warm_up()
    arima.warm_up()


class HistoryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.loads = Counter(
            "steplens_worker_history_loads",
            "history loads (start: a run first seen; restart: steps went back), by outcome",
            ["why", "outcome"],
            registry=r,
        )
        self.seconds = Histogram(
            "steplens_worker_history_seconds",
            "from a run first seen (or a restart) to its detectors warm",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.points = Counter(
            "steplens_worker_history_points", "history rows replayed into detectors", registry=r
        )
        self.read = Counter(
            "steplens_worker_history_rows_read", "history rows read from the stores", registry=r
        )


@dataclass
class Load:
    run: str
    why: str  # "start" | "restart"
    started: float
    rank: int | None = None  # a restart's
    step: int | None = None
    held: list[Any] = field(default_factory=list)  # the run's messages meanwhile, in order
    held_bytes: int = 0
    done: bool = False
    result: WarmResult | None = None
    det: RunDetector | None = None  # a start's detector, built off the loop


@dataclass(frozen=True)
class Sight:
    """What a run's first message tells: the time history ends at, each rank's first step,
    and its run_meta's fields (None: it has none)."""

    until_ns: int
    cuts: dict[int, int]
    meta: dict[str, Any] | None

    @property
    def fresh(self) -> bool:
        """Every rank it has steps of starts at step 0: a new run, with nothing before."""
        return bool(self.cuts) and max(self.cuts.values()) <= 0


def first_sight(value: bytes) -> Sight:
    """Read a by-run message ([[partition, offset, record text], ...]) without validating
    it (the detect agent decodes it properly when it scores it)."""
    until: int | None = None
    cuts: dict[int, int] = {}
    meta: dict[str, Any] | None = None
    try:
        items = orjson.loads(value)
    except orjson.JSONDecodeError:
        items = []
    for item in items:
        try:
            rec = orjson.loads(item[2])
            kind, rank, data = rec.get("kind"), rec.get("rank"), rec.get("data") or {}
            t, step = rec.get("time_ns"), rec.get("step")
            if kind == "step_batch" and data.get("records"):
                t, step = data["records"][0].get("time_ns", t), data["records"][0].get("step")
            elif kind == "step_window":
                step = data.get("step_first", step)
            elif kind == "run_meta":
                meta = {**(meta or {}), **data}
                continue
        except (orjson.JSONDecodeError, TypeError, AttributeError, IndexError):
            continue  # a bad record: the agent dead-letters it
        if isinstance(t, int) and (until is None or t < until):
            until = t
        steps = kind in ("step", "step_batch", "step_window") and isinstance(step, int)
        if steps and isinstance(rank, int) and step < cuts.get(rank, step + 1):
            cuts[rank] = step
    return Sight(until if until is not None else time.time_ns(), cuts, meta)


def for_worker(
    settings: HistorySettings,
    cfg: DetectorConfig,
    metrics: Any,
    wake: Callable[[str], Coroutine[Any, Any, None]],
    shard_ranks: int = 0,
    *,
    first: int = 0,
) -> HistoryLoads | None:
    """The worker's history loads; None (runs start cold) when off or without the stores'
    code (``steplens-sinks``)."""
    if not settings.enabled:
        log.info("history off: runs the table does not have start cold")
        return None
    if importlib.util.find_spec("steplens.sinks") is None:
        log.warning("history off: steplens-sinks is not installed (runs start cold)")
        return None
    return HistoryLoads(settings, cfg, metrics.registry, wake, shard_ranks, first=first)


class HistoryLoads:
    """The loads in flight, their held messages, and the re-seeds kept for ranks to come."""

    def __init__(
        self,
        settings: HistorySettings,
        cfg: DetectorConfig,
        registry: CollectorRegistry,
        wake: Callable[[str], Coroutine[Any, Any, None]],
        shard_ranks: int = 0,
        *,
        first: int = 0,
    ) -> None:
        self.settings = settings
        self.shard_ranks = shard_ranks  # a wide run's shards read their own ranks
        self.first = first  # and shard 0's (``run_shards.first_ranks``)
        self.cfg = cfg
        self.metrics = HistoryMetrics(registry)
        self.wake = wake  # sends the run an empty message (the agent then installs the load)
        self.pool: fit_pool.FitPool | None = None
        self.loads: dict[str, Load] = {}
        self.held_bytes = 0
        # run -> rank -> (step, its series at that step as stored values, rows, when)
        self.rewinds: dict[str, dict[int, tuple[int, bytes | None, int, float]]] = {}

    def start(self) -> None:
        """The history process (spawned, at the fit pool's priority, dying with the worker;
        started again if it died, as the fit pool is); it loads its imports and compiled
        loops now, not at the first run."""
        self.pool = fit_pool.spawned(1, warm_up)

    # ------------------------------------------------------------------ loads
    def begin(self, run: str, event: Any) -> Load | None:
        """Warm ``run`` from its history, ``event`` (its first message) waiting for it; None
        for a run that starts at step 0 (it has nothing before)."""
        sight = first_sight(event.value)
        if sight.fresh:
            self.metrics.loads.labels("start", "fresh").inc()
            return None
        load = Load(run, "start", time.monotonic())
        self.loads[run] = load
        self.hold(load, event)
        job = WarmJob(
            run,
            self.cfg,
            self.settings,
            sight.until_ns,
            sight.meta,
            sight.cuts,
            run_shards.shard_ranks_of(run, self.shard_ranks, self.first),
        )
        asyncio.get_running_loop().create_task(self._run(load, job))
        return load

    def reseed(self, det: RunDetector, rank: int, step: int, until_ns: int) -> bool:
        """Rank ``rank`` of ``det`` resumes at ``step``: True when it did at once (a re-seed
        kept from another rank's restart); else a load begins (the run's messages from the
        restart on wait for it: ``hold``)."""
        kept = self.rewinds.get(det.run_id, {}).pop(rank, None)
        if kept is not None and kept[0] == step:
            det.restart(rank, step, CODEC.unpack(kept[1]) if kept[1] else None)
            if kept[2]:
                detail = {"baseline": "history", "resumed_at": step, "history_points": kept[2]}
                det.warmed(rank, detail)
            self.metrics.loads.labels("restart", "kept").inc()
            return True
        ranks = tuple(sorted({rank, *det.ranks.last_step}))
        load = Load(det.run_id, "restart", time.monotonic(), rank, step)
        self.loads[det.run_id] = load
        cuts = dict.fromkeys(ranks, step)
        job = WarmJob(det.run_id, self.cfg, self.settings, until_ns, None, cuts, ranks)
        asyncio.get_running_loop().create_task(self._run(load, job))
        return False

    def hold(self, load: Load, event: Any) -> None:
        """Keep ``event`` with ``load``; past the budget of held bytes the load ends (the
        run goes on cold, its messages scored at its next one)."""
        size = len(event.value or b"")
        if self.held_bytes + size > self.settings.hold_bytes and not load.done:
            self._end(load, "over_budget", None)
            asyncio.get_running_loop().create_task(self.wake(load.run))
        load.held.append(event)
        load.held_bytes += size
        self.held_bytes += size

    async def _run(self, load: Load, job: WarmJob) -> None:
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self.pool, warm_job, job)
            result = await asyncio.wait_for(fut, self.settings.timeout_s)
            if load.why == "start":  # built off the loop: a wide run's state is megabytes
                load.det = await loop.run_in_executor(None, self._built, result)
        except asyncio.TimeoutError:
            self._end(load, "timeout", None)
        except Exception as exc:
            log.warning("history of run %s not loaded: %s", load.run, exc)
            self._end(load, "failed", None)
        else:
            self._end(load, "warm" if result.points else "empty", result)
        if self.loads.get(load.run) is load:
            await self.wake(load.run)

    def _built(self, result: WarmResult) -> RunDetector | None:
        det = RunDetector.load(result.head, lambda r, _slot: result.ranks.get(r), self.cfg)
        if det is not None:
            det.touched.update(det.series)
            det.resume_fits()
        return det

    def _end(self, load: Load, outcome: str, result: WarmResult | None) -> None:
        if load.done:
            return
        load.done, load.result = True, result
        self.metrics.loads.labels(load.why, outcome).inc()
        self.metrics.seconds.observe(time.monotonic() - load.started)
        if result is not None:
            self.metrics.points.inc(sum(result.points.values()))
            self.metrics.read.inc(result.read)
            log.info(
                "history of run %s (%s): %d rows of %d ranks from %s, %d read in %d queries, "
                "%.2f s read, %.2f s replay, %.2f s in all",
                load.run,
                load.why,
                sum(result.points.values()),
                len(result.points),
                ", ".join(result.runs) or "no run",
                result.read,
                result.queries,
                result.read_s,
                result.replay_s,
                time.monotonic() - load.started,
            )
        else:  # over_budget, timeout, failed
            log.warning("history of run %s (%s): %s; it starts cold", load.run, load.why, outcome)

    def waiting(self, run: str) -> Load | None:
        return self.loads.get(run)

    def finish(self, run: str, det: RunDetector | None) -> tuple[RunDetector, list[Any]]:
        """The ended load of ``run`` installed (into ``det``, the run's detector, for a
        restart): the detector and the messages it held, in order."""
        load = self.loads.pop(run)
        self.held_bytes -= load.held_bytes
        result = load.result
        if load.why == "start":
            got = load.det if result is not None else None
            if got is not None and result is not None:
                _mark(got, result, {"baseline": "history", "history_runs": result.runs})
            return got or RunDetector(run, self.cfg, fit_inline=False), load.held
        assert det is not None and load.rank is not None and load.step is not None
        blobs = result.ranks if result is not None else {}
        blob = blobs.pop(load.rank, None)
        det.restart(load.rank, load.step, CODEC.unpack(blob) if blob else None)
        if result is not None:
            detail = {"baseline": "history", "resumed_at": load.step}
            _mark(det, result, detail, only=load.rank)
            now, step, points = time.monotonic(), load.step, result.points
            self.rewinds[run] = {
                r: (step, blobs.get(r), points.get(r, 0), now)
                for r in {*blobs, *det.ranks.last_step}
                if r != load.rank
            }
        return det, load.held

    def sweep(self) -> None:
        """Forget re-seeds kept past ``REWIND_S``."""
        old = time.monotonic() - REWIND_S
        for run in list(self.rewinds):
            kept = {r: v for r, v in self.rewinds[run].items() if v[3] >= old}
            if kept:
                self.rewinds[run] = kept
            else:
                del self.rewinds[run]

    def revoked(self) -> None:
        """Their runs may be another worker's now: loads and held messages are dropped (not
        acknowledged: the new owner scores them)."""
        self.loads.clear()
        self.held_bytes = 0
        self.rewinds.clear()


def _mark(
    det: RunDetector, result: WarmResult, detail: dict[str, Any], only: int | None = None
) -> None:
    for rank, points in result.points.items():
        if points and (only is None or rank == only):
            det.warmed(rank, {**detail, "history_points": points})
