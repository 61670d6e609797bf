"""The producer's worker thread: drain the caller's queue, resolve values, run each item through
its stage (steps: enrich, window/sample/guard or batch; the other kinds: their payload), send
the producer's own ``health`` record, and serve delivery.

One Pipeline per process (a forked child makes its own). It catches every exception, counts it
and goes on; ``stop`` bounds the final flush by a deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from steplens.producer import values as V
from steplens.producer.config import ProducerConfig
from steplens.producer.delivery import Delivery
from steplens.producer.items import (
    BatchItem,
    CommItem,
    EvalItem,
    FlushItem,
    HwItem,
    Item,
    MetaItem,
    StepItem,
)
from steplens.producer.schema import MAX_STR_LEN
from steplens.producer.sender import Sender
from steplens.producer.steps import Counters, StepStage

log = logging.getLogger("steplens")

# The worker releases the GIL after this many items, so a caller thread that wants it back
# waits for a slice (well under a millisecond), not for the interpreter's 5 ms switch interval.
_SLICE = 32


class Pipeline:
    def __init__(
        self, config: ProducerConfig, queue: deque[Item], sender: Sender, wake: threading.Event
    ) -> None:
        self.config = config
        self.queue = queue
        self.sender = sender
        self.delivery: Delivery = sender.delivery
        self.wake = wake
        self.counters = Counters()
        self.steps = StepStage(config, sender, self.counters)
        self.held: Item | None = None  # an item waiting for its device copy
        self.stopping = False
        self.deadline = float("inf")
        self._warned: set[str] = set()  # calls whose first refusal was logged
        self.health_extra: Any = None  # callable -> (dropped, errors) of the caller's side
        self._next_health = time.monotonic() + config.health_interval_s
        self.thread = threading.Thread(target=self._run, name="steplens-producer", daemon=True)

    # ------------------------------------------------------------------ loop
    def stop(self, timeout_s: float) -> None:
        self.stopping = True
        self.deadline = time.monotonic() + timeout_s
        self.wake.set()
        self.thread.join(timeout_s + 1.0)

    def _run(self) -> None:
        interval = self.config.flush_interval_s
        busy = False
        while True:
            self.wake.wait(0.001 if busy else interval)
            self.wake.clear()
            stopping = self.stopping
            try:
                self._drain(None if stopping else 20000)
            except Exception:
                self.counters.error("worker")
            try:
                busy = self._tick(time.monotonic())
            except Exception:
                busy = False
                self.counters.error("worker")
            if stopping and (
                (not self.queue and self.held is None) or time.monotonic() >= self.deadline
            ):
                break
        self._finish()

    def _finish(self) -> None:
        try:
            now_ns = time.monotonic_ns()
            self.steps.emit_all(now_ns)
            self.emit_health(now_ns)
            left = self.delivery.close(max(0.0, self.deadline - time.monotonic()))
            if left:
                log.warning(
                    "steplens: %d records not delivered at shutdown, kept in %s; a later "
                    "producer with the same spool_dir sends them, or: steplens replay --spool %s",
                    left,
                    self.delivery.spool.directory,
                    self.delivery.spool.directory,
                )
        except Exception:
            self.counters.error("worker")

    def _drain(self, budget: int | None) -> None:
        q = self.queue
        n = 0
        while budget is None or n < budget:
            item = self.held
            if item is None:
                try:
                    item = q.popleft()
                except IndexError:
                    return
            self.held = None
            if not _ready(item):
                if self.stopping and time.monotonic() >= self.deadline:
                    self.sender.count_drop("unresolved")
                    continue
                self.held = item
                return
            n += 1
            try:
                self._handle(item)
            except Exception:
                self.counters.error("worker")
            if n % _SLICE == 0:
                time.sleep(0)  # drops and retakes the GIL

    def _tick(self, now: float) -> bool:
        """Periodic work; True while a spool replay wants to be called again soon."""
        now_ns = time.monotonic_ns()
        self.steps.emit_due(now_ns)
        if now >= self._next_health:
            self._next_health = now + self.config.health_interval_s
            self.emit_health(now_ns)
        return self.delivery.service()

    # ------------------------------------------------------------------ items
    def _handle(self, item: Item) -> None:
        send = self.sender.send
        if type(item) is StepItem:
            self.steps.add(item)
        elif type(item) is HwItem:
            send("hw", None, item.t_ns, item.data)
        elif type(item) is MetaItem:
            send("run_meta", None, item.t_ns, item.data)
        elif type(item) is EvalItem:
            self._on_eval(item)
        elif type(item) is BatchItem:
            from steplens.producer.batch_stats import batch_payload

            step = self._step_of("batch", item.step)
            if step is None:
                return
            ids, mask, labels = (
                V.host_value(v) for v in (item.input_ids, item.attention_mask, item.labels)
            )
            send("batch", step, item.t_ns, batch_payload(ids, mask, labels, item.max_len))
        elif type(item) is CommItem:
            data = item.data if item.pending is None else item.pending.resolve(item.data)
            send("comm", item.step, item.t_ns, data)
        elif type(item) is FlushItem:
            self.steps.emit_all(time.monotonic_ns())
            left = self.delivery.flush(max(0.0, item.deadline - time.monotonic()))
            item.result.append(left == 0)
            item.done.set()

    def _refuse(self, call: str, why: str) -> None:
        """Drop one call's record and count it; the first time, say why."""
        self.sender.count_drop(f"bad_{call}")
        if call not in self._warned:
            self._warned.add(call)
            log.warning("steplens: log_%s(...) dropped: %s (counted in health)", call, why)

    def _step_of(self, call: str, step: Any) -> int | None:
        try:
            out = V.to_int(step)
        except V.BadValue as exc:
            self._refuse(call, f"step {step!r}: {exc}")
            return None
        if out < 0:
            self._refuse(call, f"step {out} is negative")
            return None
        return out

    def _on_eval(self, item: EvalItem) -> None:
        step = self._step_of("eval", item.step)
        if step is None:
            return
        split = item.split
        if not isinstance(split, str) or not 0 < len(split) <= MAX_STR_LEN:
            self._refuse("eval", f"split must be a string of 1 to {MAX_STR_LEN} characters")
            return
        data: dict[str, Any] = {"split": split}
        named = dict(list(item.metrics.items())[: item.n_named])
        for name, v in named.items():
            if v is not None and (f := self.counters.float_or_none(v)) is not None:
                data[name] = f
        extras = dict(list(item.metrics.items())[item.n_named :])
        extra = self.steps.names.clean(extras, self.config.max_scalars) if extras else None
        if extra:
            data["extra"] = extra
        self.sender.send("eval", step, item.t_ns, data)

    # ------------------------------------------------------------------ health
    def stats(self) -> dict[str, Any]:
        """The worker's counters (``Monitor.stats`` adds the caller's)."""
        d = self.delivery
        return {
            "sent": d.sent,
            "spooled": d.spooled,
            "replayed": d.replayed,
            "spool_bytes": d.spool.total_bytes,
            "spool_dropped": d.spool.dropped_records,
            "state": d.state,
            "dropped": dict(self.sender.dropped),
            "errors": dict(self.counters.errors),
            "queue_len": len(self.queue),
            "seq": self.sender.seq,
        }

    def emit_health(self, now_ns: int) -> None:
        d = self.delivery
        dropped = dict(self.sender.dropped)
        errors = dict(self.counters.errors)
        if self.health_extra is not None:
            more_dropped, more_errors = self.health_extra()
            dropped.update(more_dropped)
            errors.update(more_errors)
        if d.spool.dropped_records:
            dropped["spool_full"] = d.spool.dropped_records
        data = {
            "dropped": dropped,
            "sent": d.sent,
            "spooled": d.spooled,
            "spool_bytes": d.spool.total_bytes,
            "replayed": d.replayed,
            "errors": errors,
            "queue_len": len(self.queue),
        }
        self.sender.send("health", None, now_ns, data)


def _ready(item: Item) -> bool:
    """Whether every device copy in ``item`` reached the host."""
    if isinstance(item, StepItem):
        for v in (item.loss, item.lr, item.grad_norm, item.tokens):
            if not V.ready(v):
                return False
        if item.scalars and not all(V.ready(v) for v in item.scalars.values()):
            return False
        return item.watch is None or all(V.ready(v) for v in item.watch.values())
    if isinstance(item, EvalItem):
        return all(V.ready(v) for v in item.metrics.values())
    if isinstance(item, BatchItem):
        return all(V.ready(v) for v in (item.input_ids, item.attention_mask, item.labels))
    if isinstance(item, CommItem):
        return item.pending is None or item.pending.ready()
    return True
