"""Delivery with a disk spool: live to the transport, to the spool while it is unreachable,
replayed in order when it answers again. Runs only in the producer's worker thread.

Repeated warnings (a spool that cannot be written, Kafka going down again) are logged once per
reason and interval, with counts (``steplens.schema.log_limit``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from steplens.producer.delivery.spool import Spool
from steplens.producer.delivery.transport import OnResult, Transport
from steplens.schema.kafka_produce import retry_while_full
from steplens.schema.log_limit import LimitedLog

log = logging.getLogger("steplens")

LIVE, DOWN, REPLAY = "live", "down", "replay"
FULL_WAIT_S = 0.5  # longest a record waits for room in a full local buffer (worker thread)


@dataclass
class _Replay:
    """One spool segment on its way back to the transport, read on demand."""

    index: int
    frames: Iterator[tuple[bytes, bytes]]
    pending: tuple[bytes, bytes] | None = None  # refused by a full local buffer: sent next
    read_all: bool = False
    outstanding: int = 0
    failed: bool = False

    def on_result(self, owner: Delivery) -> OnResult:
        def done(ok: bool, _key: bytes, _value: bytes) -> None:
            owner._on_replayed(ok, self)

        return done


class Delivery:
    def __init__(
        self,
        make_transport: Callable[[], Transport],
        spool: Spool,
        probe_interval_s: float = 1.0,
        replay_batch: int = 256,
    ) -> None:
        self._make_transport = make_transport
        self.transport: Transport | None = (
            None  # created lazily: a process that never logs never connects
        )
        self.spool = spool
        self.state = LIVE
        self.probe_interval_s = probe_interval_s
        self.replay_batch = replay_batch  # records produced per service() call
        self.sent = 0  # acknowledged live records
        self.replayed = 0  # acknowledged records from the spool
        self.spooled = 0  # records written to the spool
        self.failed = 0  # delivery failures (each such record went to the spool)
        self.probes_failed = 0  # probes of an unreachable transport that got no answer
        self.in_flight = 0
        self._next_probe = 0.0
        self._replay: _Replay | None = None
        self._log = LimitedLog(log)

    # ---------------------------------------------------------------- sending
    def _tx(self) -> Transport:
        if self.transport is None:
            self.transport = self._make_transport()
        return self.transport

    def send_aside(self, topic: str, key: bytes, value: bytes, on_result: OnResult) -> bool:
        """One message to another topic than the raw one (a dead letter), best effort: no
        spool; False when the local buffer is full."""
        return self._tx().produce(key, value, on_result, topic=topic)

    def send(self, key: bytes, value: bytes) -> None:
        if self.state != LIVE:
            self._to_spool(key, value)
            return
        tx = self._tx()
        # a full local buffer: serve results and try again, briefly, unless they took it down
        try:
            queued = retry_while_full(
                lambda: tx.produce(key, value, self._on_live),
                tx.poll,
                FULL_WAIT_S,
                poll_s=0.01,
                give_up=lambda: self.state != LIVE,
            )
        except ConnectionError:  # refused for now (an unknown topic): kept, sent again later
            self._to_spool(key, value)
            self._go_down("produce refused")
            return
        if queued:
            self.in_flight += 1
            return
        self._to_spool(key, value)
        self._go_down("local buffer full")

    def _on_live(self, ok: bool, key: bytes, value: bytes) -> None:
        self.in_flight -= 1
        if ok:
            self.sent += 1
            return
        self.failed += 1
        self._to_spool(key, value)
        self._go_down("delivery failed")

    def _to_spool(self, key: bytes, value: bytes) -> None:
        try:
            if self.spool.append(key, value):
                self.spooled += 1
        except OSError as exc:
            self.spool.dropped_records += 1
            self._log.warning("spool write", "steplens: cannot write the spool: %s", exc)

    def _go_down(self, why: str) -> None:
        if self.state == DOWN:
            return
        if self.state == LIVE:
            self._log.warning(
                "kafka down",
                "steplens: Kafka unreachable (%s); spooling to %s",
                why,
                self.spool.directory,
            )
        self.state = DOWN
        self._replay = None
        self._next_probe = time.monotonic() + self.probe_interval_s
        if self.transport is not None:
            self.transport.purge_queued()  # queued records fail now and go to the spool in order

    # ---------------------------------------------------------------- servicing
    def service(self) -> bool:
        """Serve results, notice outages, probe while down, replay a slice when back.
        True while a replay has more to send (call again soon)."""
        if not self.spool.opened:  # first call: records left by ended processes join the spool
            try:
                self.spool.open()
            except OSError as exc:
                self._log.warning(
                    "spool open",
                    "steplens: cannot open the spool %s: %s",
                    self.spool.directory,
                    exc,
                )
        if self.transport is None:
            if self.state == LIVE and len(self.spool) == 0:
                return False
            self._tx()
        tx = self._tx()
        tx.poll(0)
        if self.state == LIVE and tx.take_down_signal():
            self._go_down("no broker answers")
            tx.poll(0)
        if self.state == LIVE and self.spool.records and self._replay is None:
            self.state = REPLAY  # records left by an earlier process
        if self.state == DOWN and time.monotonic() >= self._next_probe:
            if tx.reachable(0.5):
                self._log.warning(
                    "kafka back",
                    "steplens: Kafka is back; replaying %d spooled records",
                    self.spool.records,
                )
                self.state = REPLAY
                tx.take_down_signal()
            else:
                self.probes_failed += 1
                self._next_probe = time.monotonic() + self.probe_interval_s
        if self.state == REPLAY:
            self._replay_some(tx)
            return self.state == REPLAY
        return False

    def _replay_some(self, tx: Transport) -> None:
        """Produce at most ``replay_batch`` spooled records; a segment is deleted once every
        record in it was acknowledged."""
        if self._replay is None:
            oldest = self.spool.oldest_lazy()
            if oldest is None:
                self.state = LIVE
                return
            self._replay = _Replay(oldest[0], oldest[1])
        batch = self._replay
        callback = batch.on_result(self)
        for _ in range(self.replay_batch):
            if self.state != REPLAY or batch.read_all:
                break
            record = batch.pending or next(batch.frames, None)
            batch.pending = None
            if record is None:
                batch.read_all = True
                break
            try:
                queued = tx.produce(record[0], record[1], callback)
            except ConnectionError:  # refused for now: kept for the next replay
                batch.pending = record
                self._go_down("produce refused")
                break
            if not queued:
                batch.pending = record
                tx.poll(0.01)
                break
            batch.outstanding += 1
        tx.poll(0)
        if batch is self._replay and batch.read_all and not batch.outstanding:
            self.spool.remove(batch.index)
            self._replay = None

    def _on_replayed(self, ok: bool, batch: _Replay) -> None:
        batch.outstanding -= 1
        if ok:
            self.replayed += 1
            return
        batch.failed = True
        self.failed += 1
        self._go_down("replay failed")  # the segment stays; it is read again later

    # ---------------------------------------------------------------- flushing
    def flush(self, timeout_s: float, ending: bool = False) -> int:
        """Deliver what can be delivered within ``timeout_s``; returns records not yet acknowledged
        (in flight or in the spool). ``ending`` (the process ends): return as soon as the
        transport, asked at once, does not answer: nothing can move then, and the spool keeps
        what is left for the next process."""
        deadline = time.monotonic() + timeout_s
        probed = self.probes_failed
        while True:
            if ending and self.state == DOWN and self.probes_failed == probed:
                self._next_probe = 0.0  # ask now rather than at the next probe interval
            self.service()
            if self.transport is not None and self.state == LIVE:
                self.transport.flush(min(0.1, max(0.0, deadline - time.monotonic())))
            pending = self.in_flight + self.spool.records
            if pending == 0 or time.monotonic() >= deadline:
                return pending
            if self.state == DOWN:
                if ending and self.probes_failed > probed:
                    return pending
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def close(self, timeout_s: float) -> int:
        left = self.flush(timeout_s, ending=True)
        if self.transport is not None and self.in_flight:
            # unacknowledged records fail now and are kept in the spool for the next process
            self.transport.abandon(min(2.0, max(0.1, timeout_s)))
        self.spool.close()
        self._log.flush()
        return left
