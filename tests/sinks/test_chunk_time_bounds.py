"""The S3 roller's buffer refuses steps from the future, as the InfluxDB sink does: pure."""

from __future__ import annotations

import time

from steplens.schema import decode, encode, make_record
from steplens.schema.time_bounds import TimeBounds
from steplens.sinks.chunks import Chunker
from steplens.sinks.kafka_io import Consumed


def consumed(offset: int, value: bytes) -> Consumed:
    return Consumed("steplens.raw", 0, offset, b"r:0", value, decode(value))


def test_a_step_later_than_the_skew_is_dead_lettered_and_not_stored() -> None:
    now = time.time_ns()
    soon = encode(make_record("step", {"loss": 1.0}, run_id="r", seq=0, time_ns=now + 60 * 10**9))
    later = encode(
        make_record("step", {"loss": 2.0}, run_id="r", seq=1, time_ns=now + 3600 * 10**9)
    )
    batch = encode(
        make_record(
            "step_batch",
            {
                "records": [
                    {"step": 1, "time_ns": now, "loss": 1.5},
                    {"step": 2, "time_ns": now + 7200 * 10**9, "loss": 9.0},
                ]
            },
            run_id="r",
            seq=2,
            step=2,
            time_ns=now + 7200 * 10**9,
        )
    )
    chunker = Chunker(lambda tp: None, bounds=TimeBounds(max_future_skew_s=120))
    for i, value in enumerate([soon, later, batch]):
        assert chunker.add(consumed(i, value)) == []
    [chunk] = chunker.due(everything=True)
    stored = sorted(row["loss"] for rows in chunk.groups.values() for row in rows)
    assert stored == [1.0, 1.5]  # the batch's step in time is kept
    assert [item.offset for item, _ in chunk.dead] == [1, 2]
    assert all("in the future" in why and "120 s" in why for _, why in chunk.dead)
    assert chunk.rows == 2 and chunk.records == 3
