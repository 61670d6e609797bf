"""The Monitor: the API the training loop calls.

The caller's side of every call only captures values (no host sync) and appends one named item
to a bounded deque (drop-oldest, counted); the worker thread (``pipeline.Pipeline``) does the
rest: resolve, enrich, window/sample/guard, encode (``sender``) and deliver (``delivery``,
Kafka with a disk spool). Nothing raises into the caller after construction. A forked child
never reuses its parent's queue, thread or Kafka client. ``shutdown`` runs at exit too, and an
exit signal flushes first (``exit_signals``), so the last window of a run is sent.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import re
import threading
import time
import weakref
from collections import deque
from typing import Any

from steplens.producer import checks
from steplens.producer import values as V
from steplens.producer.advice_inbox import AUTO, Advice, AdviceDesk, AdviceInbox, AdviceSource
from steplens.producer.advice_relay import advice_source
from steplens.producer.caller_counts import CallerCounts
from steplens.producer.config import ProducerConfig
from steplens.producer.delivery import Delivery
from steplens.producer.exit_signals import install as install_exit_signals
from steplens.producer.identity import resolve_identity
from steplens.producer.instruments import Instruments
from steplens.producer.items import (
    FlushItem,
    Item,
    MetaItem,
    RecordItem,
    StepItem,
    new_item,
)
from steplens.producer.pipeline import Pipeline
from steplens.producer.sender import Sender
from steplens.producer.spool import Spool
from steplens.producer.transport import Transport, kafka_transport
from steplens.schema import MAX_STR_LEN

log = logging.getLogger("steplens")

_PLAIN = V.PLAIN
_all_plain = V.PLAIN.issuperset  # _all_plain(map(type, values)): no tensor to capture
_monotonic_ns = time.monotonic_ns

_LIVE: weakref.WeakSet[Monitor] = weakref.WeakSet()
_ABANDONED_AFTER_FORK: list[Any] = []  # parents' Kafka clients: never used nor destroyed in a child


def _after_fork_in_child() -> None:
    for monitor in list(_LIVE):
        monitor._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _shutdown_at_exit(ref: weakref.ref[Monitor]) -> None:
    monitor = ref()
    if monitor is not None:
        monitor.shutdown()


def _end_all(keep_running: bool) -> None:
    """An exit signal (``exit_signals``): every Monitor of this process flushes (``keep_running``)
    or shuts down, each within its ``shutdown_timeout_s``."""
    for monitor in list(_LIVE):
        monitor.end_at_signal(keep_running)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100] or "run"


class Monitor(Instruments):
    """Telemetry of one training process. Usable as a context manager.

    >>> with Monitor(run_id="demo", transport=MemoryTransport(), hw_interval_s=0) as m:
    ...     m.log_step(1, loss=2.5, lr=3e-4)
    """

    def __init__(
        self,
        run_id: str | None = None,
        *,
        transport: Transport | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        **config: Any,
    ) -> None:
        self.config = ProducerConfig.resolve(**config)
        self.identity = resolve_identity(run_id, rank, local_rank, world_size)
        self.run_id = self.identity.run_id
        self.rank = self.identity.rank
        self._given_transport = transport
        self.counts = CallerCounts()
        self.errors = self.counts.errors  # steplens.producer.init counts calls made before it
        self._data_ns: int | None = None  # time spent in a timed DataLoader since the last step
        self._loader_batch: tuple[Any, Any, Any] | None = None
        self._loader_batches = 0
        self._watch_pending: dict[str, Any] | None = None
        self._watchers: list[Any] = []
        self._remedies: Any = None  # made by the first skipping() or act()
        self._comm: Any = None
        self._comm_timers: list[Any] = []
        self._hw: Any = None
        self._exporter: Any = None
        self._closed = False
        self._wall_offset_ns = time.time_ns() - time.monotonic_ns()
        self._started_ms = time.time_ns() // 1_000_000  # advice from then on
        self._relay_missing = False  # the node relays no advice: this rank reads Kafka
        self._creator_pid = os.getpid()  # the process that may act on advice (no forked child)
        self._init_process_state()
        self._put(MetaItem(_monotonic_ns(), self._run_meta()))
        if self.config.hw_interval_s > 0:
            self._start_hw()  # host-wide on local rank 0; the allocator's figures on the others
            if self.identity.local_rank == 0:
                self._start_exporter()
        _LIVE.add(self)
        atexit.register(_shutdown_at_exit, weakref.ref(self))
        if self.config.exit_signals:
            install_exit_signals(self.config.exit_signals, _end_all, self.config.shutdown_timeout_s)

    def _run_meta(self) -> dict[str, Any]:
        """The run_meta payload, with the checks of the design this rank turns on; rank 0 says
        them in one log line (a warning when one is off, with the line that turns it on)."""
        meta = self.config.run_meta(self.identity)
        found = checks.design_checks(self.config, self.identity)
        meta["checks"] = found
        if self.rank == 0:
            off = any(c["state"] == checks.OFF for c in found)
            summary = checks.summary(found, self.config.remedies)
            log.log(logging.WARNING if off else logging.INFO, "%s", summary)
        return meta

    # ------------------------------------------------------------------ process state
    def _init_process_state(self) -> None:
        self.pid = os.getpid()
        c = self.config
        self._q: deque[Item] = deque(maxlen=c.queue_max)
        self._qmax = c.queue_max
        self._wake_at = max(1, min(4096, self._qmax // 4))
        self._wake = threading.Event()
        self._needs_start = True
        self._accepting = True
        spool_dir = os.path.join(
            c.spool_dir, _safe_name(self.run_id), f"rank{self.rank}-pid{self.pid}"
        )
        spool = Spool(spool_dir, c.spool_max_bytes, adopt_root=c.spool_dir)
        self.delivery = Delivery(self._make_transport, spool)
        sender = Sender(self.identity, self.pid, self.delivery, self._wall_offset_ns)
        self._pipeline = Pipeline(c, self._q, sender, self._wake)
        self._pipeline.health_extra = self._caller_counters
        self._advice: deque[Advice] = deque()  # stays empty without remedies
        self._auto: deque[Advice] = deque()  # advice log_step carries out (a trace)
        self._due = False  # log_step has work: a trace to start or stop (``_auto_ready``)
        if self._takes_advice():
            inbox = AdviceInbox(
                self.run_id,
                self.rank,
                frozenset(c.remedies),
                queue_max=c.advice_queue_max,
                dead_letter=self._pipeline.dead_letter_advice,
                refused=self._pipeline.refuse_advice,
                ready=self._auto_ready,
                burst=c.advice_burst,
                refill_s=c.advice_refill_s,
            )
            self._pipeline.advice = AdviceDesk(inbox, self._make_advice_source)
            self._advice = inbox.queue
            self._auto = inbox.auto
        self._update_plain_path()

    def _takes_advice(self) -> bool:
        """Whether this process opens the advice consumer: a remedy on (``profile`` only
        where torch is installed), in the process that made the Monitor."""
        c = self.config
        if not c.remedies or self.pid != self._creator_pid or not self._advice_source_kind():
            return False
        return bool(set(c.remedies) - AUTO) or importlib.util.find_spec("torch") is not None

    def _auto_ready(self) -> None:
        """The worker thread: advice for ``log_step`` arrived. Its short path is left for
        ``_record_step_slowly``, which carries it out; said again on each poll while the
        advice waits (``AdviceDesk.poll``), so a concurrent ``_update_plain_path`` cannot
        lose it."""
        self._due = True
        self._plain_path = False

    def _advice_source_kind(self) -> bool:
        """Whether advice can come: from Kafka, or from a given transport that is a source."""
        given = self._given_transport
        return given is None or hasattr(given, "take_advice")

    def _make_advice_source(self) -> AdviceSource:
        """The given transport, else Kafka: on a node of several ranks, through the node's
        relay (``advice_relay``), its local rank 0 the one reader; a rank whose node relays
        nothing within a minute reads Kafka itself."""
        given = self._given_transport
        if given is not None:
            return given  # type: ignore[return-value]  # a MemoryTransport: see there
        return advice_source(
            self.config,
            self.identity,
            self._started_ms,
            per_node=not self._relay_missing,
            on_missing=self._no_relay,
        )

    def _no_relay(self) -> None:
        """The node's relay never appeared: this rank opens its own consumer from now on."""
        self._relay_missing = True
        log.warning("steplens: no advice relay from local rank 0 on this node: own consumer")

    def _start_exporter(self) -> None:
        """The node exporter (opt-in: ``exporter_port``), serving the sampler's samples."""
        c = self.config
        if c.exporter_port and self._hw is not None:
            from steplens.producer.exporter import start_exporter

            self._exporter = start_exporter(
                self._hw, self.run_id, self.identity.host, c.exporter_host, c.exporter_port
            )

    def _make_transport(self) -> Transport:
        given = self._given_transport
        return given if given is not None else kafka_transport(self.config, self.identity)

    def _after_fork_in_child(self) -> None:
        """A forked child never reuses the parent's queue, thread or Kafka client."""
        if self.delivery.transport is not None and self._given_transport is None:
            _ABANDONED_AFTER_FORK.append(self.delivery.transport)
        desk = self._pipeline.advice
        if desk is not None and desk.source is not None and self._given_transport is None:
            _ABANDONED_AFTER_FORK.append(desk.source)
        self._hw = None  # one sampler per host: the parent's
        if self._exporter is not None:
            self._exporter.forget_in_child()
            self._exporter = None
        self._comm = None
        self._init_process_state()
        self._accepting = not self._closed
        self._update_plain_path()

    def _start(self) -> None:
        self._needs_start = False
        self._pipeline.thread.start()
        self._update_plain_path()

    def _put(self, item: Item) -> None:
        if self._needs_start:
            self._start()
        q = self._q
        n = len(q)
        q.append(item)
        if n >= self._wake_at:
            self._filling(n)

    def _filling(self, n: int) -> None:
        """The queue held ``n`` items (at least ``_wake_at``) before an append: count the item
        the append pushed out of a full queue, and wake the worker."""
        if n >= self._qmax:
            self.counts.queue_full += 1
        if not self._wake.is_set():  # set() takes a lock: once
            self._wake.set()

    def log_step(
        self,
        step: int,
        loss: Any = None,
        lr: Any = None,
        grad_norm: Any = None,
        tokens: Any = None,
        **scalars: Any,
    ) -> None:
        """One training step. Numbers or 0-dim tensors (CUDA included, no host sync)."""
        self.record_step(step, loss, lr, grad_norm, tokens, scalars)

    def record_step(  # noqa: PLR0917 - the hot path: positional, no keyword re-packing
        self,
        step: int,
        loss: Any,
        lr: Any,
        grad_norm: Any,
        tokens: Any,
        scalars: dict[str, Any],
    ) -> None:
        """``log_step`` with the scalars as one dict (the module-level ``log_step`` calls this).

        The common case (running, plain numbers, no timed loader, watch or probe) costs a type
        check per value and one append; everything else takes ``_record_step_slowly``."""
        try:
            if (
                self._plain_path
                and type(loss) in _PLAIN
                and type(lr) in _PLAIN
                and type(grad_norm) in _PLAIN
                and type(tokens) in _PLAIN
                and (not scalars or _all_plain(map(type, scalars.values())))
            ):
                q = self._q
                n = len(q)  # _put inlined: this is the hot path
                item = (step, _monotonic_ns(), loss, lr, grad_norm, tokens, scalars, None, None)
                q.append(new_item(StepItem, item))
                if n >= self._wake_at:  # _wake_at <= _qmax: one test in the common case
                    self._filling(n)
            else:
                self._record_step_slowly(step, loss, lr, grad_norm, tokens, scalars)
        except Exception:
            self.counts.caller += 1

    def _record_step_slowly(  # noqa: PLR0917
        self, step: int, loss: Any, lr: Any, grad_norm: Any, tokens: Any, scalars: dict[str, Any]
    ) -> None:
        if not self._accepting:
            self.counts.refused += 1
            return
        names = list(scalars)
        vals = V.capture([loss, lr, grad_norm, tokens, *scalars.values()])
        data_ns = self._data_ns
        if data_ns is not None:
            self._data_ns = 0
        watch, self._watch_pending = self._watch_pending, None
        t_ns = _monotonic_ns()
        item = (step, t_ns, *vals[:4], dict(zip(names, vals[4:], strict=True)))
        self._put(new_item(StepItem, (*item, data_ns, watch)))
        if self._loader_batch is not None:
            batch = self._loader_batch_item(step, t_ns)
            if batch is not None:
                self._put(batch)
        if self._comm is not None:
            self._comm.maybe_run(step)
        if self._due:
            self._due = False
            remedies = self.remedies
            remedies.at_step(step)
            self._due = remedies.tracing or bool(self._auto)
            self._update_plain_path()

    def _update_plain_path(self) -> None:
        """Whether ``record_step`` may take its short path (see there)."""
        self._plain_path = (
            self._accepting
            and not self._needs_start
            and self._data_ns is None
            and not self._watchers
            and self._comm is None
            and not self._due
        )

    # ------------------------------------------------------------------ advice
    def advice(self) -> tuple[Advice, ...]:
        """The advice that arrived since the last call (``init(remedies=[...])``), oldest
        first; never waits. Call it at a step boundary: ``for a in sl.advice(): ...``."""
        q = self._advice
        if not q:
            return ()
        try:
            return tuple([q.popleft() for _ in range(len(q))])
        except Exception:
            self.counts.caller += 1
            return ()

    def auto_advice(self) -> tuple[Advice, ...]:
        """The advice the rank carries out without ``sl.advice()`` (``profile``) that
        arrived since the last call; for ``Remedies``."""
        q = self._auto
        return tuple([q.popleft() for _ in range(len(q))]) if q else ()

    def acted(
        self, advice: Advice, outcome: str, detail: str | None = None, step: int | None = None
    ) -> None:
        """Say what this rank did with ``advice``: ``acted``, ``declined``, ``failed`` or
        ``refused``, with ``detail`` (what was done, or why not); at ``step`` or the last
        step logged. An ``acted`` record."""
        try:
            if not self._accepting:
                self.counts.refused += 1
                return
            data: dict[str, Any] = {
                "action": advice.action,
                "fingerprint": advice.fingerprint,
                "outcome": outcome,
            }
            if detail is not None:
                data["detail"] = str(detail)[:MAX_STR_LEN]
            self._put(RecordItem("acted", step, _monotonic_ns(), data))
        except Exception:
            self.counts.caller += 1

    def checkpoint(self, step: int, path: Any) -> None:
        """Say that a checkpoint of ``step`` was saved at ``path`` (which a rewind may name).
        A ``checkpoint`` record."""
        try:
            if not self._accepting:
                self.counts.refused += 1
                return
            data = {"path": os.fspath(path)}
            self._put(RecordItem("checkpoint", step, _monotonic_ns(), data))
            if "rewind" in self.config.remedies:  # the checkpoints a rewind may reload
                self.remedies.reported(step, data["path"])
        except Exception:
            self.counts.caller += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything logged so far is delivered; False when ``timeout_s`` ran out."""
        return self._flush(timeout_s, ending=False)

    def _flush(self, timeout_s: float, ending: bool) -> bool:
        """``flush``; ``ending``: stop waiting once Kafka does not answer (``Delivery.flush``)."""
        try:
            if not self._accepting:
                self.counts.refused += 1
                return False
            done = threading.Event()
            result: list[bool] = []
            self._put(FlushItem(done, time.monotonic() + timeout_s, result, ending))
            self._wake.set()
            done.wait(timeout_s + 0.5)
            return bool(result and result[0])
        except Exception:
            self.counts.caller += 1
            return False

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush, stop the threads and close the connection; later calls are ignored."""
        try:
            if self._closed:
                return
            self._closed = True
            self._accepting = False
            self._update_plain_path()
            timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
            for w in self._watchers:
                w.remove()
            if self._remedies is not None:
                self._remedies.close(timeout_s=timeout)
            if self._hw is not None:
                self._hw.stop(min(1.0, timeout))
            if self._exporter is not None:
                self._exporter.stop()
            if self._needs_start:
                if self.delivery.transport is None and not len(self._q):
                    return  # never logged in this process: nothing to deliver, never connected
                self._start()
            self._pipeline.stop(timeout)
        except Exception:
            self.counts.caller += 1

    close = shutdown

    def end_at_signal(self, keep_running: bool) -> None:
        """An exit signal arrived (``exit_signals``): flush, then go on (``keep_running``) or
        shut down; a shutdown already under way is waited for. Within ``shutdown_timeout_s``."""
        if self._needs_start and self.delivery.transport is None and not len(self._q):
            return  # never logged in this process (a DataLoader worker): nothing to send
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        if self._accepting:
            self._flush(self.config.shutdown_timeout_s, ending=True)  # the last window first
            if keep_running:
                return
            self.shutdown(max(0.0, deadline - time.monotonic()))
        thread = self._pipeline.thread
        if thread.is_alive():  # a shutdown the signal interrupted: its worker still sends
            thread.join(max(0.0, deadline - time.monotonic()) + 1.0)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ producers of items
    # ------------------------------------------------------------------ counters
    def _caller_counters(self) -> tuple[dict[str, int], dict[str, int]]:
        dropped, errors = self.counts.health(self._hw)
        if self._remedies is not None:  # what the remedies refused, and shared advice late
            dropped.update(self._remedies.dropped())
            errors.update(self._remedies.errors())
        return dropped, errors

    @property
    def dropped(self) -> dict[str, int]:
        return self._pipeline.sender.dropped

    def stats(self) -> dict[str, Any]:
        """Counters as in the health record (for tests and debugging)."""
        c = self.counts
        out = self._pipeline.stats()
        out["errors"].update(c.errors)
        out.update(dropped_queue=c.queue_full, caller_errors=c.caller, refused=c.refused)
        out["remedies"] = {} if self._remedies is None else dict(self._remedies.counts)
        return out
