"""A record the producer sends twice is stored once in S3 (within what one roller sees)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from sinks_helpers import (
    committed,
    end_offsets,
    produce,
    sink_process,
    step_batch,
    step_records,
    unique,
    wait_for,
)
from test_s3_roller import cold_rows, s3_settings

from steplens.schema import Record, encode, make_record
from steplens.sinks.chunks import RecentRecords, identity

pytestmark = pytest.mark.stack


def test_a_resent_record_is_stored_once_within_a_chunk_and_across_chunks(stack_env, topics) -> None:
    """After a broker freeze the producer re-sends what was in flight: the same bytes, same
    seq. Re-sent at once (same chunk) and after the first copies were rolled (later chunk)."""
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    run_id = unique("run")
    steps = step_records(run_id, 120, ranks=2)
    batches = [
        step_batch([replace(r, seq=1000 + i) for r in step_records(run_id, 10, ranks=1)])
        for i in range(3)
    ]
    first: list[Record] = [*steps[:100], *batches[:2]]
    again_soon = [*steps[90:96], batches[1]]  # in flight during the freeze: sent again at once
    produce(bootstrap, topics.raw, [*first, *again_soon])
    prefix, group = unique("dedupe"), unique("group")
    proc = sink_process("s3", topics, group, ["--prefix", prefix, "--max-age-s", "0.3"])
    try:
        ends = end_offsets(bootstrap, topics.raw, 4)
        wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "first chunks")
        again_later = [*steps[10:14], batches[0]]  # their first copies are already in S3
        produce(bootstrap, topics.raw, [*again_later, *steps[100:], batches[2]])
        ends = end_offsets(bootstrap, topics.raw, 4)
        wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "later chunks")
    finally:
        proc.terminate()
        proc.wait(30)
    rows = cold_rows(s3_settings(stack_env, prefix))
    ids = Counter((row["run_id"], row["rank"], row["seq"], row["step"]) for row in rows)
    assert [key for key, n in ids.items() if n > 1] == []
    assert len(rows) == len(steps) + 30


def test_recent_records_forget_the_oldest_first() -> None:
    a, b, c = (encode(r) for r in step_records("r", 3, ranks=1))
    recent = RecentRecords(size=2)
    assert [recent.first_time(x) for x in (a, b, a, c)] == [True, True, False, True]
    assert recent.first_time(a)  # pushed out by c: a window, not a set that grows
    assert not recent.first_time(bytes(c))  # the same bytes: the same record
    assert RecentRecords(size=0).first_time(a) and RecentRecords(size=0).first_time(a)


def test_signals_that_share_their_envelope_are_not_duplicates() -> None:
    """The worker's signals carry seq 0 and the encoding time: two of them can share the
    whole envelope on a coarse clock, and both must be stored."""
    envelope = {"run_id": "r", "rank": 0, "seq": 0, "time_ns": 1_700_000_000 * 10**9, "step": 5}
    spike = make_record("signal", {"name": "spike", "metric": "loss", "value": 9.0}, **envelope)
    zscore = make_record("signal", {"name": "zscore", "metric": "loss", "value": 9.0}, **envelope)
    recent = RecentRecords(size=10)
    assert recent.first_time(encode(spike)) and recent.first_time(encode(zscore))


def test_an_output_scored_again_by_another_worker_is_the_same_record() -> None:
    """A worker killed after its alert was sent, but before its offsets were committed: the
    worker that takes over scores the same records again and sends the same alert and signals
    with its own pid and host. They are the points already stored; the next state is not."""
    envelope = {"run_id": "r", "rank": -1, "seq": 0, "time_ns": 1_700_000_000 * 10**9, "step": 45}
    alert = {"rule": "spike:loss", "severity": "critical", "state": "firing", "scope": "incident"}
    alert |= {"hint": "h", "summary": "s", "fingerprint": "f1", "evidence": {}}
    sig = {"name": "spike", "metric": "loss", "value": 9.0, "detail": {"scope": "incident"}}
    recent = RecentRecords(size=10)
    for data, kind in [(alert, "alert"), (sig, "signal")]:
        first, second = (
            make_record(kind, data, host=host, pid=pid, **envelope)
            for host, pid in [("a", 10), ("b", 20)]
        )
        assert encode(first) != encode(second)
        assert recent.first_time(identity(first, encode(first)))
        assert not recent.first_time(identity(second, encode(second)))
    resolved = make_record("alert", alert | {"state": "resolved"}, **envelope)
    assert recent.first_time(identity(resolved, encode(resolved)))
    ranked = make_record("signal", sig, **(envelope | {"rank": 3}))
    assert recent.first_time(identity(ranked, encode(ranked)))
