"""Advice from the stream jobs to this rank, and the bounded queue the training loop reads.

The worker thread takes the advice topic's messages from an ``AdviceSource`` (a Kafka
consumer, ``transport.KafkaAdviceSource``, created lazily and only when the run opted into a
remedy) and hands each to ``AdviceInbox.offer``, which keeps what is for this run and rank:

- a message keyed for another run, or without a key (the stream jobs key advice by run), is
  refused and counted without being decoded;
- a broken or hostile one (not a record, not ``advice``, a run id that is not the key's) is
  counted and dead-lettered, by rank 0 only (every rank of the run reads the same message);
- a (fingerprint, action) seen before is ignored (the worker publishes at least once). What
  was let through is never forgotten (the rate limit keeps that set small; past
  ``MAX_LET_THROUGH`` everything is refused rather than forgotten); what was refused is
  remembered in a bounded set (the oldest forgotten first, counted);
- advice for a remedy the run did not opt into is answered with an ``acted`` record
  ``refused`` and never reaches the loop;
- past the rate limit (``RateLimit``: ``burst`` pieces at once, then one per ``refill_s``) a
  piece of advice is answered ``refused`` too. Advice for every rank and advice for this rank
  have a limit each; the first is timed by the advice's own time (when the stream jobs
  decided it, at most when it arrived), so every rank of the run lets the same pieces through;
- each reason of a refusal is logged once; refusals are answered up to ``ANSWERS_BURST`` at
  once and one a second after (the rest counted, ``refused_unanswered``);
- the rest waits in a bounded deque (drop-oldest, counted) that ``Monitor.advice()`` empties
  at a step boundary, without blocking; advice the rank carries out by itself (``AUTO``:
  ``profile``) waits in a deque of its own, ``auto``, and ``ready()`` tells the Monitor
  that its next ``log_step`` has work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from steplens.schema import RUN_RANK, DecodeError
from steplens.schema import kinds as K
from steplens.schema.codec import decode

log = logging.getLogger("steplens")

# (key, value, partition, offset) of one message of the advice topic
Message = tuple[bytes | None, bytes | None, int, int]
SEEN_MAX = 4096  # refused (fingerprint, action) pairs remembered; the oldest forgotten beyond
AUTO = frozenset({"profile"})  # carried out at the next log_step, without sl.act()
ANSWERS_BURST = 64  # refusals answered at once; then one a second
# pairs let through, never forgotten: past this many (weeks at the rate limit) all is refused
MAX_LET_THROUGH = 65_536


class RateLimit:
    """A token bucket: ``burst`` at once, then one more every ``refill_s`` (0: no limit).
    Its clock is the one ``take`` is given, which only goes forward."""

    def __init__(self, burst: int, refill_s: float) -> None:
        self.burst = max(1, int(burst))
        self.refill_ns = max(0, int(refill_s * 1e9))
        self.tokens = float(self.burst)
        self.clock_ns: int | None = None

    def take(self, now_ns: int) -> bool:
        """One token at ``now_ns``, if there is one."""
        if not self.refill_ns:
            return True
        last = self.clock_ns
        if last is None or now_ns > last:
            if last is not None:
                self.tokens = min(self.burst, self.tokens + (now_ns - last) / self.refill_ns)
            self.clock_ns = now_ns
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class AdviceSource(Protocol):
    label: str  # where the messages come from, for ``stats()``

    def take_advice(self, max_n: int) -> list[Message]:
        """Messages that arrived since the last call (never waits)."""
        ...

    def close_advice(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Advice:
    """One piece of advice for this rank: the envelope's facts and the ``Advice`` payload.

    The payload's fields read as attributes (``advice.sample_ids``, ``advice.checkpoint``,
    ``advice.skip_batches``, ``advice.lr_factor``, ``advice.duration_s``, ...).
    """

    run_id: str
    rank: int  # the rank it is for; RUN_RANK (-1): every rank of the run
    step: int | None  # the step it was decided at
    time_ns: int  # when the stream jobs decided it (wall clock)
    received_ns: int  # when this rank received it (wall clock)
    data: K.Advice

    @property
    def action(self) -> str:
        return self.data.action

    @property
    def fingerprint(self) -> str:
        return self.data.fingerprint

    def __getattr__(self, name: str) -> Any:  # the payload's fields
        if name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)


class AdviceInbox:
    """Filters the advice topic's messages for one rank and queues what it should act on.

    ``dead_letter(reason, message)`` and ``refused(advice, why)`` are called from ``offer``
    (the worker thread); ``counts`` says what was kept out and why.
    """

    def __init__(
        self,
        run_id: str,
        rank: int,
        remedies: frozenset[str],
        *,
        queue_max: int,
        dead_letter: Callable[[str, Message], None],
        refused: Callable[[Advice, str], None],
        seen_max: int = SEEN_MAX,
        ready: Callable[[], None] | None = None,
        burst: int = 4,
        refill_s: float = 60.0,
    ) -> None:
        self.run_id = run_id
        self.rank = rank
        self.key = run_id.encode()
        self.remedies = remedies
        self.queue: deque[Advice] = deque(maxlen=queue_max)
        self.auto: deque[Advice] = deque(maxlen=queue_max)
        self.ready = ready  # AdviceDesk.poll calls it again while auto waits
        self.counts: dict[str, int] = {}  # reason -> messages kept from the loop
        self.received = 0  # pieces of advice queued for the loop
        self._let_through: set[tuple[str, str]] = set()  # never forgotten
        self._seen: dict[tuple[str, str], None] = {}  # refused; insertion-ordered: oldest first
        self._seen_max = seen_max
        self._dead_letter = dead_letter
        self._refused = refused
        # advice for every rank (timed by the advice), for this rank (by its arrival)
        self.limits = {"run": RateLimit(burst, refill_s), "rank": RateLimit(burst, refill_s)}
        self._answers = RateLimit(ANSWERS_BURST, 1.0)
        self._logged: set[str] = set()  # reasons of a refusal logged (once each)

    def count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def offer(self, message: Message, now_ns: int | None = None) -> Advice | None:
        """Take one message; the advice queued for the loop, or None."""
        key, value, _, _ = message
        if key is None:
            self.count("no_key")
            return None
        if key != self.key:
            self.count("other_run")
            return None
        rec = decode(value)
        if isinstance(rec, DecodeError):
            self._hostile(f"advice topic: {rec}", message)
            return None
        if rec.kind != "advice":
            self._hostile(f"advice topic: a {rec.kind!r} record, not advice", message)
            return None
        if rec.run_id != self.run_id:
            self._hostile(f"advice for run {rec.run_id!r} under key {key!r}", message)
            return None
        if rec.rank not in (RUN_RANK, self.rank):
            self.count("other_rank")
            return None
        data = msgspec.convert(rec.data, K.Advice)
        pair = (data.fingerprint, data.action)
        if pair in self._let_through or pair in self._seen:
            self.count("duplicate")
            return None
        now = time.time_ns() if now_ns is None else now_ns
        advice = Advice(rec.run_id, rec.rank, rec.step, rec.time_ns, now, data)
        if data.action not in self.remedies:
            why = f"remedy {data.action!r} not enabled: init(remedies=[...])"
            self._refuse(pair, advice, "not_opted_in", why)
            return None
        if len(self._let_through) >= MAX_LET_THROUGH:
            why = f"{MAX_LET_THROUGH} pieces of advice let through already: no more this run"
            self._refuse(pair, advice, "let_through_full", why)
            return None
        shared = rec.rank == RUN_RANK
        limit = self.limits["run" if shared else "rank"]
        if not limit.take(min(rec.time_ns, now) if shared else now):
            why = (
                f"rate limit: at most {limit.burst} pieces of advice at once, then one every "
                f"{limit.refill_ns / 1e9:g} s (advice_burst, advice_refill_s)"
            )
            self._refuse(pair, advice, "rate_limited", why)
            return None
        self._let_through.add(pair)
        queue = self.auto if data.action in AUTO else self.queue
        if len(queue) == queue.maxlen:
            self.count("queue_full")
        queue.append(advice)
        self.received += 1
        if queue is self.auto and self.ready is not None:
            self.ready()
        return advice

    def _hostile(self, reason: str, message: Message) -> None:
        self.count("broken")
        if self.rank == 0:
            self._dead_letter(reason, message)

    def _refuse(self, pair: tuple[str, str], advice: Advice, reason: str, why: str) -> None:
        """Count, remember (bounded), log once per reason, answer (rate-limited)."""
        self.count(reason)
        seen = self._seen
        seen[pair] = None
        if len(seen) > self._seen_max:
            del seen[next(iter(seen))]
            self.count("seen_forgotten")
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("steplens: advice refused (%s; said once, counted): %s", reason, why)
        if self._answers.take(time.monotonic_ns()):
            self._refused(advice, why)
        else:
            self.count("refused_unanswered")


class AdviceDesk:
    """The worker thread's side: the inbox, and the source its messages come from. The source
    is opened in a thread of its own (finding the topic's partitions and offsets waits on
    Kafka, which the worker thread never does), on the first ``poll`` and again after a
    failure, at most every ``retry_s``."""

    def __init__(
        self, inbox: AdviceInbox, make_source: Callable[[], AdviceSource], retry_s: float = 10.0
    ) -> None:
        self.inbox = inbox
        self.source: AdviceSource | None = None
        self._make_source = make_source
        self._retry_s = retry_s
        self._next_try = 0.0
        self._opening: threading.Thread | None = None
        self._closed = False
        self.last_error: str | None = None

    def poll(self, now: float, max_n: int = 256) -> int:
        """Take what arrived (never waits); the number of messages taken."""
        source = self.source
        if source is None:
            self._open_later(now)
            return 0
        try:
            messages = source.take_advice(max_n)
        except Exception as exc:  # opened again after ``retry_s``, from the rank's start
            self._failed(exc)
            self.source = None
            self._next_try = now + self._retry_s
            threading.Thread(target=_close_quietly, args=(source,), daemon=True).start()
            return 0
        inbox = self.inbox
        for message in messages:
            try:
                inbox.offer(message)
            except Exception:
                inbox.count("inbox_error")
        if inbox.auto and inbox.ready is not None:  # until log_step takes it
            inbox.ready()
        return len(messages)

    @property
    def source_label(self) -> str | None:
        """Where the advice comes from now (None: not open)."""
        source = self.source
        return None if source is None else source.label

    def _open_later(self, now: float) -> None:
        if now < self._next_try or (self._opening is not None and self._opening.is_alive()):
            return
        self._next_try = now + self._retry_s
        self._opening = threading.Thread(target=self._open, name="steplens-advice", daemon=True)
        self._opening.start()

    def _open(self) -> None:
        try:
            source = self._make_source()
        except Exception as exc:
            self._failed(exc)
            return
        if self._closed:
            source.close_advice()
        else:
            self.source = source

    def _failed(self, exc: Exception) -> None:
        self.inbox.count("source_error")
        self.last_error = f"{type(exc).__name__}: {exc}"

    def close(self, timeout_s: float = 1.0) -> None:
        self._closed = True
        if self._opening is not None:
            self._opening.join(timeout_s)
        source, self.source = self.source, None
        if source is not None:
            try:
                source.close_advice()
            except Exception as exc:
                self._failed(exc)


def _close_quietly(source: AdviceSource) -> None:
    try:
        source.close_advice()
    except Exception:
        log.debug("steplens: closing a failed advice source", exc_info=True)


__all__ = ["Advice", "AdviceDesk", "AdviceInbox", "AdviceSource", "Message"]
