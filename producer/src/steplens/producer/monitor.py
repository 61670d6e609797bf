"""The Monitor: the API the training loop calls, made of its parts.

The caller's side of every call only captures values (no host sync) and appends one named item
to a bounded deque (drop-oldest, counted); the worker thread (``pipeline.worker.Pipeline``)
does the rest: resolve, enrich, window/sample/guard, encode (``pipeline.sender``) and deliver
(``delivery``, Kafka with a disk spool). The parts (``parts``): the delivery, the advice
source and the exporter, given or made from the settings; the instruments
(``instruments.watching``, ``instruments.loader_timing``, the hardware sampler, the comm
probe), each given what it needs. Nothing raises into the caller after construction. A forked
child never reuses its parent's queue, thread or Kafka client. ``shutdown`` runs at exit too,
and an exit signal flushes first (``exit_signals``), so the last window of a run is sent.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from steplens.producer import checks
from steplens.producer.caller_counts import CallerCounts
from steplens.producer.config import ProducerConfig
from steplens.producer.delivery.live_or_spool import Delivery
from steplens.producer.delivery.transport import Transport
from steplens.producer.exit_signals import install as install_exit_signals
from steplens.producer.identity import resolve_identity
from steplens.producer.instruments.hardware import HardwareSampler
from steplens.producer.instruments.loader_timing import LoaderTiming
from steplens.producer.instruments.watching import Watching
from steplens.producer.parts import Exporter, node_parts, process_parts
from steplens.producer.pipeline import values as V
from steplens.producer.pipeline.items import (
    BatchItem,
    CommItem,
    EvalItem,
    FlushItem,
    HwItem,
    Item,
    MetaItem,
    RecordItem,
    StepItem,
    new_item,
)
from steplens.producer.pipeline.sender import Sender
from steplens.producer.pipeline.worker import Pipeline
from steplens.producer.remedies.advice_inbox import AUTO, Advice, AdviceSource
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


_EVAL_FIELDS = ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")


class _Given(NamedTuple):
    """The parts the caller gave (None: made from the settings, again in a forked child)."""

    transport: Transport | None
    delivery: Delivery | None
    advice_source: AdviceSource | Callable[[], AdviceSource] | None


class Monitor:
    """Telemetry of one training process. Usable as a context manager.

    >>> with Monitor(run_id="demo", transport=MemoryTransport(), hw_interval_s=0) as m:
    ...     m.log_step(1, loss=2.5, lr=3e-4)

    Parts the settings would make can be given instead (``parts``): ``delivery`` (where
    encoded records go: a ``Delivery``), ``advice_source`` (where advice comes from: a
    source, or what opens one), ``exporter`` (serving the node's samples). A given part
    serves every process of the Monitor, a forked child's too.
    """

    def __init__(
        self,
        run_id: str | None = None,
        *,
        transport: Transport | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        delivery: Delivery | None = None,
        advice_source: AdviceSource | Callable[[], AdviceSource] | None = None,
        exporter: Exporter | None = None,
        **config: Any,
    ) -> None:
        self.config = ProducerConfig.resolve(**config)
        self.identity = resolve_identity(run_id, rank, local_rank, world_size)
        self.run_id = self.identity.run_id
        self.rank = self.identity.rank
        self._given = _Given(transport, delivery, advice_source)
        self.counts = CallerCounts()
        self.errors = self.counts.errors  # steplens.producer.init counts calls made before it
        self._watching = Watching(self.config, self.counts, self._enqueue_comm, self.identity.phase)
        self._loader = LoaderTiming(self.config, self.counts, self._update_plain_path)
        self._comm: Any = None  # a CommProbe (probe_comm)
        self._remedies: Any = None  # made by the first skipping() or act()
        self._hw: HardwareSampler | None = None  # the worker's health record reads it
        self._exporter: Exporter | None = None
        self._closed = False
        self._wall_offset_ns = time.time_ns() - time.monotonic_ns()
        self._started_ms = time.time_ns() // 1_000_000  # advice from then on
        self._creator_pid = os.getpid()  # the process that may act on advice (no forked child)
        self._init_process_state()
        self._put(MetaItem(_monotonic_ns(), self._run_meta()))
        # host-wide on local rank 0 (with the exporter); the allocator's figures on the others
        stall = self._pipeline.stall
        self._hw, self._exporter = node_parts(
            self.config,
            self.identity,
            self._enqueue_hw,
            exporter,
            paused=lambda: stall.paused(_monotonic_ns()),
        )
        _LIVE.add(self)
        atexit.register(_shutdown_at_exit, weakref.ref(self))

    def _run_meta(self) -> dict[str, Any]:
        """The run_meta payload, with the checks of the design this rank turns on; rank 0 says
        them in one log line (a warning when one is off, with the line that turns it on)."""
        meta = self._meta()
        found = meta["checks"]
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
        given = self._given
        parts = process_parts(
            c,
            self.identity,
            self.pid,
            transport=given.transport,
            delivery=given.delivery,
            advice_source=given.advice_source,
            started_ms=self._started_ms,
        )
        self.delivery = parts.delivery
        sender = Sender(self.identity, self.pid, self.delivery, self._wall_offset_ns)
        self._pipeline = Pipeline(
            c,
            self._q,
            sender,
            self._wake,
            caller_counters=self._caller_counters,
            open_advice=parts.open_advice if self._takes_advice(parts.open_advice) else None,
            advice_ready=self._auto_ready,
        )
        desk = self._pipeline.advice
        # the advice that arrived: for the loop (stays empty without remedies), for log_step
        self._advice: deque[Advice] = deque() if desk is None else desk.inbox.queue
        self._auto: deque[Advice] = deque() if desk is None else desk.inbox.auto
        self._due = False  # log_step has work: a trace to start or stop (``_auto_ready``)
        self._update_plain_path()

    def _takes_advice(self, open_advice: Callable[[], AdviceSource] | None) -> bool:
        """Whether this process opens the advice source: one can come, a remedy is on
        (``profile`` only where torch is installed), in the process that made the Monitor."""
        c = self.config
        if not c.remedies or self.pid != self._creator_pid or open_advice is None:
            return False
        return bool(set(c.remedies) - AUTO) or importlib.util.find_spec("torch") is not None

    def _auto_ready(self) -> None:
        """The worker thread: advice for ``log_step`` arrived. Its short path is left for
        ``_record_step_slowly``, which carries it out; said again on each poll while the
        advice waits (``AdviceDesk.poll``), so a concurrent ``_update_plain_path`` cannot
        lose it."""
        self._due = True
        self._plain_path = False

    def _after_fork_in_child(self) -> None:
        """A forked child never reuses the parent's queue, thread or Kafka client (a given
        part is the caller's: kept)."""
        given = self._given
        made_here = given.transport is None and given.delivery is None
        if self.delivery.transport is not None and made_here:
            _ABANDONED_AFTER_FORK.append(self.delivery.transport)
        desk = self._pipeline.advice
        if (
            desk is not None
            and desk.source is not None
            and made_here
            and given.advice_source is None
        ):
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
        if self.config.exit_signals:  # at the first record, again in a forked child that logs
            install_exit_signals(self.config.exit_signals, _end_all, self.config.shutdown_timeout_s)

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

    def _enqueue_hw(self, data: dict[str, Any]) -> None:
        """The hardware sampler's thread: one sample."""
        if self._accepting and self.pid == os.getpid():
            self._put(HwItem(time.monotonic_ns(), data))

    def _enqueue_comm(self, step: int | None, data: dict[str, Any], pending: Any) -> None:
        """A comm probe's or a DDP all-reduce timer's measurement."""
        if self._accepting:
            self._put(CommItem(step, time.monotonic_ns(), data, pending))

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
        loader = self._loader
        data_ns = loader.take_wait()
        watch = self._watching.take()
        t_ns = _monotonic_ns()
        item = (step, t_ns, *vals[:4], dict(zip(names, vals[4:], strict=True)))
        self._put(new_item(StepItem, (*item, data_ns, watch)))
        if loader.batch is not None:
            batch = loader.batch_item(step, t_ns)
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
            and self._loader.data_ns is None
            and not self._watching.watchers
            and self._comm is None
            and not self._due
        )

    # ------------------------------------------------------------------ beside log_step
    def log_eval(  # noqa: PLR0917 - the documented signature
        self,
        step: int,
        split: str = "val",
        loss: Any = None,
        perplexity: Any = None,
        accuracy: Any = None,
        f1: Any = None,
        bleu: Any = None,
        rouge: Any = None,
        *,
        predictions: Iterable[Any] | None = None,
        references: Iterable[Any] | None = None,
        **extra: Any,
    ) -> None:
        """Evaluation metrics of one split at one step. With ``predictions`` and
        ``references`` (one text each per example), BLEU and ROUGE-L are computed from them in
        the producer's worker thread (the ``text`` extra: sacrebleu, rouge-score)."""
        try:
            if not self._accepting:
                self.counts.refused += 1
                return
            named = (loss, perplexity, accuracy, f1, bleu, rouge)
            names = [*_EVAL_FIELDS, *extra]
            vals = V.capture([*named, *extra.values()])
            metrics = dict(zip(names, vals, strict=True))
            texts = None
            if predictions is not None or references is not None:
                texts = (list(predictions or ()), list(references or ()))
            self._put(EvalItem(step, time.monotonic_ns(), split, metrics, len(named), texts))
        except Exception:
            self.counts.caller += 1

    def log_batch(
        self,
        step: int,
        input_ids: Any,
        attention_mask: Any = None,
        labels: Any = None,
        max_len: int | None = None,
        *,
        sample_ids: Any = None,
        epoch: int | None = None,
        task: str | None = None,
        ignore_index: int = -100,
    ) -> None:
        """Data quality of one batch: lengths, over-length count, labels, sample hashes.

        ``labels``: one per sample (classification: counts per class) or per token (a
        language model, or ``task="lm"``: the share of labels other than ``ignore_index``).
        ``sample_ids``: the caller's ids of the samples (a list or a tensor), sent with the
        hashes; ``epoch``: the data's epoch (a sample seen again in a new epoch is no repeat).
        """
        try:
            if not self._accepting:
                self.counts.refused += 1
                return
            ids, mask, lab, sids = V.capture([input_ids, attention_mask, labels, sample_ids])
            if sids is not None and not hasattr(sids, "detach") and not hasattr(sids, "shape"):
                sids = list(sids)  # the caller may reuse its list
            item = (step, time.monotonic_ns(), ids, mask, lab, max_len, sids, epoch, task)
            self._put(BatchItem(*item, ignore_index))
        except Exception:
            self.counts.caller += 1

    def watch(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any = None,
        every: int = 100,
        max_grad_norm: float | None = None,
    ) -> None:
        """Every ``every`` optimizer steps: pre-clip gradient norm, clipping, parameter norm,
        per-layer gradient and parameter norms, update ratio and the learning rate the step
        used (a step logged without ``lr`` gets it), computed on the device.

        ``max_grad_norm``: the clipping threshold the loop uses. With it, a step is clipped when
        its pre-clip norm (the ``grad_norm`` given to log_step, else the one measured at the end
        of backward) exceeds it; without it, clipping is inferred from a uniform shrink of the
        gradients before ``optimizer.step()``, which gradient averaging done by hand between
        backward and step can imitate."""
        self._watching.watch(model, optimizer, scheduler, every, max_grad_norm)
        self._update_plain_path()

    def probe_comm(self, every: int = 100) -> None:
        """Every ``every`` steps (checked in log_step): a tiny timed all_reduce and a ring
        send/recv. Every rank must call log_step at the same steps."""
        try:
            if self._comm is not None and self._comm.every == every:
                return
            from steplens.producer.instruments.comm import CommProbe

            probe = CommProbe(self._enqueue_comm, max(1, int(every)))
            self._comm = probe if probe.usable else None
            self._update_plain_path()
        except Exception as exc:
            self.counts.caller += 1
            log.warning("steplens: probe_comm() disabled: %s", exc)

    def timed(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Wrap a DataLoader so the time spent waiting for each batch becomes data_time_s,
        and one batch in ``batch_every`` that holds token ids goes to the data-quality checks
        with the next step logged (``loader_batches``)."""
        return self._loader.timed(iterable)

    # ------------------------------------------------------------------ remedies
    @property
    def remedies(self) -> Any:
        """The remedies this run opted into (``init(remedies=[...])``): ``carry_out.Remedies``."""
        if self._remedies is None:
            from steplens.producer.remedies.carry_out import Remedies

            self._remedies = Remedies(self, getattr(self.config, "remedies", None) or ())
        return self._remedies

    def skipping(self, iterable: Iterable[Any], ids: Any = None) -> Any:
        """Wrap a DataLoader, sampler or dataset so the samples a remedy names are skipped
        for the rest of the run, and a rewind's batches after it (``skipping.Skipping``).
        Plain iteration when something goes wrong here."""
        try:
            return self.remedies.skipping(iterable, ids)
        except Exception:
            self.counts.caller += 1
            return iterable

    def act(self, step: int, **targets: Any) -> int:
        """Carry out the advice that arrived, at the end of ``step``; the step the model is at
        after it (a rewind's checkpoint step, else ``step``). ``targets``: ``model``,
        ``optimizer``, ``scheduler`` (default: the watched ones), ``load(path)``. Advice for
        every rank that changes the model waits for its ``at_step``; no collective, so a
        rank may call this at any steps (a late one is counted)."""
        try:
            r = self._remedies
            if r is None:
                r = self.remedies
            if not (self._advice or self._auto or r.busy() or "advice" in targets):
                return step  # the common case: nothing arrived, nothing under way
            return int(r.act(step, **targets))
        except Exception:
            self.counts.caller += 1
            return step

    def watched(self) -> tuple[Any, Any, Any]:
        """(model, optimizer, scheduler) of the first ``watch()`` (Nones without one)."""
        return self._watching.watched()

    def scale_declared_lr(self, from_step: int, factor: float) -> None:
        """The lr was multiplied by ``factor`` from ``from_step`` on (a remedy): send the
        declared schedule again with the factor in it (``lr_scale``), so the schedule check
        follows the new level and the change is an lr event. Nothing without a schedule."""
        if not self.config.lr_schedule:
            return
        from steplens.producer.remedies.lower_lr import scaled_schedule

        self._declare(scaled_schedule(self.config.lr_schedule, from_step, factor))

    def declare_schedule(self, schedule: dict[str, Any]) -> bool:
        """Declare the lr schedule after ``init`` (a trainer integration reads it from the
        trainer's arguments): ``run_meta`` again with it. A schedule declared at ``init`` is
        kept; True when this one was sent."""
        if self.config.lr_schedule:
            return False
        self._declare(dict(schedule))
        if self.identity.rank == 0:
            log.info("steplens checks: lr schedule on, declared after init: %s", schedule)
        return True

    def _declare(self, schedule: dict[str, Any]) -> None:
        self.config = dataclasses.replace(self.config, lr_schedule=schedule)
        self._put(MetaItem(time.monotonic_ns(), self._meta()))

    def _meta(self) -> dict[str, Any]:
        """The run_meta payload of the settings now, with the design checks they turn on."""
        meta = self.config.run_meta(self.identity)
        meta["checks"] = checks.design_checks(self.config, self.identity)
        return meta

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
            timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
            if self._hw is not None:  # first: its last sample (a short run's only one) is taken
                self._hw.stop(min(1.0, timeout))
            self._accepting = False
            self._update_plain_path()
            self._watching.remove()
            if self._remedies is not None:
                self._remedies.close(timeout_s=timeout)
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
