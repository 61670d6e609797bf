"""What the S3 roller's buffer holds for all partitions together is bounded: pure."""

from __future__ import annotations

import itertools

from steplens.schema import decode, encode, make_record
from steplens.sinks.chunks import Chunker
from steplens.sinks.kafka_io import Consumed


def consumed(partition: int, offset: int) -> Consumed:
    rec = make_record("step", {"loss": 1.0}, run_id="r", rank=partition, seq=offset, step=offset)
    value = encode(rec)
    return Consumed("steplens.raw", partition, offset, b"r:0", value, decode(value))


def test_past_the_budget_the_largest_chunk_rolls_and_every_message_is_kept() -> None:
    size = len(consumed(0, 0).value)
    chunker = Chunker(lambda tp: None, max_bytes=1 << 30, max_age_s=3600, buffer_bytes=20 * size)
    rolled = []
    for offset in range(100):
        for partition in range(3):
            if partition == 2 and offset % 2:
                continue  # partition 2 gets half as many
            rolled += chunker.add(consumed(partition, offset))
            assert chunker.held <= 20 * size
    assert rolled, "nothing rolled past the budget"
    assert all(c.nbytes >= 6 * size for c in rolled)  # the largest, not a small one
    rolled += chunker.due(everything=True)
    assert chunker.held == 0
    for partition, last in ((0, 99), (1, 99), (2, 98)):  # in order, no gap, no overlap
        spans = sorted((c.first, c.last) for c in rolled if c.partition == partition)
        assert spans[0][0] == 0 and spans[-1][1] == last
        assert all(a[1] < b[0] <= a[1] + 2 for a, b in itertools.pairwise(spans))
    expected = [(p, o) for o in range(100) for p in range(3) if not (p == 2 and o % 2)]
    assert sum(c.records for c in rolled) == len(expected)


def test_a_chunk_that_must_end_where_a_crashed_roller_stopped_does_not_roll_early() -> None:
    size = len(consumed(0, 0).value)
    marker = {("steplens.raw", 0): (0, 49)}
    chunker = Chunker(marker.get, max_bytes=1 << 30, max_age_s=3600, buffer_bytes=10 * size)
    rolled = []
    for offset in range(40):
        rolled += chunker.add(consumed(0, offset))
    assert rolled == []  # the forced chunk waits for its last offset, budget or not
    for offset in range(40, 50):
        rolled += chunker.add(consumed(0, offset))
    assert [(c.first, c.last) for c in rolled] == [(0, 49)]
