"""The Monitor: what the training loop calls, and the worker thread behind it.

The caller's side of every call only captures values and appends a tuple to a bounded deque
(drop-oldest, counted). A daemon worker resolves values, keeps the window aggregates, decides
what is sent raw, encodes and delivers. Nothing raises into the caller after construction.
With ``full_resolution`` the worker sends every step instead, in ``step_batch`` records, and no
windows or samples.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from steplens.producer import values as V
from steplens.producer.codec import encode
from steplens.producer.config import ProducerConfig, run_id_from_env
from steplens.producer.delivery import Delivery
from steplens.producer.identity import Identity, detect
from steplens.producer.schema import (
    MAX_RECORD_BYTES,
    MAX_STR_LEN,
    SCHEMA_VERSION,
    SchemaError,
    record_key,
)
from steplens.producer.spool import Spool
from steplens.producer.step_batch import Entry, StepBatch, halves, payload
from steplens.producer.transport import KafkaTransport, Transport, kafka_conf
from steplens.producer.window import Guard, Window, is_sampled, sample_period

log = logging.getLogger("steplens")

# queue item tags
_STEP, _EVAL, _BATCH, _HW, _COMM, _META, _FLUSH = range(7)
_all_plain = V.PLAIN.issuperset  # _all_plain(map(type, values)): no tensor to capture
_monotonic_ns = time.monotonic_ns
_STEP_NUMS = ("loss", "lr", "grad_norm")
# Step fields a caller may also pass as keyword scalars; the caller's value wins.
_PROMOTED = frozenset(("step_time_s", "data_time_s", "tokens_per_s", "mfu"))
# The worker releases the GIL after this many items, so a caller thread that wants it back
# waits for a slice (well under a millisecond), not for the interpreter's 5 ms switch interval.
_SLICE = 32
_release_gil = time.sleep  # time.sleep(0) drops and retakes the GIL

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


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100] or "run"


class Monitor:
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
        ident = detect(run_id or run_id_from_env())
        self.identity = Identity(
            ident.run_id,
            ident.rank if rank is None else rank,
            ident.local_rank if local_rank is None else local_rank,
            ident.world_size if world_size is None else world_size,
            ident.host,
        )
        if run_id is None and run_id_from_env() is None and self.identity.world_size > 1:
            log.warning(
                "steplens: no run id given (run_id= or STEPLENS_RUN_ID); this rank uses %s",
                self.identity.run_id,
            )
        self.run_id = self.identity.run_id
        self.rank = self.identity.rank
        self._key = record_key(self.run_id, self.rank)
        self._given_transport = transport
        self._period = sample_period(self.config.sample_rate)
        # counters (plain ints: the GIL makes += safe enough for counters)
        self.dropped: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self._dropped_queue = 0
        self._caller_errors = 0
        self._refused = 0
        self._data_ns: int | None = None  # time spent in a timed DataLoader since the last step
        self._watch_pending: dict[str, Any] | None = None
        self._watchers: list[Any] = []
        self._comm: Any = None
        self._hw: Any = None
        self._closed = False
        self._wall_offset_ns = time.time_ns() - time.monotonic_ns()
        self._init_process_state()
        self._emit_meta()
        if self.identity.local_rank == 0 and self.config.hw_interval_s > 0:
            self._start_hw()
        _LIVE.add(self)
        atexit.register(_shutdown_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ process state
    def _init_process_state(self) -> None:
        self.pid = os.getpid()
        self._q: deque[tuple[Any, ...]] = deque(maxlen=self.config.queue_max)
        self._qmax = self.config.queue_max
        self._wake_at = max(1, min(4096, self._qmax // 4))
        self._wake = threading.Event()
        self._stop = False
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._needs_start = True
        self._accepting = True
        self._seq = 0
        self._window = Window()
        c = self.config
        self._batch = StepBatch(c.batch_steps, c.batch_s) if c.full_resolution else None
        self._guard = Guard(self.config.guard_sigma, self.config.guard_warmup)
        self._last_step: tuple[int, int] | None = None  # (step, monotonic ns)
        self._held: tuple[Any, ...] | None = None  # an item waiting for its CUDA event
        self._next_health = time.monotonic() + self.config.health_interval_s
        spool = Spool(
            os.path.join(
                self.config.spool_dir,
                _safe_name(self.run_id),
                f"rank{self.rank}-pid{self.pid}",
            ),
            self.config.spool_max_bytes,
        )
        self.delivery = Delivery(self._make_transport, spool)

    def _make_transport(self) -> Transport:
        if self._given_transport is not None:
            return self._given_transport
        conf = kafka_conf(
            self.config.kafka_bootstrap,
            f"steplens-{self.run_id}-r{self.rank}"[:200],
            self.config.delivery_timeout_s,
            self.config.kafka_config,
        )
        return KafkaTransport(self.config.topic, conf)

    def _after_fork_in_child(self) -> None:
        """A forked child never reuses the parent's queue, thread or Kafka client."""
        if self.delivery.transport is not None and self._given_transport is None:
            _ABANDONED_AFTER_FORK.append(self.delivery.transport)
        self._hw = None  # one sampler per host: the parent's
        self._comm = None
        self._init_process_state()
        self._accepting = not self._closed

    def _start(self) -> None:
        self._needs_start = False
        self._thread = threading.Thread(target=self._run, name="steplens-producer", daemon=True)
        self._thread.start()

    def _start_hw(self) -> None:
        from steplens.producer.hardware import HardwareSampler

        self._hw = HardwareSampler(
            self._enqueue_hw, self.config.hw_interval_s, self.config.hw_slow_every
        )
        self._hw.start()

    # ------------------------------------------------------------------ caller side
    def _put(self, item: tuple[Any, ...]) -> None:
        if self._needs_start:
            self._start()
        q = self._q
        if len(q) >= self._qmax:
            self._dropped_queue += 1
        q.append(item)
        if len(q) >= self._wake_at and not self._wake.is_set():
            self._wake.set()

    def _refuse(self) -> None:
        self._refused += 1

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
        try:
            if not self._accepting:
                return self._refuse()
            vals = [loss, lr, grad_norm, tokens]
            if not _all_plain(map(type, vals)):
                V.capture(vals)
            extra: dict[str, Any] | None = None
            if scalars:
                extra = scalars
                if not _all_plain(map(type, scalars.values())):
                    extra = dict(zip(scalars, V.capture(list(scalars.values())), strict=True))
            data_ns = self._data_ns
            if data_ns is not None:
                self._data_ns = 0
            watch = self._watch_pending
            if watch is not None:
                self._watch_pending = None
            # self._put inlined: this is the hot path
            if self._needs_start:
                self._start()
            q = self._q
            n = len(q)
            if n >= self._qmax:
                self._dropped_queue += 1
            q.append((_STEP, step, _monotonic_ns(), vals, extra, data_ns, watch))
            if n >= self._wake_at and not self._wake.is_set():  # set() takes a lock: once
                self._wake.set()
            if self._comm is not None:
                self._comm.maybe_run(step)
        except Exception:
            self._caller_errors += 1

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
        **extra: Any,
    ) -> None:
        """Evaluation metrics of one split at one step."""
        try:
            if not self._accepting:
                return self._refuse()
            named = {
                "loss": loss,
                "perplexity": perplexity,
                "accuracy": accuracy,
                "f1": f1,
                "bleu": bleu,
                "rouge": rouge,
            }
            names = list(named) + list(extra)
            vals = V.capture(list(named.values()) + list(extra.values()))
            self._put((_EVAL, step, time.monotonic_ns(), str(split), names, vals, len(named)))
        except Exception:
            self._caller_errors += 1

    def log_batch(
        self,
        step: int,
        input_ids: Any,
        attention_mask: Any = None,
        labels: Any = None,
        max_len: int | None = None,
    ) -> None:
        """Data quality of one batch: lengths, over-length count, labels, sample hashes."""
        try:
            if not self._accepting:
                return self._refuse()
            vals = V.capture([input_ids, attention_mask, labels])
            self._put((_BATCH, step, time.monotonic_ns(), vals, max_len))
        except Exception:
            self._caller_errors += 1

    def watch(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any = None,
        every: int = 100,
        max_grad_norm: float | None = None,
    ) -> None:
        """Every ``every`` optimizer steps: pre-clip gradient norm, clipping, parameter norm,
        update ratio and the learning rate of every param group, computed on the device.

        ``max_grad_norm``: the clipping threshold the loop uses. With it, a step is clipped when
        its pre-clip norm (the ``grad_norm`` given to log_step, else the one measured at the end
        of backward) exceeds it; without it, clipping is inferred from a uniform shrink of the
        gradients before ``optimizer.step()``, which gradient averaging done by hand between
        backward and step can imitate."""
        try:
            from steplens.producer.watcher import Watcher

            self._watchers.append(
                Watcher(
                    self,
                    model,
                    optimizer,
                    scheduler,
                    every=max(1, int(every)),
                    update_threshold=self.config.update_threshold,
                    sample_size=self.config.update_sample,
                    max_grad_norm=max_grad_norm,
                )
            )
        except Exception as exc:
            self._caller_errors += 1
            log.warning("steplens: watch() disabled: %s", exc)

    def _watch_result(self, result: dict[str, Any]) -> None:
        self._watch_pending = result

    def probe_comm(self, every: int = 100) -> None:
        """Every ``every`` steps (checked in log_step): a tiny timed all_reduce and a ring
        send/recv. Every rank must call log_step at the same steps."""
        try:
            if self._comm is not None and self._comm.every == every:
                return
            from steplens.producer.comm import CommProbe

            probe = CommProbe(self._enqueue_comm, max(1, int(every)))
            self._comm = probe if probe.usable else None
        except Exception as exc:
            self._caller_errors += 1
            log.warning("steplens: probe_comm() disabled: %s", exc)

    def timed(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Wrap a DataLoader so the time spent waiting for each batch becomes data_time_s."""
        it = iter(iterable)
        self._data_ns = 0
        while True:
            t0 = time.monotonic_ns()
            try:
                item = next(it)
            except StopIteration:
                return
            if self._data_ns is not None:
                self._data_ns += time.monotonic_ns() - t0
            yield item

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything logged so far is delivered; False when ``timeout_s`` ran out."""
        try:
            if not self._accepting:
                self._refuse()
                return False
            done = threading.Event()
            deadline = time.monotonic() + timeout_s
            result: list[bool] = []
            self._put((_FLUSH, done, deadline, result))
            self._wake.set()
            done.wait(timeout_s + 0.5)
            return bool(result and result[0])
        except Exception:
            self._caller_errors += 1
            return False

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush, stop the threads and close the connection; later calls are ignored."""
        try:
            if self._closed:
                return
            self._closed = True
            self._accepting = False
            timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
            for w in self._watchers:
                w.remove()
            if self._hw is not None:
                self._hw.stop(min(1.0, timeout))
            if self._thread is None:
                if self.delivery.transport is None and not len(self._q):
                    return  # never logged in this process: nothing to deliver, never connected
                self._start()
            self._stop = True
            self._deadline = time.monotonic() + timeout
            self._wake.set()
            assert self._thread is not None
            self._thread.join(timeout + 1.0)
        except Exception:
            self._caller_errors += 1

    close = shutdown

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ producers of items
    def _emit_meta(self) -> None:
        c = self.config
        model = dict(c.model_info or {})
        if c.flops_per_token is not None:
            model.setdefault("flops_per_token", c.flops_per_token)
        data: dict[str, Any] = {
            "world_size": self.identity.world_size,
            "hosts": [self.identity.host],
            "config": c.public(),
        }
        if model:
            data["model"] = model
        if c.lr_schedule:
            data["lr_schedule"] = dict(c.lr_schedule)
        if c.peak_flops is not None:
            data["peak_flops"] = float(c.peak_flops)
        self._put((_META, None, time.monotonic_ns(), data))

    def _enqueue_hw(self, data: dict[str, Any]) -> None:
        if self._accepting and self.pid == os.getpid():
            self._put((_HW, None, time.monotonic_ns(), data))

    def _enqueue_comm(self, step: int, data: dict[str, Any], pending: Any) -> None:
        if self._accepting:
            self._put((_COMM, step, time.monotonic_ns(), data, pending))

    # ------------------------------------------------------------------ worker side
    def _run(self) -> None:
        interval = self.config.flush_interval_s
        busy = False
        while True:
            self._wake.wait(0.001 if busy else interval)
            self._wake.clear()
            stopping = self._stop
            try:
                self._drain(None if stopping else 20000)
            except Exception:
                self._count_error("worker")
            try:
                busy = self._tick(time.monotonic())
            except Exception:
                busy = False
                self._count_error("worker")
            if (stopping and not self._q and self._held is None) or (
                stopping and time.monotonic() >= self._deadline
            ):
                break
        self._finish()

    def _finish(self) -> None:
        try:
            now_ns = time.monotonic_ns()
            self._emit_batch()
            self._emit_window(now_ns)
            self._emit_health(now_ns)
            left = self.delivery.close(max(0.0, self._deadline - time.monotonic()))
            if left:
                log.warning(
                    "steplens: %d records not delivered at shutdown (kept in %s)",
                    left,
                    self.delivery.spool.directory,
                )
        except Exception:
            self._count_error("worker")

    def _count_error(self, where: str) -> None:
        self.errors[where] = self.errors.get(where, 0) + 1

    def _drain(self, budget: int | None) -> None:
        q = self._q
        n = 0
        while budget is None or n < budget:
            item = self._held
            if item is None:
                try:
                    item = q.popleft()
                except IndexError:
                    return
            self._held = None
            if not self._ready(item):
                if self._stop and time.monotonic() >= self._deadline:
                    self._count_drop("unresolved")
                    continue
                self._held = item
                return
            n += 1
            try:
                self._handle(item)
            except Exception:
                self._count_error("worker")
            if n % _SLICE == 0:
                _release_gil(0)

    def _ready(self, item: tuple[Any, ...]) -> bool:
        tag = item[0]
        if tag == _STEP:
            if not all(V.ready(v) for v in item[3]):
                return False
            if item[4] and not all(V.ready(v) for v in item[4].values()):
                return False
            return item[6] is None or all(V.ready(v) for v in item[6].values())
        if tag in (_EVAL, _BATCH):
            return all(V.ready(v) for v in (item[5] if tag == _EVAL else item[3]))
        if tag == _COMM:
            return item[4] is None or item[4].ready()
        return True

    def _count_drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _handle(self, item: tuple[Any, ...]) -> None:
        tag = item[0]
        if tag == _STEP:
            self._on_step(item)
        elif tag == _HW:
            self._send("hw", None, item[2], item[3])
        elif tag == _META:
            self._send("run_meta", None, item[2], item[3])
        elif tag == _EVAL:
            self._on_eval(item)
        elif tag == _BATCH:
            from steplens.producer.batch_stats import batch_payload

            _, step, t_ns, vals, max_len = item
            ids, mask, labels = (V.host_value(v) for v in vals)
            data = batch_payload(ids, mask, labels, max_len=max_len)
            self._send("batch", step, t_ns, data)
        elif tag == _COMM:
            _, step, t_ns, data, pending = item
            if pending is not None:
                data = pending.resolve(data)
            self._send("comm", step, t_ns, data)
        elif tag == _FLUSH:
            _, done, deadline, result = item
            self._emit_batch()
            self._emit_window(time.monotonic_ns())
            left = self.delivery.flush(max(0.0, deadline - time.monotonic()))
            result.append(left == 0)
            done.set()

    def _float(self, v: Any) -> float | None:
        try:
            return V.to_float(v)
        except V.BadValue:
            self._count_error("bad_value")
            return None

    def _on_step(self, item: tuple[Any, ...]) -> None:
        _, step, t_ns, vals, scalars, data_ns, watch = item
        if isinstance(step, bool) or not isinstance(step, int):
            try:
                step = V.to_int(step)
            except V.BadValue:
                self._count_drop("bad_step")
                return
        data: dict[str, Any] = {}
        for name, v in zip(_STEP_NUMS, vals[:3], strict=True):
            if v is not None and (f := self._float(v)) is not None:
                data[name] = f
        tokens = vals[3]
        if tokens is not None:
            try:
                data["tokens"] = V.to_int(tokens)
            except V.BadValue:
                self._count_error("bad_value")
        clean: dict[str, float] = {}
        if scalars:
            for name, v in scalars.items():
                if len(name) > MAX_STR_LEN:
                    self._count_error("bad_name")
                elif (f := self._float(v)) is not None:
                    clean[name] = f
            # A step field given by the caller (e.g. its own step_time_s, measured before the
            # collective so stragglers show) wins over the value measured between calls.
            for name in _PROMOTED.intersection(clean):
                data[name] = clean.pop(name)
        last, self._last_step = self._last_step, (step, t_ns)
        step_time = data.get("step_time_s")
        if step_time is None and last is not None and step > last[0] and t_ns > last[1]:
            step_time = (t_ns - last[1]) / 1e9 / (step - last[0])
            data["step_time_s"] = step_time
        if step_time and step_time > 0 and "tokens_per_s" not in data and "tokens" in data:
            tps = data["tokens"] / step_time
            data["tokens_per_s"] = tps
            c = self.config
            if c.flops_per_token and c.peak_flops:
                data["mfu"] = tps * c.flops_per_token / c.peak_flops
        if data_ns and "data_time_s" not in data:
            data["data_time_s"] = data_ns / 1e9
        if watch:
            self._add_watch(data, watch)
        metrics = {k: float(v) for k, v in data.items() if k != "group_lrs"}
        if clean:
            data["scalars"] = clean
            metrics.update(clean)
        batch = self._batch
        if batch is None:
            self._window.add_step(step, metrics, t_ns)
        guard = self._guard
        flagged = False
        for name, x in metrics.items():
            if guard.check(name, x):
                flagged = True
        if flagged:
            data["reason"] = "guard"
        if batch is not None:  # full resolution: every step, in batches
            batch.add(step, t_ns + self._wall_offset_ns, data, t_ns)
            if flagged or batch.due(t_ns):  # a spike leaves at once
                self._emit_batch()
            return
        if not flagged and is_sampled(step, self._period):
            data["reason"] = "sample"
        elif not flagged and watch:
            data["reason"] = "every"
        if "reason" in data:
            self._send("step", step, t_ns, data)
        if self._window.due(t_ns, self.config.window_steps, self.config.window_s):
            self._emit_window(t_ns)

    def _add_watch(self, data: dict[str, Any], watch: dict[str, Any]) -> None:
        for name in ("grad_norm_preclip", "param_norm", "update_ratio"):
            v = watch.get(name)
            if v is not None and (f := self._float(v)) is not None:
                data[name] = f
        clipped = watch.get("clipped")
        limit = watch.get("max_grad_norm")
        pre = data.get("grad_norm", data.get("grad_norm_preclip"))
        if limit is not None and pre is not None:
            data["clipped"] = pre > limit
        elif clipped is not None and (f := self._float(clipped)) is not None:
            data["clipped"] = bool(f)
        lrs = watch.get("group_lrs")
        if lrs:
            data["group_lrs"] = [f for v in lrs if (f := self._float(v)) is not None]

    def _on_eval(self, item: tuple[Any, ...]) -> None:
        _, step, t_ns, split, names, vals, n_named = item
        data: dict[str, Any] = {"split": split[:MAX_STR_LEN]}
        extra: dict[str, float] = {}
        for i, (name, v) in enumerate(zip(names, vals, strict=True)):
            if v is None or (f := self._float(v)) is None:
                continue
            if i < n_named:
                data[name] = f
            else:
                extra[name] = f
        if extra:
            data["extra"] = extra
        self._send("eval", step, t_ns, data)

    def _emit_window(self, now_ns: int) -> None:
        data = self._window.emit(now_ns)
        if data is not None:
            self._send_window(data, now_ns)

    def _send_window(self, data: dict[str, Any], now_ns: int) -> None:
        """A window too large for one record is split by metric, never dropped whole."""
        metrics = data["metrics"]
        if len(metrics) > 1 and len(metrics) * 160 > MAX_RECORD_BYTES:
            ok = False
        else:
            ok = self._send("step_window", data["step_last"], now_ns, data, count_drop=False)
        if ok:
            return
        if len(metrics) <= 1:
            self._count_drop("encode")
            return
        names = list(metrics)
        half = len(names) // 2
        for part in (names[:half], names[half:]):
            self._send_window({**data, "metrics": {k: metrics[k] for k in part}}, now_ns)

    def _emit_batch(self) -> None:
        if self._batch is not None and len(self._batch):
            self._send_batch(self._batch.take())

    def _send_batch(self, entries: list[Entry]) -> None:
        """A batch too large for one record is split in halves, never dropped whole."""
        last = entries[-1]
        t_ns = last["time_ns"] - self._wall_offset_ns  # _send adds the offset back
        if self._send("step_batch", last["step"], t_ns, payload(entries), count_drop=False):
            return
        if len(entries) == 1:
            self._count_drop("encode")
            return
        for part in halves(entries):
            self._send_batch(part)

    def _emit_health(self, now_ns: int) -> None:
        d = self.delivery
        dropped = dict(self.dropped)
        if self._dropped_queue:
            dropped["queue_full"] = self._dropped_queue
        if d.spool.dropped_records:
            dropped["spool_full"] = d.spool.dropped_records
        errors = dict(self.errors)
        if self._caller_errors:
            errors["caller"] = self._caller_errors
        if self._refused:
            errors["not_running"] = self._refused
        if self._hw is not None and (self._hw.errors or self._hw.gpu.errors):
            errors["hw"] = self._hw.errors + self._hw.gpu.errors
        data = {
            "dropped": dropped,
            "sent": d.sent,
            "spooled": d.spooled,
            "spool_bytes": d.spool.total_bytes,
            "replayed": d.replayed,
            "errors": errors,
            "queue_len": len(self._q),
        }
        self._send("health", None, now_ns, data)

    def _tick(self, now: float) -> bool:
        """Periodic work; True while a spool replay wants to be called again soon."""
        now_ns = time.monotonic_ns()
        if self._batch is not None and self._batch.due(now_ns):
            self._emit_batch()
        if self._window.due(now_ns, self.config.window_steps, self.config.window_s):
            self._emit_window(now_ns)
        if now >= self._next_health:
            self._next_health = now + self.config.health_interval_s
            self._emit_health(now_ns)
        return self.delivery.service()

    def _send(
        self,
        kind: str,
        step: int | None,
        t_ns: int,
        data: dict[str, Any],
        count_drop: bool = True,
    ) -> bool:
        ident = self.identity
        record: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "kind": kind,
            "run_id": ident.run_id,
            "rank": ident.rank,
            "local_rank": ident.local_rank,
            "host": ident.host,
            "pid": self.pid,
            "seq": self._seq,
            "time_ns": t_ns + self._wall_offset_ns,
            "data": data,
        }
        if step is not None:
            record["step"] = step
        try:
            raw = encode(record)
        except SchemaError:
            if count_drop:
                self._count_drop("encode")
            return False
        self._seq += 1
        self.delivery.send(self._key, raw)
        return True

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict[str, Any]:
        """Counters as in the health record (for tests and debugging)."""
        d = self.delivery
        return {
            "sent": d.sent,
            "spooled": d.spooled,
            "replayed": d.replayed,
            "spool_bytes": d.spool.total_bytes,
            "spool_dropped": d.spool.dropped_records,
            "state": d.state,
            "dropped_queue": self._dropped_queue,
            "dropped": dict(self.dropped),
            "errors": dict(self.errors),
            "caller_errors": self._caller_errors,
            "refused": self._refused,
            "queue_len": len(self._q),
            "seq": self._seq,
        }
