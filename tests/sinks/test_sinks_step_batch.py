"""step_batch records in the sinks: stored exactly as the step records they stand for."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
from influx_helpers import count_points, rows, run_influx_loop, settings_from
from sinks_helpers import (
    committed,
    end_offsets,
    produce,
    read_all,
    step_batch,
    unique,
    wait_for,
)
from test_s3_roller import cold_rows, s3_settings, start_roller

from steplens.schema import Record, decode, encode, make_record
from steplens.sinks.chunks import Chunker
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import Consumed
from steplens.sinks.query import Stores, query_records, query_series
from steplens.sinks.replay import cold_records
from steplens.sinks.s3 import S3Roller, ensure_bucket, make_s3_client


def rich_steps(run_id: str, n: int, *, rank: int = 0, seq: int = 7, t0: int = 0) -> list[Record]:
    """Steps using every kind of step field: NaN, ints, flags, text, lists, taken names."""
    t0 = t0 or time.time_ns() - 10**9
    return [
        make_record(
            "step",
            {
                "loss": 2.0 - i / 100,
                "lr": 1e-4,
                "grad_norm": math.nan if i == 3 else 0.5 + i,
                "tokens": 4096,
                "clipped": i % 2 == 0,
                "group_lrs": [1e-4, 2e-4],
                "scalars": {"z": float(i), "loss": -1.0},
                "reason": "every",
            },
            run_id=run_id,
            rank=rank,
            host=f"h{rank}",
            pid=100 + rank,
            seq=seq,
            step=i,
            time_ns=t0 + i * 1_000_000,
        )
        for i in range(n)
    ]


def as_run(recs: list[Record], run_id: str) -> list[Record]:
    return [replace(r, run_id=run_id) for r in recs]


pytestmark = pytest.mark.stack


def _influx_points(s, run_id: str) -> list[tuple]:
    got = rows(s, f'r._measurement == "step" and r.run_id == "{run_id}"')
    return sorted((r["_time"], r["rank"], r["host"], r["_field"], str(r["_value"])) for r in got)


def test_influx_batches_on_the_raw_topic_equal_the_steps_sent_raw(stack_env, topics) -> None:
    """Same points (measurement, tags, fields, times) as the same steps sent one by one; a
    redelivered batch rewrites its points; a batch with an unwritable step is dead-lettered
    once while its other steps are written."""
    s = settings_from(stack_env)
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    batched, raw = unique("batched"), unique("raw")
    t0 = time.time_ns() - 10**9
    per_rank = {rank: rich_steps(batched, 40, rank=rank, seq=rank + 1, t0=t0) for rank in range(3)}
    batches = [step_batch(steps[i : i + 15]) for steps in per_rank.values() for i in (0, 15, 30)]
    sent_raw = [
        r
        for steps in per_rank.values()
        for i in (0, 15, 30)
        for r in as_run(steps[i : i + 15], raw)
    ]
    bad_steps = rich_steps(batched, 4, rank=5, t0=t0)
    bad_steps[2] = replace(bad_steps[2], data={**bad_steps[2].data, "scalars": {"a\\b": 1.0}})
    bad = step_batch(bad_steps)
    produce(bootstrap, topics.raw, [*batches, bad, *sent_raw, *batches[:4]])  # 4 redelivered
    group = unique("group")
    loop = run_influx_loop(
        s, bootstrap, topics, group, batch_size=5, write_chunk=7
    )  # chunks cut through batches
    assert loop.stats.accepted == len(batches) + len(sent_raw) + 4
    assert count_points(s, raw) == 120
    assert count_points(s, batched) == 120 + 3  # the bad batch's other steps are written
    hot = [p for p in _influx_points(s, batched) if p[1] != "5"]
    assert len(hot) > 120 * 8 and hot == _influx_points(s, raw)
    (letter,) = [decode(m) for m in read_all(bootstrap, topics.dead_letters, 1)]
    reason = letter.data["reason"]
    assert "rejected by influx" in reason and "step 2:" in reason and "backslash" in reason
    assert decode(letter.data["payload"].encode()) == bad


def test_influx_batch_steps_past_the_hot_window(stack_env) -> None:
    s = settings_from(stack_env)
    run_id = unique("run")
    old = time.time_ns() - 2 * 3600 * 10**9
    stale = step_batch(rich_steps(run_id, 3, t0=old))
    straddling = step_batch([*rich_steps(run_id, 2, t0=old), *rich_steps(run_id, 5)[2:]])
    with make_client(s) as client:
        sink = InfluxSink(client, s)
        result = sink.export([stale, straddling])
        sink.shutdown()
    assert (result.accepted, result.skipped, result.rejected) == (1, 1, [])
    assert count_points(s, run_id) == 3


def test_s3_batches_on_the_raw_topic_equal_the_steps_sent_raw(stack_env, topics) -> None:
    """Same kind=step rows (fields, envelope, payload's record) as the steps sent raw; the
    cold query and replay find each step once."""
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    batched, raw = unique("batched"), unique("raw")
    t0 = time.time_ns() - 10**9
    per_rank = {rank: rich_steps(batched, 30, rank=rank, seq=rank + 1, t0=t0) for rank in range(2)}
    batches = [step_batch(steps[i : i + 10]) for steps in per_rank.values() for i in (0, 10, 20)]
    sent_raw = [r for steps in per_rank.values() for r in as_run(steps, raw)]
    produce(bootstrap, topics.raw, [*batches, *sent_raw])
    settings = s3_settings(stack_env, unique("prefix"))
    group = unique("group")
    r = start_roller(stack_env, topics, group, settings)
    try:
        ends = end_offsets(bootstrap, topics.raw, 4)
        wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "commits")
    finally:
        r.close()
    assert (r.loop.stats.accepted, r.loop.roller.stats.rows) == (len(batches) + 60, 120)
    rows = cold_rows(settings)
    assert {row["kind"] for row in rows} == {"step"}

    def comparable(run_id: str) -> list[dict]:
        """Rows of one run without run id and Kafka position, the payload as a record."""
        out = []
        for row in rows:
            if row["run_id"] == run_id:
                rec = decode(row["payload"])
                assert isinstance(rec, Record)
                kept = {k: v for k, v in row.items() if not k.startswith(("kafka_", "run"))}
                out.append({**kept, "payload": replace(rec, run_id="x")})
        return sorted(out, key=lambda row: (row["rank"], row["step"]))

    cold_batched = comparable(batched)
    assert len(cold_batched) == 60
    assert repr(cold_batched) == repr(comparable(raw))  # repr: NaN equals NaN
    by_offset: dict[tuple[int, int], int] = {}
    for row in rows:
        if row["run_id"] == batched:
            key = (row["kafka_partition"], row["kafka_offset"])
            by_offset[key] = by_offset.get(key, 0) + 1
    assert sorted(by_offset.values()) == [10] * len(batches)

    stores = Stores(None, settings)
    series = query_series(batched, "z", rank=1, stores=stores)
    assert list(series["step"]) == list(range(30)) and set(series["source"]) == {"s3"}
    assert len(query_records(batched, "step", stores=stores)) == 60
    replayed = [decode(p) for _, p in cold_records(settings, batched)]
    assert sorted((x.rank, x.step) for x in replayed) == [(k, i) for k in (0, 1) for i in range(30)]
    assert replayed[0] == per_rank[0][0]


def test_s3_a_redelivered_batch_rewrites_the_same_objects(stack_env) -> None:
    """A batch read again after a crash (no commit) lands in the same objects, once."""
    settings = s3_settings(stack_env, unique("crash"))
    client = make_s3_client(settings)
    ensure_bucket(client, settings.bucket)
    steps = rich_steps(unique("run"), 60)
    recs = [step_batch(steps[i : i + 6]) for i in range(0, 60, 6)]
    items = [Consumed("raw", 0, 300 + i, r.key, encode(r), r) for i, r in enumerate(recs)]
    first = S3Roller(client, settings)
    buffer = Chunker(first.marker, max_bytes=1 << 30)
    for item in items[:7]:
        assert buffer.add(item) == []
    (chunk,) = buffer.due(everything=True)
    assert (chunk.records, chunk.rows) == (7, 42)
    keys = first.write(chunk)  # ... and the process dies before the commit
    second = S3Roller(make_s3_client(settings), settings)
    buffer = Chunker(second.marker, max_bytes=1500)
    ready = [c for item in items for c in buffer.add(item)] + buffer.due(everything=True)
    assert (ready[0].first, ready[0].last) == (300, 306)
    assert second.write(ready[0]) == keys
    for c in ready[1:]:
        second.write(c)
    rows = cold_rows(settings)
    assert sorted((row["kafka_offset"], row["step"]) for row in rows) == [
        (300 + i // 6, i) for i in range(60)
    ]
    stored = [decode(row["payload"]) for row in sorted(rows, key=lambda x: x["step"])]
    assert repr(stored) == repr(steps)  # repr: NaN equals NaN
