"""The S3 roller's buffer: messages to Parquet rows, per partition, in chunks that roll.

A partition's messages are buffered into a chunk; a chunk rolls by size or age, or exactly at
the last offset of the range a crashed roller was uploading (its state marker, read through
``marker``), so a retry after a crash covers the same offsets and writes the same object keys.
What all partitions hold together is bounded too (``buffer_bytes`` of messages, about three
times that in memory as rows): past it the largest chunk rolls early. A run of 16,384 ranks
sends about 12 MB a second, which a minute's chunks held as 1.4 GB (over the 1 GB the
compose file gives the roller).

Time: a step stamped further ahead of the clock than ``TimeBounds`` allows is not stored; its
message is dead-lettered with the reason, as the InfluxDB sink does.

Duplicates: a record the producer sent twice (a re-send after a broker freeze: the same bytes,
so the same run, rank, host, pid, ``seq``, time and data) is stored once, and so is a worker's
alert or signal scored again after a worker restart (the same point; see ``identity``). A record
already seen
among the partition's last ``dedupe_window`` records (this chunk or the ones before) is left
out, its rows counted as duplicates.
The memory is the process's own, so a duplicate can still be stored twice when its first copy
was rolled before a restart of the roller or a move of the partition to another roller, or is
more than ``dedupe_window`` records back; `steplens query` keeps one row per point in any case.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from steplens import schema
from steplens.schema import DecodeError, Record
from steplens.schema.time_bounds import TimeBounds
from steplens.sinks import metrics
from steplens.sinks.cold import GroupKey, group_of, record_row
from steplens.sinks.kafka_io import Consumed
from steplens.sinks.settings import RollSettings

TopicPart = tuple[str, int]
Marker = Callable[[TopicPart], "tuple[int, int] | None"]


@dataclass
class Chunk:
    topic: str
    partition: int
    first: int
    last: int = -1
    nbytes: int = 0
    started: float = field(default_factory=time.monotonic)
    forced_last: int | None = None  # from the state marker: end exactly here
    groups: dict[GroupKey, list[dict]] = field(default_factory=lambda: defaultdict(list))
    dead: list[tuple[Consumed, str]] = field(default_factory=list)
    records: int = 0  # Kafka messages decoded
    rows: int = 0  # rows to store (a step_batch gives one per step)
    duplicates: int = 0  # rows left out: already stored or buffered


class RecentRecords:
    """The identities of a partition's last ``size`` records (first in, first out).

    A record sent twice is the same bytes twice: the producer re-sends what it spooled as it
    was encoded (run, rank, host, pid, ``seq``, time and data). The envelope alone is not
    enough: the worker's signals all carry ``seq`` 0 and the encoding time, which two signals
    can share on a coarse clock. The bytes are kept as a 64-bit hash (about 60 bytes a record
    here): two different records in a window of 50,000 collide with odds of about 1 in 10^10
    over 10^14 records."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._order: deque[int] = deque()
        self._seen: set[int] = set()

    def first_time(self, ident: Hashable) -> bool:
        """True (and remembered) unless the record ``ident`` (``identity``) is among the
        recent ones."""
        if self.size <= 0:
            return True
        key = hash(ident)
        if key in self._seen:
            return False
        self._seen.add(key)
        self._order.append(key)
        if len(self._order) > self.size:
            self._seen.discard(self._order.popleft())
        return True


def identity(rec: Record, value: bytes) -> Hashable:
    """What makes two copies one record: a producer's record is its bytes (a re-send is the
    same bytes); a worker's alert or signal is its point, as InfluxDB keys it (scored again by
    the worker that took over, it carries that worker's pid and host)."""
    d = rec.data
    if rec.kind == "alert":
        return ("alert", rec.run_id, d.get("fingerprint"), d.get("state"), rec.step, rec.time_ns)
    if rec.kind == "signal":
        scope = (d.get("detail") or {}).get("scope")
        point = (d.get("name"), d.get("metric"), scope, rec.rank, rec.step, rec.time_ns)
        return ("signal", rec.run_id, *point)
    return value


class Chunker:
    """Buffers messages per partition and hands out chunks ready to upload."""

    def __init__(
        self,
        marker: Marker,
        *,
        max_bytes: int = RollSettings.max_bytes,
        max_age_s: float = RollSettings.max_age_s,
        dedupe_window: int = RollSettings.dedupe_window,
        bounds: TimeBounds | None = None,
        buffer_bytes: int = RollSettings.buffer_bytes,
    ) -> None:
        self.marker = marker
        self.bounds = bounds or TimeBounds.from_env()
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.buffer_bytes = buffer_bytes
        self.held = 0  # bytes of the messages in every partition's chunk
        self.dedupe_window = dedupe_window
        self.chunks: dict[TopicPart, Chunk] = {}
        self._recent: dict[TopicPart, RecentRecords] = {}

    def add(self, item: Consumed) -> list[Chunk]:
        """Buffer one message; returns chunks that must be written before it fits."""
        tp = (item.topic, item.partition)
        ready = []
        chunk = self.chunks.get(tp)
        if chunk is not None and chunk.forced_last is not None and item.offset > chunk.forced_last:
            ready.append(self._take(tp))
            chunk = None
        if chunk is None:
            marker = self.marker(tp)  # may raise: then nothing has changed, add again
            chunk = self.chunks[tp] = Chunk(item.topic, item.partition, item.offset)
            if marker is not None and marker[0] == item.offset:
                chunk.forced_last = marker[1]
        chunk.last = item.offset
        if isinstance(item.decoded, DecodeError):
            chunk.dead.append((item, f"undecodable: {item.decoded}"))
        else:
            self._rows(chunk, item, item.decoded)
        chunk.nbytes += len(item.value)
        self.held += len(item.value)
        if chunk.forced_last is not None:
            if item.offset >= chunk.forced_last:
                ready.append(self._take(tp))
        elif chunk.nbytes >= self.max_bytes:
            ready.append(self._take(tp))
        if self.held > self.buffer_bytes:
            ready += self._largest()
        return ready

    def _take(self, tp: TopicPart) -> Chunk:
        chunk = self.chunks.pop(tp)
        self.held -= chunk.nbytes
        return chunk

    def _largest(self) -> list[Chunk]:
        """The largest chunk that may roll early (not one that must end at a crashed
        roller's offset), to bring what all partitions hold back under ``buffer_bytes``."""
        free = [tp for tp, c in self.chunks.items() if c.forced_last is None]
        if not free:
            return []
        return [self._take(max(free, key=lambda tp: self.chunks[tp].nbytes))]

    def _rows(self, chunk: Chunk, item: Consumed, rec: Record) -> None:
        recent = self._recent.get((item.topic, item.partition))
        if recent is None:
            recent = self._recent[(item.topic, item.partition)] = RecentRecords(self.dedupe_window)
        steps = schema.unbatch(rec)  # a step_batch is stored as its step records
        chunk.records += 1
        if not recent.first_time(identity(rec, item.value)):
            chunk.duplicates += len(steps)
            return
        now_ns = time.time_ns()
        newest_ns = self.bounds.newest_ns(now_ns)
        future = [s for s in steps if s.time_ns > newest_ns]
        if future:  # dead-lettered whole, as InfluxDB refuses it; the steps in time are kept
            chunk.dead.append((item, self.bounds.future_reason(future[0].time_ns, now_ns)))
            metrics.OUT_OF_TIME.labels("s3", "future").inc(len(future))
            steps = [s for s in steps if s.time_ns <= newest_ns]
        batched = rec.kind == "step_batch"
        for step in steps:
            # each step row keeps its own step record's bytes, so replay re-sends steps
            payload = schema.encode(step) if batched else item.value
            row = record_row(step, item.topic, item.partition, item.offset, payload)
            chunk.groups[group_of(step)].append(row)
        chunk.rows += len(steps)

    def due(self, everything: bool = False) -> list[Chunk]:
        """Chunks old enough to roll (all of them with ``everything``)."""
        now = time.monotonic()
        keys = [
            tp
            for tp, c in self.chunks.items()
            if everything or (c.forced_last is None and now - c.started >= self.max_age_s)
        ]
        return [self._take(tp) for tp in keys]

    def drop(self, partitions: Iterable[TopicPart]) -> None:
        """Forget the buffers of these partitions (revoked, or not to be committed past)."""
        for tp in partitions:
            if tp in self.chunks:
                self._take(tp)
            self._recent.pop(tp, None)
