"""The producer's worker thread: drain the caller's queue, resolve values, run each item through
its stage (steps: enrich, window/sample/guard or batch; the other kinds: their payload), send
the producer's own ``health`` record, the stacks of a stalled rank (``stall``), and serve
delivery.

One Pipeline per process (a forked child makes its own). It catches every exception, counts it
and goes on; ``stop`` bounds the final flush by a deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from steplens.producer.config import ProducerConfig
from steplens.producer.delivery.live_or_spool import Delivery
from steplens.producer.instruments.host_stats import process_memory
from steplens.producer.instruments.report_cadence import FOLLOW, ReportCadence, health_news
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
)
from steplens.producer.pipeline.sender import Sender
from steplens.producer.pipeline.stall import StallWatch, thread_stacks
from steplens.producer.pipeline.steps import Counters, StepStage
from steplens.producer.remedies.advice_inbox import (
    Advice,
    AdviceDesk,
    AdviceInbox,
    AdviceSource,
    Message,
)
from steplens.schema import KINDS, MAX_STR_LEN
from steplens.schema.dead_letter import dead_letter_bytes
from steplens.schema.topics import Topics

log = logging.getLogger("steplens")

# The worker releases the GIL after this many items, so a caller thread that wants it back
# waits for a slice (well under a millisecond), not for the interpreter's 5 ms switch interval.
_SLICE = 32


class Pipeline:
    """``caller_counters``: () -> (dropped, errors) of the caller's side, for the health
    record; ``memory``: the process's and its host's memory, for it too. ``open_advice``:
    opens where advice comes from (a run with remedies; None: no advice), read into an inbox
    whose ``ready`` says advice for ``log_step`` arrived."""

    def __init__(
        self,
        config: ProducerConfig,
        queue: deque[Item],
        sender: Sender,
        wake: threading.Event,
        *,
        caller_counters: Callable[[], tuple[dict[str, int], dict[str, int]]] | None = None,
        open_advice: Callable[[], AdviceSource] | None = None,
        advice_ready: Callable[[], None] | None = None,
        memory: Callable[[], dict[str, int]] = process_memory,
    ) -> None:
        self.config = config
        self.memory = memory
        self.queue = queue
        self.sender = sender
        self.delivery: Delivery = sender.delivery
        self.wake = wake
        self.counters = Counters()
        self.steps = StepStage(config, sender, self.counters)
        self.stall = StallWatch(config.hang_dump_after_s)
        self.held: Item | None = None  # an item waiting for its device copy
        self.stopping = False
        self.deadline = float("inf")
        self.caller_counters = caller_counters
        self.advice: AdviceDesk | None = None
        if open_advice is not None:
            self.advice = AdviceDesk(self._inbox(advice_ready), open_advice)
        self.dead_letters_sent = 0
        self._next_health = time.monotonic() + config.health_interval_s
        self.health_cadence = ReportCadence(
            config.health_report_every_s, health_news, FOLLOW, phase=sender.identity.phase
        )
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
        if self.advice is not None:
            self.advice.close()
        try:
            now_ns = time.monotonic_ns()
            self.steps.emit_all(now_ns)
            self.emit_health(now_ns, last=True)
            left = self.delivery.close(max(0.0, self.deadline - time.monotonic()))
            if left:
                log.warning(
                    "steplens: %d records not delivered at shutdown, kept in %s; a later "
                    "producer with the same spool_dir sends them, or: steplens spool send %s",
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
        stalled = self.stall.stalled_s(now_ns)
        if stalled is not None:
            self.emit_stacks(stalled, now_ns)
        if self.advice is not None:
            self.advice.poll(now)
        if now >= self._next_health:
            self._next_health = now + self.config.health_interval_s
            self.emit_health(now_ns)
        return self.delivery.service()

    # ------------------------------------------------------------------ items
    def _handle(self, item: Item) -> None:
        send = self.sender.send
        if type(item) is StepItem:
            self.stall.on_step(item.step, item.t_ns)
            self.steps.add(item)
        elif type(item) is HwItem:
            send("hw", None, item.t_ns, item.data)
        elif type(item) is MetaItem:
            send("run_meta", None, item.t_ns, item.data)
        elif type(item) is EvalItem:
            self._on_eval(item)
        elif type(item) is BatchItem:
            self._on_batch(item)
        elif type(item) is CommItem:
            data = item.data if item.pending is None else item.pending.resolve(item.data)
            send("comm", item.step, item.t_ns, data)
        elif type(item) is RecordItem:
            self._on_record(item)
        elif type(item) is FlushItem:
            self.steps.emit_all(time.monotonic_ns())
            left = self.delivery.flush(max(0.0, item.deadline - time.monotonic()), item.ending)
            item.result.append(left == 0)
            item.done.set()

    def _refuse(self, call: str, reason: str, why: str) -> None:
        """Drop one call's record and count it; the first time for ``reason``, say why."""
        self.sender.count_drop(f"bad_{call}")
        self.counters.notice(f"{call}: {reason}", "log_%s(...) dropped: %s", call, why)

    def _step_of(self, call: str, step: Any) -> int | None:
        try:
            out = V.to_int(step)
        except V.BadValue as exc:
            self._refuse(call, "step", f"step {step!r}: {exc}")
            return None
        if out < 0:
            self._refuse(call, "negative step", f"step {out} is negative")
            return None
        return out

    def _on_eval(self, item: EvalItem) -> None:
        step = self._step_of("eval", item.step)
        if step is None:
            return
        split = item.split
        if not isinstance(split, str) or not 0 < len(split) <= MAX_STR_LEN:
            self._refuse(
                "eval", "split", f"split must be a string of 1 to {MAX_STR_LEN} characters"
            )
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
        if item.texts is not None:
            for name, score in self._text_scores(*item.texts).items():
                data.setdefault(name, score)  # a score the caller gave wins
        if len(data) == 1:  # the split alone: an empty eval row says nothing
            self._refuse("eval", "no metrics", "no metric (or none that is a number) given")
            return
        self.sender.send("eval", step, item.t_ns, data)

    def _text_scores(self, predictions: list[Any], references: list[Any]) -> dict[str, float]:
        """BLEU and ROUGE-L, or nothing (said once per reason); the eval record goes anyway."""
        from steplens.producer.pipeline.text_scores import MissingExtra, text_scores

        try:
            return text_scores(predictions, references)
        except MissingExtra as exc:
            self.counters.error("text_extra_missing")
            self._warn_once(
                "text", f"BLEU/ROUGE not computed ({exc}): pip install 'steplens-producer[text]'"
            )
        except Exception as exc:
            self.counters.error("text_scores")
            self._warn_once("text_scores", f"BLEU/ROUGE not computed: {exc}")
        return {}

    def _warn_once(self, key: str, message: str) -> None:
        self.counters.notices.warning(key, "steplens: %s", message)

    def _on_batch(self, item: BatchItem) -> None:
        from steplens.producer.pipeline.batch_stats import TASKS, batch_payload

        step = self._step_of("batch", item.step)
        if step is None:
            return
        if item.task is not None and item.task not in TASKS:
            self._refuse("batch", "task", f"task {item.task!r}: one of {', '.join(TASKS)} or None")
            return
        try:
            ignore_index = V.to_int(item.ignore_index)
            epoch = None if item.epoch is None else V.to_int(item.epoch)
        except V.BadValue as exc:
            self._refuse("batch", "epoch", f"epoch or ignore_index: {exc}")
            return
        if epoch is not None and epoch < 0:
            self._refuse("batch", "negative epoch", f"epoch {epoch} is negative")
            return
        ids, mask, labels, sample_ids = (
            V.host_value(v)
            for v in (item.input_ids, item.attention_mask, item.labels, item.sample_ids)
        )
        data, cut = batch_payload(
            ids,
            mask,
            labels,
            item.max_len,
            task=item.task,
            ignore_index=ignore_index,
            sample_ids=sample_ids,
        )
        if cut:
            self.sender.count_drop("batch_samples_cut", cut)
        if epoch is not None:
            data["epoch"] = epoch
        self.sender.send("batch", step, item.t_ns, data)

    def _on_record(self, item: RecordItem) -> None:
        """An ``acted`` or ``checkpoint`` record; without a step, at the last step logged."""
        step = self.stall.last_step if item.step is None else self._step_of(item.kind, item.step)
        if step is None and item.step is not None:
            return
        try:  # the encoder's fast path does not check every declared value: these are rare
            msgspec.convert(item.data, KINDS[item.kind])
        except msgspec.ValidationError as exc:
            self._refuse(item.kind, "record", f"not a valid {item.kind} record: {exc}")
            return
        if not self.sender.send(item.kind, step, item.t_ns, item.data, count_drop=False):
            self._refuse(item.kind, "record", f"not a valid {item.kind} record")

    # ------------------------------------------------------------------ advice
    def _inbox(self, ready: Callable[[], None] | None) -> AdviceInbox:
        c, ident = self.config, self.sender.identity
        return AdviceInbox(
            ident.run_id,
            ident.rank,
            frozenset(c.remedies),
            queue_max=c.advice_queue_max,
            dead_letter=self.dead_letter_advice,
            refused=self.refuse_advice,
            ready=ready,
            burst=c.advice_burst,
            refill_s=c.advice_refill_s,
        )

    def refuse_advice(self, advice: Advice, why: str) -> None:
        """Answer advice this rank will not act on (an ``acted`` record ``refused``)."""
        data = {
            "action": advice.action,
            "fingerprint": advice.fingerprint,
            "outcome": "refused",
            "detail": why,
        }
        self.sender.send("acted", self.stall.last_step, time.monotonic_ns(), data)

    def dead_letter_advice(self, reason: str, message: Message) -> None:
        """A message of the advice topic no rank can use, to the dead-letter topic."""
        key, value, partition, offset = message
        ident = self.sender.identity
        raw = dead_letter_bytes(
            reason,
            value,
            source_topic=self.config.advice_topic,
            partition=partition,
            offset=offset,
            consumer=f"steplens-producer {ident.run_id} rank {ident.rank}",
            run_id=ident.run_id,
            rank=ident.rank,
        )

        def done(ok: bool, _key: bytes, _value: bytes) -> None:
            if ok:
                self.dead_letters_sent += 1
            else:
                self.counters.error("advice_dead_letter")

        topic = Topics.from_env().dead_letters
        if not self.delivery.send_aside(topic, key or b"", raw, done):
            self.counters.error("advice_dead_letter")

    def emit_stacks(self, stalled_s: float, now_ns: int) -> None:
        """The stacks of every thread of this process, but this one (the producer's)."""
        data: dict[str, Any] = {
            "stalled_s": stalled_s,
            "threads": thread_stacks(skip=threading.get_ident()),
        }
        last = self.stall.last_step
        if last is not None:
            data["last_step"] = last
        self.sender.send("stacks", last, now_ns, data)

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
            "advice": None if self.advice is None else dict(self.advice.inbox.counts),
            "advice_received": 0 if self.advice is None else self.advice.inbox.received,
            "advice_source": None if self.advice is None else self.advice.source_label,
        }

    def emit_health(self, now_ns: int, last: bool = False) -> None:
        """Read the health and send it when due (``health_report_every_s``; ``last``: the
        process's last, always sent)."""
        d = self.delivery
        dropped = dict(self.sender.dropped)
        errors = dict(self.counters.errors)
        if self.caller_counters is not None:
            more_dropped, more_errors = self.caller_counters()
            dropped.update(more_dropped)
            errors.update(more_errors)
        if d.spool.dropped_records:
            dropped["spool_full"] = d.spool.dropped_records
        if self.advice is not None:
            dropped.update({f"advice_{k}": n for k, n in self.advice.inbox.counts.items()})
        data = {
            "dropped": dropped,
            "sent": d.sent,
            "spooled": d.spooled,
            "spool_bytes": d.spool.total_bytes,
            "replayed": d.replayed,
            "errors": errors,
            "queue_len": len(self.queue),
            **self.memory(),  # a leak in this rank's process, against the host's memory
        }
        if last or self.health_cadence.due(data, now_ns / 1e9):
            self.sender.send("health", None, now_ns, data)


def _ready(item: Item) -> bool:
    """Whether every device copy in ``item`` reached the host."""
    if isinstance(item, StepItem):
        for v in (item.loss, item.lr, item.grad_norm, item.tokens):
            if not V.ready(v):
                return False
        if item.scalars and not all(V.ready(v) for v in item.scalars.values()):
            return False
        return item.watch is None or (
            all(map(V.ready, item.watch.values()))
            and all(map(V.ready, item.watch.get("group_lrs") or ()))
        )
    if isinstance(item, EvalItem):
        return all(V.ready(v) for v in item.metrics.values())
    if isinstance(item, BatchItem):
        return all(
            V.ready(v) for v in (item.input_ids, item.attention_mask, item.labels, item.sample_ids)
        )
    if isinstance(item, CommItem):
        return item.pending is None or item.pending.ready()
    return True
