"""What every steplens producer does when its local queue is full (librdkafka raises
``BufferError``): serve delivery reports, which make room, and try again, for a bounded time;
then give up and let the caller count the message (spool it, dead-letter it, fail the batch).
No wait at all is a bound too: a training process's producer never waits.

Duck-typed (a confluent_kafka ``Producer`` or a steplens transport): this module does not
import confluent_kafka.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol


class _Producer(Protocol):
    def produce(self, topic: str, value: bytes, *args: Any, **kwargs: Any) -> None: ...
    def poll(self, timeout: float) -> int: ...


def retry_while_full(
    attempt: Callable[[], bool],
    serve: Callable[[float], object],
    max_wait_s: float,
    *,
    poll_s: float = 0.1,
    give_up: Callable[[], bool] | None = None,
) -> bool:
    """``attempt()`` (True: queued, False: the queue is full) until it succeeds, serving
    delivery reports (``serve(seconds)``) between tries, for at most ``max_wait_s`` (0: one
    try, nothing served); False when the queue stayed full or ``give_up()`` said so after
    reports were served."""
    deadline = time.monotonic() + max_wait_s
    while not attempt():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        serve(min(poll_s, left))
        if give_up is not None and give_up():
            return False
    return True


def produce_bounded(
    producer: _Producer,
    topic: str,
    value: bytes,
    key: bytes | None = None,
    *,
    on_delivery: Callable[[Any, Any], None] | None = None,
    max_wait_s: float,
    poll_s: float = 0.1,
    partition: int | None = None,
) -> bool:
    """Produce one message to ``topic`` (to ``partition``, else its key's), waiting at most
    ``max_wait_s`` while the local queue is full (``retry_while_full``); False when it stayed
    full (the message is not queued)."""
    extra: dict[str, Any] = {} if on_delivery is None else {"on_delivery": on_delivery}
    if partition is not None:
        extra["partition"] = partition

    def attempt() -> bool:
        try:
            producer.produce(topic, value, key=key, **extra)
        except BufferError:
            return False
        return True

    return retry_while_full(attempt, producer.poll, max_wait_s, poll_s=poll_s)
