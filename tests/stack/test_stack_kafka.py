"""Kafka of the local stack: produce and consume back; data survives a restart."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from steplens.schema.topics import Topics, ensure_topics

pytestmark = pytest.mark.stack


def _topics() -> Topics:
    tag = uuid.uuid4().hex[:8]
    return Topics(
        raw=f"t{tag}.raw",
        signals=f"t{tag}.sig",
        alerts=f"t{tag}.al",
        dead_letters=f"t{tag}.dl",
        advice=f"t{tag}.adv",
        raw_partitions=2,
        other_partitions=1,
    )


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    # idempotent, as the steplens producer is: a retried first send (a topic just created, its
    # leader not yet known) must not land after the ones behind it
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, key=b"run:0", value=value)
    assert producer.flush(30) == 0


def _consume(bootstrap: str, topic: str, count: int, timeout_s: float = 30) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_message_round_trip(stack_env: dict[str, str]) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    topics = _topics()
    assert set(ensure_topics(bootstrap, topics)) == set(topics.all())
    values = [f"m{i}-{uuid.uuid4()}".encode() for i in range(5)]
    _produce(bootstrap, topics.raw, values)
    assert sorted(_consume(bootstrap, topics.raw, len(values))) == sorted(values)


def test_up_creates_steplens_topics(stack_env: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": stack_env["STEPLENS_KAFKA_BOOTSTRAP"]}).list_topics(
        timeout=10
    )
    for name, partitions in Topics.from_env().all().items():
        assert len(meta.topics[name].partitions) == partitions


@pytest.mark.slow
def test_restart_keeps_messages(private_stack) -> None:
    stack = private_stack(["kafka"])
    bootstrap = stack.env()["STEPLENS_KAFKA_BOOTSTRAP"]
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    ensure_topics(
        bootstrap,
        Topics(
            raw=topic,
            signals=topic + ".s",
            alerts=topic + ".a",
            dead_letters=topic + ".d",
            advice=topic + ".v",
            raw_partitions=1,
        ),
    )
    values = [f"before-restart-{i}".encode() for i in range(3)]
    _produce(bootstrap, topic, values)
    old_pid = stack.pid("kafka")
    assert stack.stop("kafka") is True
    assert stack.pid("kafka") is None
    stack.start("kafka")
    assert stack.pid("kafka") not in (None, old_pid)
    assert _consume(bootstrap, topic, len(values)) == values


def test_scratch_topics_deletes_only_what_the_block_created(
    stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scratch_topics import scratch_topics, topic_names

    monkeypatch.delenv("STEPLENS_KEEP_SCRATCH_TOPICS", raising=False)

    boot = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    older, newer = _topics(), _topics()
    ensure_topics(boot, older)
    with scratch_topics(boot):
        ensure_topics(boot, newer)
    # metadata reaches the broker a moment after the controller commits a change
    deadline = time.monotonic() + 15
    while set(newer.all()) & (names := topic_names(boot)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(newer.all()) & names
    assert set(older.all()) <= names
    assert set(Topics().all()) <= names


def test_the_demo_tail_reads_on_while_a_partition_is_unknown(stack_env) -> None:
    """The demo's scorecard tail asks each partition for its end; a partition the client's
    metadata does not hold ("Unknown partition", seen right after a topic was made) means
    "not known to be at the end", never an exception that ends the demo."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from steplens.schema import encode, make_record
    from steplens.stack.demo_kafka import RunTail

    topics = _topics()
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    ensure_topics(bootstrap, topics)
    rec = make_record("step", {"loss": 1.0}, run_id="tail-run", step=1, time_ns=time.time_ns())
    _produce(bootstrap, topics.alerts, [encode(rec)])
    tail = RunTail(bootstrap, [topics.alerts], "tail-run")
    assert tail.settle(quiet_s=1.0, timeout_s=30.0, progress=lambda _line: None)
    assert [r.step for r in tail.records] == [1]
    # a partition that does not exist stands for one not yet in the client's metadata
    tail._consumer.assign([TopicPartition(topics.alerts, 7, OFFSET_BEGINNING)])
    assert tail.drain(1.0) == 0  # no exception: read on until the deadline
    assert not tail.settle(quiet_s=30.0, timeout_s=2.0, progress=lambda _line: None)
