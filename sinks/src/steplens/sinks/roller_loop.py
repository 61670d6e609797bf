"""The S3 roller's loop: consume, buffer per partition, upload rolled chunks, then commit."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from steplens.sinks import metrics
from steplens.sinks.kafka_io import DeadLetters, commit, poll_batch
from steplens.sinks.loop import ConsumerLoop
from steplens.sinks.s3 import Chunk, S3Roller

log = logging.getLogger("steplens.sinks")


@dataclass
class RollerStats:
    chunks: int = 0
    objects: int = 0
    records: int = 0
    rows: int = 0
    dead_letters: int = 0
    commits: int = 0


class RollerLoop(ConsumerLoop):
    def __init__(
        self, consumer: Consumer, roller: S3Roller, dead_letters: DeadLetters, **loop: Any
    ) -> None:
        super().__init__(consumer, dead_letters, **loop)
        self.roller = roller
        self.stats = RollerStats()

    def on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.roller.drop([(tp.topic, tp.partition) for tp in partitions])

    def run(self, max_seconds: float | None = None) -> RollerStats:
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
            ready: list[Chunk] = []
            for item in poll_batch(self.consumer, self.batch_size, self.poll_timeout_s):
                ready += self.roller.add(item)
            ready += self.roller.due()
            for chunk in ready:
                if not self.flush(chunk):
                    return self.stats
        return self.stats

    def drain(self) -> None:
        """At shutdown: one attempt to upload and commit what is buffered (else it is re-read)."""
        for chunk in self.roller.due(everything=True):
            if not self.flush(chunk):
                return

    def flush(self, chunk: Chunk) -> bool:
        """Upload, send dead letters, commit; False if shutdown came first."""
        attempt = 0
        paused: list[TopicPartition] = []
        try:
            while True:
                try:
                    keys = self.roller.write(chunk)
                    break
                except Exception as exc:
                    attempt += 1
                    log.warning(
                        "steplens s3 roller: chunk %s-p%d o%d-%d not uploaded (attempt %d): %s",
                        chunk.topic,
                        chunk.partition,
                        chunk.first,
                        chunk.last,
                        attempt,
                        exc,
                    )
                    if not paused:
                        paused = self.consumer.assignment()
                        self.consumer.pause(paused)
                    if self.stop.wait(self._delay(attempt)):
                        return False
                    self._keep_alive()
        finally:
            if paused:
                self.consumer.resume(paused)
        for item, reason in chunk.dead:
            self.dead_letters.send(item, reason)
        if chunk.dead and not self._dead_letters_acknowledged():
            return False
        metrics.RECORDS.labels("s3", "accepted").inc(chunk.records)
        metrics.RECORDS.labels("s3", "dead_letter").inc(len(chunk.dead))
        self.stats.chunks += 1
        self.stats.objects += len(keys)
        self.stats.records += chunk.records
        self.stats.rows += chunk.rows
        self.stats.dead_letters += len(chunk.dead)
        ok = commit(self.consumer, [TopicPartition(chunk.topic, chunk.partition, chunk.last + 1)])
        metrics.COMMITS.labels("s3", "ok" if ok else "failed").inc()
        if ok:
            self.stats.commits += 1
            metrics.LAST_COMMIT.labels("s3").set_to_current_time()
        return True
