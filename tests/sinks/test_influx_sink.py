"""The InfluxDB sink against the real InfluxDB (and Kafka for the loop)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from confluent_kafka import Consumer
from influx_helpers import count_points, rows, run_influx_loop, settings_from
from prometheus_client import REGISTRY
from sinks_helpers import (
    committed,
    end_offsets,
    produce,
    read_all,
    step_records,
    unique,
    wait_for,
)

from steplens.schema import decode, make_record
from steplens.schema.kafka_config import consumer_config
from steplens.schema.topics import ensure_topics
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import DeadLetters
from steplens.sinks.loop import SinkLoop
from steplens.sinks.retry import RetryPolicy

pytestmark = pytest.mark.stack

HOSTILE = [
    "a,b",
    "a b",
    "a=b",
    'say "hi"',
    "'single'",
    "grüße 日本 🚀",
    "x,y=z w=1 123",
    "trailing space ",
    "#comment",
]


def test_hostile_tag_and_field_values_round_trip_without_injection(stack_env) -> None:
    s = settings_from(stack_env)
    run_id = unique("run") + ' ,="é'
    now = time.time_ns()
    recs = [
        make_record(
            "step",
            {"loss": float(i), "scalars": {v: float(i)}},
            run_id=run_id,
            rank=0,
            host=v,
            seq=i,
            step=i,
            time_ns=now + i,
        )
        for i, v in enumerate(HOSTILE)
    ]
    hint = 'line one\nstep,run_id=INJECTED loss=1 1\n"quoted" back\\slash, a=b é'
    alert = make_record(
        "alert",
        {
            "rule": 'r ,="',
            "severity": "critical",
            "state": "firing",
            "scope": "rank:0",
            "hint": hint,
            "fingerprint": "fp",
        },
        run_id=run_id,
        rank=-1,
        time_ns=now + 100,
        step=5,
    )
    newline_tag = make_record("step", {"loss": 1.0}, run_id=run_id, host="a\nb", time_ns=now + 200)
    backslash_tag = make_record("step", {"loss": 1.0}, run_id=run_id, host="a\\", time_ns=now + 201)
    with make_client(s) as client:
        sink = InfluxSink(client, s)
        result = sink.export([*recs, alert, newline_tag, backslash_tag])
        sink.shutdown()
    assert not result.retryable
    assert [r.index for r in result.rejected] == [len(recs) + 1, len(recs) + 2]
    assert "control character" in result.rejected[0].reason
    assert "backslash" in result.rejected[1].reason
    assert result.accepted == len(recs) + 1

    run_q = run_id.replace('"', '\\"')
    got = rows(s, f'r._measurement == "step" and r.run_id == "{run_q}" and r._field == "loss"')
    assert sorted((r["host"], r["_value"]) for r in got) == sorted(
        (v, float(i)) for i, v in enumerate(HOSTILE)
    )
    others = 'r._field != "loss" and r._field != "seq" and r._field != "step"'
    scalars = rows(s, f'r._measurement == "step" and {others} and r.run_id == "{run_q}"')
    assert sorted(r["_field"] for r in scalars) == sorted(HOSTILE)
    alerts = rows(s, f'r._measurement == "alert" and r._field == "hint" and r.run_id == "{run_q}"')
    assert [(a["rule"], a["_value"]) for a in alerts] == [('r ,="', hint)]
    assert rows(s, 'r.run_id == "INJECTED"') == []
    assert count_points(s, run_id) == len(HOSTILE)


def test_nan_and_infinity_are_kept_as_facts(stack_env) -> None:
    s = settings_from(stack_env)
    run_id = unique("run")
    now = time.time_ns()
    recs = [
        make_record("step", {"loss": v, "lr": 1.0}, run_id=run_id, seq=i, step=i, time_ns=now + i)
        for i, v in enumerate([float("nan"), float("inf"), -float("inf"), 1.5])
    ]
    with make_client(s) as client:
        assert InfluxSink(client, s).export(recs).accepted == 4
    got = {
        r["_field"]: r["_value"] for r in rows(s, f'r.run_id == "{run_id}" and r._field =~ /^loss/')
    }
    nonfinite = sorted(
        r["_value"] for r in rows(s, f'r.run_id == "{run_id}" and r._field == "loss_nonfinite"')
    )
    assert nonfinite == ["-Infinity", "Infinity", "NaN"]
    assert got["loss"] == 1.5


def test_type_conflict_rejects_only_the_bad_record(stack_env) -> None:
    s = settings_from(stack_env)
    run_id = unique("run")
    now = time.time_ns()
    ok = [
        make_record(
            "comm",
            {"op": "all_reduce", "latency_ms": 1.0, "backend": "nccl"},
            run_id=run_id,
            seq=i,
            time_ns=now + i,
        )
        for i in range(20)
    ]
    conflicting = make_record(
        "hw", {"gpus": [{"index": 0, "power_w": 1.0}]}, run_id=run_id, time_ns=now + 50
    )
    conflicting2 = make_record(
        "hw", {"gpus": [{"index": 0, "power_w": "high"}]}, run_id=run_id, time_ns=now + 51
    )
    with make_client(s) as client:
        sink = InfluxSink(client, s)
        first = sink.export([conflicting])
        result = sink.export([*ok[:10], conflicting2, *ok[10:]])
    assert first.accepted == 1
    assert [r.index for r in result.rejected] == [10]
    assert "HTTP 422" in result.rejected[0].reason and "conflict" in result.rejected[0].reason
    assert result.accepted == 20
    assert count_points(s, run_id, "comm") == 20


def test_records_past_the_hot_window_are_skipped_not_dead_lettered(stack_env) -> None:
    s = settings_from(stack_env)
    run_id = unique("run")
    old = make_record(
        "step", {"loss": 1.0}, run_id=run_id, time_ns=time.time_ns() - 2 * 3600 * 10**9
    )
    before_past = _out_of_time("past_retention")
    with make_client(s) as client:
        result = InfluxSink(client, s).export([old])
    assert (result.accepted, result.skipped, result.rejected) == (0, 1, [])
    assert _out_of_time("past_retention") == before_past + 1


def _out_of_time(reason: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "steplens_sink_out_of_time_total", {"sink": "influx", "reason": reason}
        )
        or 0.0
    )


def test_records_from_the_future_are_refused_with_the_reason(stack_env, monkeypatch) -> None:
    """Past the allowed clock skew a record is refused (dead-lettered by the loop), counted;
    within it, it is written."""
    monkeypatch.setenv("STEPLENS_MAX_FUTURE_SKEW_S", "120")
    s = settings_from(stack_env)
    run_id = unique("run")
    now = time.time_ns()
    soon = make_record("step", {"loss": 1.0}, run_id=run_id, seq=0, time_ns=now + 60 * 10**9)
    later = make_record("step", {"loss": 2.0}, run_id=run_id, seq=1, time_ns=now + 3600 * 10**9)
    before = _out_of_time("future")
    with make_client(s) as client:
        result = InfluxSink(client, s).export([soon, later])
    assert result.accepted == 1 and result.skipped == 0
    [refused] = result.rejected
    assert refused.index == 1 and "in the future" in refused.reason and "120 s" in refused.reason
    assert _out_of_time("future") == before + 1


def test_loop_commits_after_write_dedupes_and_dead_letters(stack_env, topics) -> None:
    s = settings_from(stack_env)
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    run_id = unique("run")
    records = step_records(run_id, 400, ranks=4)
    bad = [(b"k:0", b"{not json"), (b"k:1", b'{"v": 2}')]
    unwritable = make_record(
        "step", {"loss": 1.0}, run_id=run_id, host="tab\there", time_ns=time.time_ns()
    )
    produce(bootstrap, topics.raw, [*records, *bad, unwritable, *records[:100]])  # 100 re-sent
    group = unique("group")
    run_influx_loop(s, bootstrap, topics, group, batch_size=200)
    assert count_points(s, run_id) == 400
    letters = [decode(m) for m in read_all(bootstrap, topics.dead_letters, 3)]
    assert len(letters) == 3
    reasons = sorted(d.data["reason"] for d in letters)
    assert sum(r.startswith("undecodable") for r in reasons) == 2
    assert any("rejected by influx" in r and "control character" in r for r in reasons)
    assert all(d.data["source_topic"] == topics.raw for d in letters)


def test_a_dead_letter_whose_delivery_failed_is_sent_again_before_the_commit(
    stack_env, topics
) -> None:
    """The dead-letter topic is missing at first: the letter's delivery fails. The batch must
    not be committed until a letter sent again is acknowledged."""
    s = settings_from(stack_env)
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    produce(bootstrap, topics.raw, [(b"k:0", b"{not json")])
    later = replace(topics, dead_letters=unique("dl-later"), raw=unique("raw-unused"))
    group, stop = unique("group"), threading.Event()
    consumer = Consumer(consumer_config(group, bootstrap))
    consumer.subscribe([topics.raw])
    dead = DeadLetters(later.dead_letters, group, bootstrap, **{"message.timeout.ms": 1500})
    with make_client(s) as client:
        sink = InfluxSink(client, s)
        loop = SinkLoop(consumer, sink, dead, stop=stop, backoff=RetryPolicy(initial_backoff_s=0.5))
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: dead.sent >= 2, 60, "a second send after the failed delivery")
            assert committed(bootstrap, group, topics.raw, 4) == dict.fromkeys(range(4), 0)
            ensure_topics(bootstrap, later)
            ends = end_offsets(bootstrap, topics.raw, 4)
            wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "commit")
        finally:
            stop.set()
            thread.join(30)
            consumer.close()
            sink.shutdown()
    letters = [decode(m) for m in read_all(bootstrap, later.dead_letters, 1)]
    assert letters and all("undecodable" in d.data["reason"] for d in letters)
