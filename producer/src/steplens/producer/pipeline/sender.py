"""The last stage of the worker: envelope, encoding, hand-over to delivery.

Every record gets the rank's envelope and the next ``seq``; a record the codec refuses is
dropped and counted, except windows and batches too large for one record, which are split
(by metric, in halves) and never dropped whole. Runs only in the producer's worker thread.
"""

from __future__ import annotations

from typing import Any

from steplens.producer.delivery.live_or_spool import Delivery
from steplens.producer.identity import Identity
from steplens.producer.pipeline.step_batch import Entry, halves, payload
from steplens.schema import MAX_RECORD_BYTES, SCHEMA_VERSION, SchemaError, record_key
from steplens.schema.codec import encode


class Sender:
    def __init__(self, identity: Identity, pid: int, delivery: Delivery, wall_offset_ns: int):
        self.identity = identity
        self.pid = pid
        self.delivery = delivery
        self.wall_offset_ns = wall_offset_ns  # wall clock = monotonic + offset
        self.key = record_key(identity.run_id, identity.rank)
        self.seq = 0
        self.dropped: dict[str, int] = {}  # reason -> records dropped here

    def count_drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def send(
        self, kind: str, step: int | None, t_ns: int, data: dict[str, Any], count_drop: bool = True
    ) -> bool:
        """Encode and deliver one record (``t_ns`` monotonic); False when the codec refused it."""
        ident = self.identity
        record: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "kind": kind,
            "run_id": ident.run_id,
            "rank": ident.rank,
            "local_rank": ident.local_rank,
            "host": ident.host,
            "pid": self.pid,
            "seq": self.seq,
            "time_ns": t_ns + self.wall_offset_ns,
            "data": data,
        }
        if step is not None:
            record["step"] = step
        try:
            raw = encode(record)
        except SchemaError:
            if count_drop:
                self.count_drop("encode")
            return False
        self.seq += 1
        self.delivery.send(self.key, raw)
        return True

    def send_window(self, data: dict[str, Any], now_ns: int) -> None:
        """A window too large for one record is split by metric, never dropped whole."""
        metrics = data["metrics"]
        if len(metrics) > 1 and len(metrics) * 160 > MAX_RECORD_BYTES:
            ok = False
        else:
            ok = self.send("step_window", data["step_last"], now_ns, data, count_drop=False)
        if ok:
            return
        if len(metrics) <= 1:
            self.count_drop("encode")
            return
        names = list(metrics)
        half = len(names) // 2
        for part in (names[:half], names[half:]):
            self.send_window({**data, "metrics": {k: metrics[k] for k in part}}, now_ns)

    def send_batch(self, entries: list[Entry]) -> None:
        """A batch too large for one record is split in halves, never dropped whole."""
        last = entries[-1]
        t_ns = last["time_ns"] - self.wall_offset_ns  # send() adds the offset back
        if self.send("step_batch", last["step"], t_ns, payload(entries), count_drop=False):
            return
        if len(entries) == 1:
            self.count_drop("encode")
            return
        for part in halves(entries):
            self.send_batch(part)
