"""One advice reader per node, on the local broker: four ranks of one run on two nodes (two
local ranks each), as the README instruments them (the defaults: a remedy on, the relay on).
Advice written to the advice topic reaches every rank, while only each node's local rank 0
holds a Kafka consumer; a rank whose node relays nothing reads Kafka itself."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest
from confluent_kafka import Producer
from tests.waiting import wait_until

from steplens.producer.monitor import Monitor
from steplens.schema import RUN_RANK, encode, make_record

pytestmark = pytest.mark.stack


def advice(run_id: str, fingerprint: str) -> bytes:
    rec = make_record(
        "advice",
        {"action": "skip_samples", "fingerprint": fingerprint, "sample_ids": ["s-1"]},
        run_id=run_id,
        rank=RUN_RANK,
        step=10,
        time_ns=time.time_ns(),
    )
    return encode(rec)


def ranks(kafka, tmp_path, run_id: str, layout: list[tuple[int, int, str]], world: int):  # type: ignore[no-untyped-def]
    """One Monitor per (rank, local rank, host) of ``layout``, of a run of ``world`` ranks."""
    out = []
    for rank, local, host in layout:
        m = Monitor(
            run_id,
            rank=rank,
            local_rank=local,
            world_size=world,
            kafka_bootstrap=kafka.bootstrap,
            topic=kafka.topics.raw,
            advice_topic=kafka.topics.advice,
            remedies=["skip_samples"],
            hw_interval_s=0,
            hang_dump_after_s=0,
            spool_dir=str(tmp_path / f"spool-{rank}"),
            # several nodes on one machine: each its own node-local relay folder (the
            # relay's host is the machine's, read when the Monitor is made)
            advice_relay_dir=str(tmp_path / "relay" / host),
        )
        m.identity = replace(m.identity, host=host)
        out.append(m)
    return out


def step_until(monitors: list[Monitor], done, timeout_s: float) -> dict[int, list]:  # type: ignore[no-untyped-def]
    """Step every rank (as a training loop does) until ``done(seen)``: rank -> advice seen."""
    seen: dict[int, list] = {m.rank: [] for m in monitors}
    step = 0

    def again() -> bool:
        nonlocal step
        for m in monitors:
            m.log_step(step, loss=2.0)
            seen[m.rank] += m.advice()
        step += 1
        return done(seen)

    assert wait_until(again, timeout_s=timeout_s, every_s=0.1), seen
    return seen


def test_every_rank_gets_the_runs_advice_through_one_consumer_per_node(kafka, tmp_path):
    run_id = f"relay-{uuid.uuid4().hex[:8]}"
    layout = [(0, 0, "node-a"), (1, 1, "node-a"), (2, 0, "node-b"), (3, 1, "node-b")]
    monitors = ranks(kafka, tmp_path, run_id, layout, world=4)
    try:
        # every desk opens its source (local rank 0: its consumer, assigned from its start)
        step_until(monitors, lambda seen: all(_source(m) for m in monitors), 60)
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        producer.produce(kafka.topics.advice, advice(run_id, "fp-1"), key=run_id.encode())
        producer.produce(kafka.topics.advice, advice("other-run", "fp-2"), key=b"other-run")
        producer.flush(10)
        seen = step_until(monitors, lambda seen: all(seen.values()), 60)
        assert {r: [a.fingerprint for a in got] for r, got in seen.items()} == {
            r: ["fp-1"] for r in range(4)
        }
        relayed, read = "kafka, relayed to the node", "node relay"
        assert [_source(m) for m in monitors] == [relayed, read, relayed, read]
        # the other run's advice: read and refused by the consumers only, never relayed
        other = [m.stats()["advice"].get("other_run", 0) for m in monitors]
        assert other[0] >= 1 and other[2] >= 1 and other[1] == other[3] == 0
    finally:
        for m in monitors:
            m.shutdown(10)


def test_a_rank_whose_node_relays_nothing_reads_kafka_itself(kafka, tmp_path, monkeypatch):
    monkeypatch.setattr("steplens.producer.remedies.advice_relay.RELAY_WAIT_S", 1.0)
    run_id = f"relay-{uuid.uuid4().hex[:8]}"
    # local rank 1 of a node whose local rank 0 is not instrumented
    (m,) = ranks(kafka, tmp_path, run_id, [(1, 1, "node-a")], world=2)
    try:
        step_until([m], lambda seen: _source(m) == "kafka", 90)
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        producer.produce(kafka.topics.advice, advice(run_id, "fp-3"), key=run_id.encode())
        producer.flush(10)
        seen = step_until([m], lambda seen: bool(seen[1]), 60)
        assert [a.fingerprint for a in seen[1]] == ["fp-3"]
        assert m.stats()["advice"].get("source_error") == 1  # the relay given up, once
    finally:
        m.shutdown(10)


def _source(m: Monitor) -> str | None:
    return m.stats()["advice_source"]
