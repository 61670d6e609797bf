"""Reading one run's stream-job outputs back from Kafka, for the demo's scorecard."""

from __future__ import annotations

import time
from typing import Any

from steplens.schema import Record, decode


class RunTail:
    """Follows topics from their beginning and keeps the records of one run.

    Uses ``assign`` (no consumer group), so it neither joins nor disturbs the workers' groups.
    """

    def __init__(self, bootstrap: str, topics: list[str], run_id: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from steplens.schema.kafka_config import consumer_config

        self.run_id = run_id
        self.records: list[Record] = []
        self._consumer = Consumer(consumer_config(f"steplens-demo-tail-{run_id}", bootstrap))
        parts = []
        for topic in topics:
            meta = self._consumer.list_topics(topic, timeout=15).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        self._consumer.assign(parts)

    def drain(self, max_s: float = 5.0) -> int:
        """Read what is available now (at most ``max_s``); returns how many run records came.

        Stops at the first empty poll once every assigned partition is at its end."""
        before = len(self.records)
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline:
            msgs = self._consumer.consume(500, timeout=0.5)
            if not msgs and self._at_end():
                break
            for msg in msgs:
                if msg.error():
                    continue
                rec = decode(msg.value())
                if isinstance(rec, Record) and rec.run_id == self.run_id:
                    self.records.append(rec)
        return len(self.records) - before

    def _at_end(self) -> bool:
        """Every assigned partition read to its end; False while that is not known (a
        partition the client's metadata does not hold yet answers "Unknown partition")."""
        from confluent_kafka import KafkaException

        try:
            return self._read_to_end()
        except KafkaException:
            return False

    def _read_to_end(self) -> bool:
        for tp in self._consumer.position(self._consumer.assignment()):
            _, high = self._consumer.get_watermark_offsets(tp, timeout=5, cached=False)
            if tp.offset < 0 and high > 0:  # nothing fetched yet from a non-empty partition
                return False
            if 0 <= tp.offset < high:
                return False
        return True

    def settle(self, quiet_s: float, timeout_s: float, progress: Any = print) -> bool:
        """Wait until no new record arrived for ``quiet_s`` (bounded by ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        last_new = time.monotonic()
        shown = 0.0
        while time.monotonic() < deadline:
            if self.drain(2.0):
                last_new = time.monotonic()
            elif time.monotonic() - last_new >= quiet_s:
                return True
            else:
                time.sleep(0.5)
            if time.monotonic() - shown > 5:
                shown = time.monotonic()
                progress(
                    f"[demo] waiting for the stream jobs to catch up: "
                    f"{len(self.records)} outputs so far"
                )
        return False

    def of_kind(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]

    def close(self) -> None:
        self._consumer.close()


def alert_rows(records: list[Record]) -> list[dict[str, Any]]:
    """Alert records as flat dicts (data fields, plus step and rank from the envelope)."""
    rows = []
    for rec in records:
        row = dict(rec.data)
        row.setdefault("step", rec.step)
        evidence = row.get("evidence") or {}
        if "rank" not in row:
            rank = evidence.get("rank") if isinstance(evidence, dict) else None
            row["rank"] = rank if isinstance(rank, int) else rec.rank
        row["time_ns"] = rec.time_ns
        rows.append(row)
    return rows
