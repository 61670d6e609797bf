"""A producer whose local queue is full: it serves delivery reports and tries again for a
bounded time, then gives up (no wait at all when the bound is zero)."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Producer

from steplens.schema.kafka_produce import produce_bounded, retry_while_full


class _Counting:
    """A real producer whose polls are counted."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.polls = 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.producer.produce(*args, **kwargs)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return self.producer.poll(timeout)


def _full_producer() -> Producer:
    # nothing listens on port 1: the one message the queue holds is never delivered
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 1, "log_level": 0}
    )
    assert produce_bounded(producer, "t", b"first", b"k", max_wait_s=5)
    return producer


def test_a_queue_that_stays_full_gives_up_within_its_bound() -> None:
    producer = _Counting(_full_producer())
    reports: list[object] = []
    t0 = time.monotonic()
    queued = produce_bounded(
        producer, "t", b"second", b"k", on_delivery=lambda e, _m: reports.append(e), max_wait_s=0.3
    )
    took = time.monotonic() - t0
    assert not queued and 0.3 <= took < 1.5
    assert producer.polls >= 3  # it served reports while it waited (0.1 s each)
    assert len(producer.producer) == 1  # the first still queued, the second never taken
    producer.producer.purge()
    producer.producer.flush(0)


def test_a_zero_bound_tries_once_and_never_waits() -> None:
    producer = _Counting(_full_producer())
    t0 = time.monotonic()
    assert not produce_bounded(producer, "t", b"second", b"k", max_wait_s=0.0)
    assert time.monotonic() - t0 < 0.05 and producer.polls == 0
    producer.producer.purge()
    producer.producer.flush(0)


def test_served_reports_make_room_for_another_try() -> None:
    room: list[bool] = []
    served: list[float] = []

    def serve(seconds: float) -> None:
        served.append(seconds)
        room.append(len(served) >= 2)  # the second round of reports frees a slot

    assert retry_while_full(lambda: bool(room and room[-1]), serve, 5.0, poll_s=0.01)
    assert served == [0.01, 0.01]


def test_the_caller_may_give_up_after_reports_were_served() -> None:
    served: list[float] = []
    gave_up = retry_while_full(lambda: False, served.append, 5.0, give_up=lambda: True)
    assert not gave_up and served == [0.1]
