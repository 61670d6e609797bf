"""The Faust wiring (the only module that imports faust).

raw topic (key run_id:rank, 8 partitions)
  -> ``Router``: batches of raw messages (a librdkafka consumer of the ``<app id>-route`` group,
     in a thread of its own, started and stopped with the app), grouped by run id from the key
     and forwarded to the internal ``<app id>-by-run`` topic, a run's share of a batch cut into
     messages of about ``BY_RUN_MESSAGE_BYTES``; undecodable keys or non-UTF-8 payloads become
     dead letters here. The hop puts every rank of a run on one partition: the producers key
     raw by run and rank, and a run's detectors judge its ranks together; a run wider than
     ``shard_ranks`` goes in shards, each keyed and placed as a run of its own (``run_shards``).
  -> ``detect`` (a Faust agent): one ``RunDetector`` per run or shard (``RunStore``: the ``runs``
     table, checkpoints, acknowledgements; a run the table does not have, or a rank whose
     steps go back, is warmed from its history first: ``HistoryLoads``); ``Scorer`` scores
     its messages, ``Publisher`` sends its signals, alerts and dead letters.
ARIMA fits run in a process pool, many to a job (``FitQueue``); their parameters are applied
when they come back. The 7-day baselines are refitted in the same pool (``BaselineFits``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
from typing import Any, cast

import faust

from steplens.schema.settings import kafka_security_config
from steplens.stream_jobs.engine import run_keys
from steplens.stream_jobs.engine.advice import AdviceConfig
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.publish_limit import QuietLimiter
from steplens.stream_jobs.engine.signals import arima, registry
from steplens.stream_jobs.engine.signals.dynamic_baseline import DynamicConfig
from steplens.stream_jobs.engine.signals.gpu_errors import GpuErrorConfig
from steplens.stream_jobs.engine.signals.gpu_memory import GpuMemoryConfig
from steplens.stream_jobs.engine.signals.host_memory import HostMemoryConfig
from steplens.stream_jobs.engine.signals.ranks import RanksConfig
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.engine.signals.thresholds import ThresholdConfig
from steplens.stream_jobs.worker import compat, fit_pool, history_loads, run_shards
from steplens.stream_jobs.worker.baseline_fits import Bands, BaselineFits
from steplens.stream_jobs.worker.fit_queue import FitQueue
from steplens.stream_jobs.worker.metrics import WorkerMetrics
from steplens.stream_jobs.worker.publisher import Publisher
from steplens.stream_jobs.worker.recovery_watch import RecoveryWatch
from steplens.stream_jobs.worker.router import Router
from steplens.stream_jobs.worker.run_limits import RunLimits
from steplens.stream_jobs.worker.scoring import Scorer
from steplens.stream_jobs.worker.settings import (
    BY_RUN_MAX_BYTES,
    PRODUCER_BATCH_BYTES,
    PRODUCER_BUFFER_MESSAGES,
    DetectorOptions,
    WorkerSettings,
)
from steplens.stream_jobs.worker.store import RunStore

log = logging.getLogger("steplens.stream_jobs")

SERIES_PER_RANK = 8  # a run's 7-day baseline series per rank (``detector_config``)
QUIET_KEYS_PER_RANK = 32  # quiet series (run, rank, rule, metric) remembered per rank


def detector_config(
    options: DetectorOptions, max_ranks: int, shard_ranks: int = 0
) -> DetectorConfig:
    """The engine's detector settings with the worker's options applied; a run's caps follow
    ``max_ranks``: a GPU a rank, ``SERIES_PER_RANK`` 7-day baseline series a rank (4 of its
    GPU's, 2 of its own, its share of the node's disks and ports). The followed ranks
    (``series_ranks``) stay within a run's first shard (``shard_ranks``), so that one detector
    makes the run-wide loss checks, and a loss spike on every rank pages once."""
    followed = registry.SERIES_RANKS if options.series_ranks is None else options.series_ranks
    if shard_ranks > 0:
        followed = min(followed, shard_ranks)
    ranks = RanksConfig()
    if options.hang_after_s is not None:
        ranks = RanksConfig(hang_after_s=options.hang_after_s)
    advice = AdviceConfig(**dataclasses.asdict(options.advice))
    baseline = DynamicConfig(
        refit_s=options.baseline_refit_s, max_series=SERIES_PER_RANK * max_ranks
    )
    return DetectorConfig(
        arima_enabled=options.arima_enabled,
        series_ranks=followed,
        ranks=ranks,
        advice=advice,
        baseline=baseline,
        thresholds=ThresholdConfig(max_gpus=max_ranks),
        gpu_memory=GpuMemoryConfig(max_gpus=max_ranks),
        gpu_errors=GpuErrorConfig(max_gpus=max_ranks),
        host_memory=HostMemoryConfig(max_ranks=max_ranks),
    )


class Worker:
    """The Faust app, its topics, table, agents and timers, and the fit pool."""

    def __init__(self, s: WorkerSettings, metrics: WorkerMetrics) -> None:
        compat.check()
        t = time.perf_counter()
        registry.warm_up()  # not at the first batch: compiled once per machine, then cached
        log.info("compiled detector loops ready in %.1f s", time.perf_counter() - t)
        self.s = s
        detector = detector_config(s.detector, s.limits.max_ranks, s.shard_ranks)
        self.metrics = metrics
        self.fits = FitQueue(
            None,
            detector.arima.order,
            detector.arima.method,
            self._fitted,
            jobs=s.fit_workers,
            max_batch=s.fit_batch,
            max_pending=s.max_pending_fits,
            on_job=lambda n: self.metrics.fit_jobs.inc(),
        )
        self.baselines = BaselineFits(
            detector.baseline.fit,
            days=s.history.days,
            timeout_s=s.history.timeout_s,
            read=s.history.enabled,
            apply=self._baselines_fitted,
            count=lambda what, n: self.metrics.baselines.labels(what).inc(n),
        )
        self.pool: fit_pool.FitPool | None = None
        self.app = app = faust.App(
            s.app_id,
            broker=f"kafka://{s.bootstrap}",
            broker_credentials=broker_credentials(kafka_security_config()),
            store="memory://",
            datadir=s.state_dir,
            web_enabled=s.faust_web_port > 0,
            web_bind="127.0.0.1",
            web_host="127.0.0.1",
            web_port=s.faust_web_port or 6066,
            topic_partitions=s.by_run_partitions,
            consumer_auto_offset_reset="earliest",
            broker_session_timeout=s.session_timeout_s,
            # a survivor learns of a dead worker's eviction at its next heartbeat: a sixth
            # of the session keeps that part of a takeover near one second
            broker_heartbeat_interval=s.session_timeout_s / 6,
            producer_linger_ms=5,
            producer_max_request_size=BY_RUN_MAX_BYTES,
            # aiokafka sends one request per broker at a time, a batch per partition in it
            producer_max_batch_size=PRODUCER_BATCH_BYTES,
            table_cleanup_interval=60.0,
            # by-run messages stay unacknowledged until their run's next checkpoint: a
            # rebalance must not wait for them (they are scored again by the new owner)
            stream_wait_empty=False,
        )
        self.by_run_name = f"{s.app_id}-by-run"
        self.by_run = app.topic(
            self.by_run_name,
            key_serializer="raw",
            value_serializer="raw",
            partitions=s.by_run_partitions,
            internal=True,
        )
        table = compat.runs_table(app, "runs", s.by_run_partitions)
        first = run_shards.first_ranks(detector.series_ranks, s.shard_ranks)  # shard 0's ranks
        self.history = history_loads.for_worker(
            s.history, detector, metrics, self._wake, s.shard_ranks, first=first
        )
        limits = RunLimits(s.limits, table.keys, metrics.count_limited)
        self.store = RunStore(
            table,
            detector,
            s.checkpoint_s,
            self.history,
            limits,
            count_restore=lambda outcome: metrics.restores.labels(outcome).inc(),
        )
        reseed = self.store.restart if self.history is not None else None
        self.out = Publisher(
            self._send,
            s.topics,
            metrics,
            QuietLimiter(
                s.signal_every,
                s.signal_interval_s,
                max(100_000, QUIET_KEYS_PER_RANK * s.limits.max_ranks),
                s.signal_ranks,
            ),
            s.app_id,
        )
        self.scorer = Scorer(limits, reseed, self.out, metrics, s.time_bounds)
        self.router = Router(s, self.out.dead_letter, metrics.assigned.set, first=first)
        app.agent(self.by_run, name="detect")(self._detect)
        app.timer(2.0)(self._report)
        app.timer(max(1.0, s.checkpoint_s))(self._nudge_quiet_runs)
        app.timer(min(600.0, max(1.0, s.limits.idle_s / 4)))(self._retire_idle_runs)
        app.timer(60.0)(self._refit_baselines)
        self.recovery_watch: RecoveryWatch | None = None
        app.timer(1.0)(self._watch_recovery)
        app.on_partitions_revoked.connect(cast(Any, self._revoked))
        app.on_partitions_assigned.connect(cast(Any, self._assigned))
        app.on_before_shutdown.connect(cast(Any, self._stopping))
        app.task(self._startup)
        self._rate_mark = (time.monotonic(), 0)

    def _send(self, topic: str, key: bytes | None, value: bytes) -> Any:
        return compat.send(self.app, topic, key, value)

    # ------------------------------------------------------------------ lifecycle
    async def _startup(self) -> None:
        compat.raise_producer_buffer(self.app, PRODUCER_BUFFER_MESSAGES)
        compat.quiet_root_logger(self.s.log_level)
        if self.s.fit_workers > 0:  # the ARIMA fits (unless --no-arima) and the baselines
            # each pool process loads statsmodels (seconds) now, not at the first run's first fit
            restarted = self.metrics.fit_pool_restarts.inc
            self.pool = fit_pool.spawned(self.s.fit_workers, arima.warm_up, restarted)
            self.fits.pool = self.pool if self.s.detector.arima_enabled else None
            self.baselines.pool = self.pool
        if self.history is not None:
            self.history.start()
        self.router.start()

    async def _stopping(self, app: faust.App, **kw: Any) -> None:
        await asyncio.to_thread(self.router.stop)  # its batch in flight routed and committed

    async def _revoked(self, app: faust.App, revoked: Any, **kw: Any) -> None:
        self.store.revoked()

    async def _assigned(self, app: faust.App, assigned: Any, **kw: Any) -> None:
        self.store.assigned({tp.partition for tp in assigned if tp.topic == self.by_run_name})
        ms = compat.set_fetch_wait(self.app.consumer, self.s.fetch_wait_ms)
        if ms is None:
            log.warning("the consumer's fetch wait could not be set; it stays Faust's 1.5 s")
            return
        self.metrics.fetch_wait.set(ms / 1000)

    async def _watch_recovery(self) -> None:
        """A table recovery that read nothing for ``STALL_S`` starts over (``RecoveryWatch``)."""
        if self.recovery_watch is None:
            self.recovery_watch = RecoveryWatch(cast(Any, self.app.tables).recovery)
        if self.recovery_watch.check(time.monotonic()):
            self.metrics.recovery_restarts.inc()
            log.warning(
                "table recovery read nothing from the changelog for %.0f s: started over",
                self.recovery_watch.stall_s,
            )

    async def _report(self) -> None:
        now = time.monotonic()
        t0, n0 = self._rate_mark
        self.metrics.rate.set((self.scorer.consumed - n0) / max(now - t0, 1e-6))
        self._rate_mark = (now, self.scorer.consumed)
        self.metrics.lag.set(self.router.lag())

    # ------------------------------------------------------------------ detect
    async def _detect(self, stream: Any) -> None:
        """Score each by-run message into its run's detector; acknowledge it once a
        checkpoint of its run holds it (``RunStore``). A run warming from its history holds
        its messages until it is warm. A message whose scoring a rebalance interrupted is
        left unacknowledged (its run's owner scores it again, skipping what it applied)."""
        stream = compat.unacked(stream)
        store = self.store
        async for event in stream.events():
            generation = store.generation
            run = event.key.decode() if isinstance(event.key, bytes) else str(event.key)
            if not self.store.admit(run, event):
                await stream.ack(event)
                continue
            todo = self.store.ready(run, event)
            for i, ev in enumerate(todo):
                det = self.store.cache[run]
                scored = await self.scorer.score(det, run, ev)
                if store.generation != generation:
                    break
                if not scored:
                    self.store.wait(run, todo[i:])  # a restart's re-seed holds the run
                    break
                self._submit_fits(run, det)
                for due, events in self.store.hold(ev.message.partition, run, ev):
                    self.store.checkpoint(due)
                    for held in events:
                        await stream.ack(held)

    async def _wake(self, run: str) -> None:
        """An empty message to ``run``: the detect agent then installs its ended history
        load, checkpoints the run, or retires it when idle (``RunStore.admit``)."""
        name, shard = run_keys.split_key(run)
        to = run_shards.partition_of(name, shard, self.router.partitions)
        await compat.nudge(self.by_run, run, to)

    async def _nudge_quiet_runs(self) -> None:
        """A quiet run's held messages wait for its next checkpoint, which needs a message of
        its partition: it is sent an empty by-run message, so the detect agent checkpoints
        it and acknowledges them."""
        for run in self.store.quiet_runs():
            await self._wake(run)
        if self.history is not None:
            self.history.sweep()

    async def _retire_idle_runs(self) -> None:
        """Each idle run is sent an empty by-run message: the detect agent retires it."""
        for run in self.store.idle_runs():
            await self._wake(run)

    # ------------------------------------------------------------------ fits
    def _submit_fits(self, run: str, det: RunDetector) -> None:
        if not det.fits_wanted:
            return
        for key, values in det.pending_fits():
            if not self.fits.want((run, key), values):
                det.apply_fit(key, None)  # skipped; asked again at its next scheduled refit
                self.metrics.fits.labels("skipped").inc()

    async def _refit_baselines(self) -> None:
        """The runs' series due a 7-day baseline go to the fit pool (``BaselineFits``)."""
        self.baselines.tick(self.store.cache)

    def _baselines_fitted(self, run: str, bands: Bands) -> None:
        det = self.store.cache.get(run)
        if det is not None:
            det.apply_baselines(bands)

    def _fitted(self, key: Any, params: arima.ArimaParams | None) -> None:
        run, fit_key = key
        self.metrics.fits.labels("ok" if params is not None else "failed").inc()
        self.store.fitted(run, fit_key, params)


def broker_credentials(conf: dict[str, str]) -> Any:
    """Faust's credentials from the librdkafka security settings every other client takes
    (``STEPLENS_KAFKA_SECURITY_PROTOCOL``, ``_SASL_MECHANISM``, ``_SASL_USERNAME``,
    ``_SASL_PASSWORD``, ``_SSL_CA_LOCATION``, ``_SSL_CERTIFICATE_LOCATION``, ``_SSL_KEY_LOCATION``):
    None for plaintext."""
    protocol = conf.get("security.protocol", "plaintext").upper()
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=conf.get("ssl.ca.location"))
        if conf.get("ssl.certificate.location"):
            context.load_cert_chain(
                conf["ssl.certificate.location"],
                conf.get("ssl.key.location"),
                conf.get("ssl.key.password"),
            )
    if protocol.startswith("SASL_"):
        return faust.SASLCredentials(
            username=conf.get("sasl.username"),
            password=conf.get("sasl.password"),
            mechanism=conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "PLAIN",
            ssl_context=context,
        )
    return faust.SSLCredentials(context) if context is not None else None
