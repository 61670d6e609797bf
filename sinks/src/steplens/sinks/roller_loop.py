"""The S3 roller's loop: buffer per partition, export rolled chunks until durable, commit.

A chunk starts only once the partition's state marker is known (``S3Roller.marker``); while S3
cannot say, the loop asks again under its retry policy, as for an upload.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from steplens.sinks.chunks import Chunk, Chunker
from steplens.sinks.kafka_io import Consumed, DeadLetters
from steplens.sinks.loop import ConsumerLoop
from steplens.sinks.s3 import S3Roller


class RollerLoop(ConsumerLoop[Chunk]):
    def __init__(
        self,
        consumer: Consumer,
        roller: S3Roller,
        dead_letters: DeadLetters,
        *,
        chunker: Chunker | None = None,
        **loop: Any,
    ) -> None:
        super().__init__(consumer, roller, dead_letters, **loop)
        self.roller = roller
        self.chunker = chunker or Chunker(roller.marker)

    def on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Forget buffers of revoked partitions; their new owner re-reads them from Kafka."""
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self.chunker.drop(tps)
        self.roller.forget(tps)

    def handle(self, polled: list[Consumed]) -> bool:
        ready: list[Chunk] = []
        for item in polled:
            added = self.until_done(partial(self._add, item), _known, "a state marker read")
            if not isinstance(added, list):  # shutdown: nothing from here on is committed
                self.chunker.drop({(c.topic, c.partition) for c in ready})
                return False
            ready += added
        ready += self.chunker.due()
        return self._flush_all(ready)

    def _add(self, item: Consumed) -> list[Chunk] | str:
        """The chunks ``item`` completes, or why its partition's state marker is unknown
        (nothing was buffered then)."""
        try:
            return self.chunker.add(item)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def drain(self) -> None:
        """At shutdown: one attempt to upload and commit what is buffered (else it is re-read)."""
        self._flush_all(self.chunker.due(everything=True))

    def _flush_all(self, ready: list[Chunk]) -> bool:
        for i, chunk in enumerate(ready):
            if not self.flush(chunk):
                # Shutdown came first. What is buffered behind an unwritten chunk must not be
                # committed by ``drain``: its commit would skip the unwritten offsets.
                self.chunker.drop({(c.topic, c.partition) for c in ready[i:]})
                return False
        return True

    def flush(self, chunk: Chunk) -> bool:
        """Upload, send dead letters, commit; False if shutdown came first."""
        return self.deliver(
            chunk,
            size=chunk.records,
            origin=(),  # the roller refuses no record: only undecodable ones are dead-lettered
            bad=chunk.dead,
            offsets=[TopicPartition(chunk.topic, chunk.partition, chunk.last + 1)],
        )


def _known(added: list[Chunk] | str) -> bool:
    return isinstance(added, list)
