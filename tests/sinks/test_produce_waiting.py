"""A sink's produce when the producer's local queue is full: it waits for room, bounded."""

from __future__ import annotations

from confluent_kafka import Producer

from steplens.sinks.kafka_io import produce_waiting


def test_a_queue_that_stays_full_gives_up_instead_of_waiting_forever():
    # nothing listens on port 1: the one message the queue holds is never delivered
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 1, "log_level": 0}
    )
    reports: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        reports.append(err)

    assert produce_waiting(producer, "t", b"first", b"k", on_delivery=on_delivery, timeout_s=5)
    assert not produce_waiting(
        producer, "t", b"second", b"k", on_delivery=on_delivery, timeout_s=0.3
    )
    assert len(producer) == 1  # the first still queued, the second never taken
    producer.purge()
    producer.flush(0)
