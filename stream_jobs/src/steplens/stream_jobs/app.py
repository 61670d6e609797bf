"""The Faust wiring (the only module that imports faust).

raw topic (key run_id:rank, 8 partitions)
  -> ``route``: batches of raw messages (``take_events`` with ``within``), grouped by run id from
     the key and forwarded to the internal ``<app id>-by-run`` topic, a run's share of a batch
     cut into messages of about ``BY_RUN_MESSAGE_BYTES``; undecodable keys or non-UTF-8
     payloads become dead letters here
  -> ``detect``: one ``RunDetector`` per run, kept in the ``runs`` table (changelog-backed, so a
     restarted or newly joined worker resumes it; each rank's series is a value of its own);
     publishes signals, alerts and dead letters (a record its detectors refuse or fail on).
ARIMA fits run in a process pool, many to a job (``FitQueue``); their parameters are applied
when they come back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import importlib
import inspect
import io
import logging
import multiprocessing
import pickle
import pkgutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import faust
import orjson
from faust.serializers.codecs import RestrictedUnpickler
from faust.types import TP

from steplens.producer.dead_letter import dead_letter_bytes
from steplens.producer.schema import DecodeError, Record, decode
from steplens.producer.topics import Topics
from steplens.stream_jobs import config as config_mod
from steplens.stream_jobs import core, detector, rules, signals
from steplens.stream_jobs.config import DetectorConfig
from steplens.stream_jobs.core import Alert, Signal, SignalGrid, SignalRun
from steplens.stream_jobs.detector import RunDetector
from steplens.stream_jobs.fit_queue import FitQueue, background_priority
from steplens.stream_jobs.metrics import WorkerMetrics, reason_class
from steplens.stream_jobs.outputs import alert_bytes, signal_bytes
from steplens.stream_jobs.publish_limit import QuietLimiter
from steplens.stream_jobs.signals import arima, kernels
from steplens.stream_jobs.webhook import WebhookNotifier

log = logging.getLogger("steplens.stream_jobs")

# every module whose dataclasses a pickled RunDetector may hold: every signal module included
STATE_MODULES = (
    config_mod,
    core,
    detector,
    rules,
    *(
        importlib.import_module(f"{signals.__name__}.{m.name}")
        for m in pkgutil.iter_modules(signals.__path__)
    ),
)


def allow_state_classes() -> None:
    """Let the restricted unpickler rebuild our own state dataclasses, and nothing else."""
    allowed = dict(RestrictedUnpickler.ALLOWED_CLASSES)
    for mod in STATE_MODULES:
        names = {
            n
            for n, obj in vars(mod).items()
            if inspect.isclass(obj)
            and dataclasses.is_dataclass(obj)
            and obj.__module__ == mod.__name__
        }
        allowed[mod.__name__] = frozenset(names | set(allowed.get(mod.__name__, ())))
    allowed["copyreg"] = frozenset({"_reconstructor"} | set(allowed.get("copyreg", ())))
    RestrictedUnpickler.ALLOWED_CLASSES = allowed


class StateTable(faust.Table):
    """A table of raw bytes: a run's detector under its run id, and each of its ranks' series
    under ``rank_key`` (see ``dump_state``)."""

    def _serializer_from_type(self, typ: Any) -> Any:
        return "raw" if typ in (bytes, str) else super()._serializer_from_type(typ)


def rank_key(run: str, rank: int) -> str:
    """The table key of one rank's series of ``run``."""
    return f"{run}\x1frank:{rank}"


def dump_state(det: RunDetector, ranks: Iterable[int]) -> tuple[bytes, dict[int, bytes]]:
    """A run's state as table values: the detector without its per-rank series (with the
    list of its ranks), and the series of ``ranks``, each a value of its own. One value for a
    whole run grew with its ranks past what Kafka takes in one message (a 128-rank run is over
    1 MB), and the changelog then refused every checkpoint of it."""
    series = det.series
    det.series = {}
    try:
        head = pickle.dumps((det, sorted(series)), protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        det.series = series
    parts = {
        r: pickle.dumps(series[r], protocol=pickle.HIGHEST_PROTOCOL) for r in ranks if r in series
    }
    return head, parts


def load_state(blob: bytes, rank_blob: Callable[[int], bytes | None]) -> RunDetector | None:
    """Rebuild a run's detector from its value and its ranks' (``rank_blob(rank)``); only our
    allowlisted state classes can be constructed. A state stored whole (one value per run)
    loads as it is; a rank whose series is missing starts afresh."""
    head = _unpickle(blob)
    if isinstance(head, RunDetector):
        return head
    if not (isinstance(head, tuple) and len(head) == 2 and isinstance(head[0], RunDetector)):
        return None
    det, ranks = head
    for rank in ranks:
        part = rank_blob(rank)
        series = _unpickle(part) if part else None
        if isinstance(series, detector.RankSeries):
            det.series[rank] = series
        else:
            log.warning("no stored state for rank %s of run %s; it starts afresh", rank, det.run_id)
    return det


def _unpickle(blob: bytes) -> Any:
    try:
        return RestrictedUnpickler(io.BytesIO(blob)).load()
    except Exception:
        log.warning("could not restore a stored state; starting it afresh", exc_info=True)
        return None


# Longest a fetch waits at the broker for new records. Faust builds its consumer with 1,500 ms,
# and aiokafka keeps one fetch in flight per broker, for the partitions that hold no fetched
# records yet: a fetch for by-run partitions alone (the raw ones still held records when it
# went) then held back every raw partition, and with them the by-run records they route to,
# until it timed out. At full resolution the worker fell seconds behind with its loop idle.
FETCH_WAIT_MS = 100


def set_fetch_wait(consumer: Any, ms: int) -> int | None:
    """Set the fetch wait of Faust's aiokafka consumer (its fetcher reads it for each request;
    aiokafka takes it only as an argument, which Faust fixes); returns the wait in use, or None
    where the consumer is not there (not started, or another client library)."""
    fetcher = getattr(
        getattr(getattr(consumer, "_thread", None), "_consumer", None), "_fetcher", None
    )
    if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
        return None
    fetcher._fetch_max_wait_ms = ms
    return int(fetcher._fetch_max_wait_ms)


@dataclass
class WorkerSettings:
    bootstrap: str
    topics: Topics
    app_id: str = "steplens-worker"
    state_dir: str = "tmp/state"
    faust_web_port: int = 0  # 0: Faust's web server off
    batch: int = 1000
    within_s: float = 0.2
    fetch_wait_ms: int = FETCH_WAIT_MS
    by_run_partitions: int = 8
    signal_every: int = 50  # publish a non-breaching signal per rank and rule every N steps
    signal_interval_s: float = 15.0  # ... and at most once in this many seconds (a scrape)
    # a run's state goes to the table at most this often; its messages are acknowledged then
    checkpoint_s: float = 5.0
    fit_workers: int = 1
    max_pending_fits: int = 4096  # queued or running; past it a fit is skipped (asked again)
    fit_batch: int = 64  # fits per pool job at most
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    webhook_url: str | None = None
    session_timeout_s: float = 10.0  # a SIGKILLed worker's partitions move after this
    log_level: str = "warning"


def ensure_worker_topics(s: WorkerSettings, timeout_s: float = 30.0) -> None:
    """Create the steplens topics and the internal by-run topic if they do not exist."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from steplens.producer.settings import kafka_security_config
    from steplens.producer.topics import ensure_topics

    ensure_topics(s.bootstrap, s.topics, timeout_s)
    admin = AdminClient({"bootstrap.servers": s.bootstrap, **kafka_security_config()})
    name = f"{s.app_id}-by-run"
    if name in admin.list_topics(timeout=timeout_s).topics:
        return
    new = NewTopic(
        name,
        num_partitions=s.by_run_partitions,
        replication_factor=1,
        config={
            "retention.ms": str(24 * 3600 * 1000),
            "max.message.bytes": str(BY_RUN_MAX_BYTES),
        },
    )
    for fut in admin.create_topics([new], operation_timeout=timeout_s).values():
        try:
            fut.result(timeout=timeout_s)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


# A by-run message carries raw messages of one run as JSON strings; a batch of a backlog can
# hold megabytes of one run (step batches), more than Kafka takes in one message (1 MiB by
# default), so a run's share of a batch is cut into messages of about this many text bytes.
BY_RUN_MESSAGE_BYTES = 256 << 10
# one raw message alone (up to schema.MAX_RECORD_BYTES) must fit, escaped as a JSON string
BY_RUN_MAX_BYTES = 4 << 20


# a record batch stays under the 1 MiB Kafka takes by default per message (signals, changelog)
PRODUCER_BATCH_BYTES = 512 << 10
# table writes (checkpoint values, tens of KB each) that may wait to be sent before Faust holds
# back consumption
PRODUCER_BUFFER_MESSAGES = 1024
# routed batches whose commit (after their by-run writes are acknowledged) may be pending
# while the route agent takes the next ones
ROUTED_IN_FLIGHT = 8


def by_run_chunks(items: list[list[Any]], budget: int = BY_RUN_MESSAGE_BYTES) -> list[list[Any]]:
    """``items`` ([partition, offset, text]) in order, cut where the texts pass ``budget``
    bytes (an item larger than that goes alone)."""
    out: list[list[Any]] = []
    chunk: list[Any] = []
    size = 0
    for item in items:
        n = len(item[2]) + 32
        if chunk and size + n > budget:
            out.append(chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        out.append(chunk)
    return out


def _run_of_key(key: bytes | None) -> str | None:
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    run, sep, rank = text.rpartition(":")
    return run if sep and run and rank.lstrip("-").isdigit() else None


class Worker:
    """Everything the agents share: settings, metrics, per-run cache, the fit pool."""

    def __init__(self, s: WorkerSettings, metrics: WorkerMetrics) -> None:
        allow_state_classes()
        t = time.perf_counter()
        kernels.warm_up()  # not at the first batch: compiled once per machine, then cached
        log.info("compiled detector loops ready in %.1f s", time.perf_counter() - t)
        self.s = s
        self.metrics = metrics
        self.cache: dict[str, RunDetector] = {}
        self.saved_at: dict[str, float] = {}
        # by-run partition -> run -> its messages scored since its last checkpoint (not yet
        # acknowledged)
        self.held: dict[int, dict[str, list[Any]]] = {}
        self.quiet = QuietLimiter(s.signal_every, s.signal_interval_s)
        self.fits = FitQueue(
            None,
            s.detector.arima.order,
            s.detector.arima.method,
            self._fitted,
            jobs=s.fit_workers,
            max_batch=s.fit_batch,
            max_pending=s.max_pending_fits,
            on_job=lambda n: self.metrics.fit_jobs.inc(),
        )
        self.consumed = 0
        # the commit of the last routed batch; each waits for the one before it
        self.routed: asyncio.Future[None] | None = None
        self.routed_pending = 0
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.notifier = WebhookNotifier(s.webhook_url) if s.webhook_url else None
        self.app = faust.App(
            s.app_id,
            broker=f"kafka://{s.bootstrap}",
            store="memory://",
            datadir=s.state_dir,
            web_enabled=s.faust_web_port > 0,
            web_bind="127.0.0.1",
            web_host="127.0.0.1",
            web_port=s.faust_web_port or 6066,
            topic_partitions=s.by_run_partitions,
            consumer_auto_offset_reset="earliest",
            broker_session_timeout=s.session_timeout_s,
            broker_heartbeat_interval=max(0.5, s.session_timeout_s / 4),
            producer_linger_ms=5,
            producer_max_request_size=BY_RUN_MAX_BYTES,
            # a batch per partition per produce request (aiokafka sends one request per broker
            # at a time): at Faust's 16 KiB each rank's checkpoint value went alone in a batch
            producer_max_batch_size=PRODUCER_BATCH_BYTES,
            table_cleanup_interval=60.0,
            # by-run messages stay unacknowledged until their run's next checkpoint: a
            # rebalance must not wait for them (they are scored again by the new owner)
            stream_wait_empty=False,
        )
        app = self.app
        self.raw = app.topic(s.topics.raw, key_serializer="raw", value_serializer="raw")
        self.by_run = app.topic(
            f"{s.app_id}-by-run",
            key_serializer="raw",
            value_serializer="raw",
            partitions=s.by_run_partitions,
            internal=True,
        )
        self.alerts = app.topic(s.topics.alerts, key_serializer="raw", value_serializer="raw")
        self.dead = app.topic(s.topics.dead_letters, key_serializer="raw", value_serializer="raw")
        self.table: Any = app.tables.add(
            StateTable(
                app,
                name="runs",
                beacon=app.tables.beacon,
                default=None,
                partitions=s.by_run_partitions,
                key_type=str,
                value_type=bytes,
            )
        )
        app.agent(self.raw, name="route")(self._route)
        app.agent(self.by_run, name="detect")(self._detect)
        app.timer(2.0)(self._report)
        app.timer(max(1.0, s.checkpoint_s))(self._nudge_quiet_runs)
        app.on_partitions_revoked.connect(cast(Any, self._revoked))
        app.on_partitions_assigned.connect(cast(Any, self._assigned))
        app.task(self._startup)
        self._rate_mark = (time.monotonic(), 0)

    # ------------------------------------------------------------------ lifecycle
    async def _startup(self) -> None:
        # Table writes wait in Faust's producer buffer, and past ``max_messages`` (100) Faust
        # holds every fetched message back until it is under that again: a checkpoint writes
        # a value per rank at once, so each one stopped consumption (and warned) for wide runs
        self.app.producer.buffer.max_messages = PRODUCER_BUFFER_MESSAGES
        # Faust's worker leaves the root logger at DEBUG (its handler filters): every debug
        # call of faust and aiokafka then builds a record, a tenth of the loop's time under load
        with contextlib.suppress(ValueError):
            logging.getLogger().setLevel(self.s.log_level.upper())
        if self.s.detector.arima_enabled and self.s.fit_workers > 0:
            ctx = multiprocessing.get_context("spawn")
            self.pool = concurrent.futures.ProcessPoolExecutor(
                self.s.fit_workers, mp_context=ctx, initializer=background_priority
            )
            # each pool process loads statsmodels (seconds) now, not at the first run's first fit
            for _ in range(self.s.fit_workers):
                self.pool.submit(arima.warm_up)
            self.fits.pool = self.pool
        if self.notifier:
            await self.notifier.start()

    async def _revoked(self, app: faust.App, revoked: Any, **kw: Any) -> None:
        # another worker may own these runs now: reload from the table when they come back
        self.cache.clear()
        self.saved_at.clear()
        # not acknowledged: whoever owns these runs now scores those messages again
        self.held.clear()

    async def _assigned(self, app: faust.App, assigned: Any, **kw: Any) -> None:
        raw = sum(1 for tp in assigned if tp.topic == self.s.topics.raw)
        self.metrics.assigned.set(raw)
        self._fetch_wait()

    def _fetch_wait(self) -> None:
        ms = set_fetch_wait(self.app.consumer, self.s.fetch_wait_ms)
        if ms is None:
            log.warning("the consumer's fetch wait could not be set; it stays Faust's 1.5 s")
            return
        self.metrics.fetch_wait.set(ms / 1000)

    async def _report(self) -> None:
        now = time.monotonic()
        t0, n0 = self._rate_mark
        self.metrics.rate.set((self.consumed - n0) / max(now - t0, 1e-6))
        self._rate_mark = (now, self.consumed)
        consumer = self.app.consumer
        lag = 0
        try:
            for tp in consumer.assignment():
                if tp.topic != self.s.topics.raw:
                    continue
                high = consumer.highwater(tp)
                seen = getattr(consumer, "_committed_offset", {}).get(tp)
                if high is not None and seen is not None:
                    lag += max(0, high - seen)
        except Exception:  # lag is best effort; never take the worker down for it
            log.debug("consumer lag unavailable", exc_info=True)
        self.metrics.lag.set(lag)

    # ------------------------------------------------------------------ route
    async def _route(self, stream: Any) -> None:
        async for events in stream.take_events(self.s.batch, within=self.s.within_s):
            groups: dict[str, list[list[Any]]] = {}
            for ev in events:
                msg = ev.message
                value = msg.value
                run = _run_of_key(msg.key)
                try:
                    text = value.decode("utf-8") if value is not None else None
                except UnicodeDecodeError as exc:
                    await self._dead(
                        f"not valid UTF-8: {exc}", value, run, msg.key, msg.partition, msg.offset
                    )
                    continue
                if run is None:
                    got = decode(text)
                    if isinstance(got, DecodeError):
                        await self._dead(str(got), value, None, msg.key, msg.partition, msg.offset)
                        continue
                    run = got.run_id
                groups.setdefault(run, []).append([msg.partition, msg.offset, text])
            sent = [
                await self.by_run.send(key=run.encode(), value=orjson.dumps(chunk))
                for run, items in groups.items()
                for chunk in by_run_chunks(items)
            ]
            self.routed_pending += 1
            self.routed = asyncio.ensure_future(self._commit_after(self.routed, events, sent))
            if self.routed_pending >= ROUTED_IN_FLIGHT:
                await self.routed  # and every one before it

    async def _commit_after(
        self, before: asyncio.Future[None] | None, events: list[Any], sent: list[Any]
    ) -> None:
        """``_commit_routed`` once the batches routed before this one are committed: the route
        agent goes on to its next batch while the broker acknowledges this one's by-run writes
        (waiting cost it half its time), and a raw offset is still never committed before the
        by-run writes of every message below it. A failed one fails every later one."""
        try:
            if before is not None:
                await before
            await self._commit_routed(events, sent)
        finally:
            self.routed_pending -= 1

    async def _commit_routed(self, events: list[Any], sent: list[Any]) -> None:
        """Commit the batch's raw offsets once its by-run writes are acknowledged.

        A worker killed after forwarding a batch then leaves a committed position on every raw
        partition it routed, and one killed before the acknowledgement leaves the old position
        (the batch is routed again and the detectors skip what they already applied). Without
        this, raw partitions were committed only on Faust's commit interval: a worker killed
        before its first commit left a partition without any committed offset, and the workers
        that took over did not resume it.
        """
        if not events:
            return
        for fut in sent:
            await fut  # delivery of the forwarded batch
        offsets: dict[TP, int] = {}
        for ev in events:
            msg = ev.message
            tp = TP(msg.topic, msg.partition)
            offsets[tp] = max(offsets.get(tp, 0), msg.offset + 1)
        consumer: Any = self.app.consumer  # the commit of explicit offsets is not public
        mine = consumer.assignment()
        offsets = {tp: off for tp, off in offsets.items() if tp in mine}
        if not offsets:
            return
        try:
            if await consumer._commit(offsets):
                done = consumer._committed_offset
                for tp, off in offsets.items():
                    done[tp] = max(done.get(tp) or 0, off)
        except Exception:  # a rebalance in between: the batch is routed again, and skipped
            log.debug("commit of routed offsets failed", exc_info=True)

    async def _dead(  # noqa: PLR0917
        self,
        reason: str,
        payload: bytes | None,
        run: str | None,
        key: Any,
        partition: int,
        offset: int,
    ) -> None:
        self.metrics.dead_letters.labels(reason_class(reason)).inc()
        body = dead_letter_bytes(
            reason,
            payload,
            source_topic=self.s.topics.raw,
            partition=partition,
            offset=offset,
            consumer=self.s.app_id,
            run_id=run,
        )
        await self.dead.send(key=key if isinstance(key, bytes) else None, value=body)

    # ------------------------------------------------------------------ detect
    def _detector(self, run: str) -> RunDetector:
        det = self.cache.get(run)
        if det is None:
            blob = self.table.get(run)
            det = load_state(blob, lambda r: self.table.get(rank_key(run, r))) if blob else None
            if det is None:
                det = RunDetector(run, self.s.detector, fit_inline=False)
            else:
                det.cfg = self.s.detector
                det.fit_inline = False
                det.touched.update(det.series)
                for rs in det.series.values():  # fits in flight died with the old worker
                    for a in rs.arimas.values():
                        a.wants_fit = False
                        if a.params is None and len(a.history) >= self.s.detector.arima.first_fit:
                            a.next_fit = a.seen  # warm start: refit from the stored history
            self.cache[run] = det
        return det

    async def _detect(self, stream: Any) -> None:
        """Score each by-run message into its run's detector. A message is acknowledged (its
        offset may then be committed) only once a checkpoint of its run holds it, so a worker
        killed between checkpoints leaves those messages to be scored again, not lost."""
        stream = stream.noack()
        async for event in stream.events():
            run = event.key.decode() if isinstance(event.key, bytes) else str(event.key)
            items = orjson.loads(event.value)
            det = self._detector(run)
            seen = det.offsets
            for partition, offset, text in items:
                if offset <= seen.get(partition, -1):
                    continue  # replayed after a restart: already in this state
                seen[partition] = offset
                rec = decode(text)
                if isinstance(rec, DecodeError):
                    await self._dead(str(rec), text.encode(), run, None, partition, offset)
                    continue
                try:
                    await self._process(det, rec)
                except ValueError as exc:  # a record the detectors refuse, with the reason
                    await self._dead(str(exc), text.encode(), run, None, partition, offset)
                except Exception as exc:  # one record must not stop every run's detection
                    log.exception("record not processed (run %s, offset %s)", run, offset)
                    reason = f"processing: {type(exc).__name__}: {exc}"
                    await self._dead(reason, text.encode(), run, None, partition, offset)
            self._submit_fits(run, det)
            # this run and the others of its by-run partition that are due: table writes go
            # to the changelog partition of the message being processed, theirs too
            held = self.held.setdefault(event.message.partition, {})
            held.setdefault(run, []).append(event)
            now = time.monotonic()
            due = [r for r in held if now - self.saved_at.get(r, 0.0) >= self.s.checkpoint_s]
            for other in due:
                await self._checkpoint(stream, other, held.pop(other), now)

    async def _nudge_quiet_runs(self) -> None:
        """A run that went quiet holds its last messages until its next checkpoint, which comes
        with a message of its by-run partition (table writes need one). Each such run past
        ``checkpoint_s`` is sent an empty by-run message: the detect agent then checkpoints it
        and acknowledges them, and its partition's offsets are committed."""
        now = time.monotonic()
        quiet = [
            run
            for held in self.held.values()
            for run in held
            if now - self.saved_at.get(run, 0.0) >= self.s.checkpoint_s
        ]
        for run in quiet:
            await self.by_run.send(key=run.encode(), value=b"[]")

    async def _checkpoint(self, stream: Any, run: str, events: list[Any], now: float) -> None:
        """Write ``run``'s changed state to the table, then acknowledge ``events``, the messages
        it holds (Faust flushes the changelog writes before it commits their offsets)."""
        det = self.cache[run]
        head, ranks = dump_state(det, det.take_touched())
        for rank, blob in ranks.items():  # before the head that lists them
            self.table[rank_key(run, rank)] = blob
        self.table[run] = head
        self.saved_at[run] = now
        for event in events:
            await stream.ack(event)

    async def _process(self, det: RunDetector, rec: Record) -> None:
        if rec.kind == "step_batch":
            await self._process_batch(det, rec)
            return
        self.consumed += 1
        self.metrics.records.labels(rec.kind).inc()
        sigs, alerts = det.process(rec)
        run = det.run_id
        now = time.monotonic()
        wanted = self.quiet.wanted
        await self._publish(run, [s for s in sigs if wanted(run, s, now)], alerts, rec.time_ns)

    async def _process_batch(self, det: RunDetector, rec: Record) -> None:
        """A step_batch: its steps scored together; breaches and the quiet signals the limiter
        lets through are built and published, the others never are."""
        entries = rec.data["records"]
        self.consumed += len(entries)
        self.metrics.records.labels("step").inc(len(entries))
        parts, alerts = det.process_entries(rec.rank, entries)
        run = det.run_id
        now = time.monotonic()
        out: list[Signal] = []
        for part in parts:
            sigs = part.signals
            if isinstance(sigs, SignalRun):
                out += [sigs.signal(k) for k in self.quiet.picked(run, sigs, now)]
            elif isinstance(sigs, SignalGrid):
                out += self.quiet.picked_grid(run, sigs, now)
            else:
                out += [sig for got in sigs for sig in got if self.quiet.wanted(run, sig, now)]
        await self._publish(run, out, alerts, rec.time_ns)

    async def _publish(
        self, run: str, sigs: list[Signal], alerts: list[Alert], time_ns: int
    ) -> None:
        """Send a record's signals (those the limiter let through) and alert transitions; the
        signal latency is measured from the record's ``time_ns``."""
        key = run.encode()
        # the producer itself: a Faust topic's send (its message futures, callbacks and
        # sensors) cost more than encoding the signal, for hundreds of signals a second
        send = self.app.producer.send
        topic = self.s.topics.signals
        for sig in sigs:
            await send(topic, key, signal_bytes(run, sig), None, None, None)
        if sigs:
            self.metrics.signals.inc(len(sigs))
        for a in alerts:
            await self.alerts.send(key=key, value=alert_bytes(a))
            self.metrics.alerts.labels(a.state, a.severity).inc()
            if self.notifier:
                self.notifier.notify(a)
        if (sigs or alerts) and time_ns:
            self.metrics.latency.observe(max(0.0, time.time() - time_ns / 1e9))

    def _submit_fits(self, run: str, det: RunDetector) -> None:
        if not det.fits_wanted:
            return
        for key, values in det.pending_fits():
            if not self.fits.want((run, key), values):
                det.apply_fit(key, None)  # skipped; asked again at its next scheduled refit
                self.metrics.fits.labels("skipped").inc()

    def _fitted(self, key: Any, params: arima.ArimaParams | None) -> None:
        run, fit_key = key
        self.metrics.fits.labels("ok" if params is not None else "failed").inc()
        det = self.cache.get(run)
        if det is not None:
            det.apply_fit(fit_key, params)
