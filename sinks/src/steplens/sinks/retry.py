"""The one retry policy of the outputs (tenacity): exponential backoff with jitter, sleeping on
the shutdown event, until the work is done or shutdown is requested.

Only the consumer loop (``loop.py``) retries: an output makes one attempt per ``export`` and
says in its result whether the batch is worth another one; the loop exports it again after a
backoff, however long the outage lasts, so nothing is committed past an undelivered record.
``stop.set()`` interrupts a backoff at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 5.0
    jitter_s: float = 0.1

    def __post_init__(self) -> None:
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(f"invalid retry policy {self}")


def until_done(
    attempt: Callable[[], T],
    done: Callable[[T], bool],
    *,
    policy: RetryPolicy,
    stop: threading.Event,
    on_retry: Callable[[int, T], None] | None = None,
) -> T:
    """Call ``attempt`` until ``done`` says its result is final, or ``stop`` is set; returns
    the last result. The first attempt is always made; none is made once ``stop`` is set
    after it. ``on_retry(attempts so far, result)`` runs before each backoff."""

    last: list[T] = []

    def once() -> T:
        if last and stop.is_set():
            return last[0]  # shutdown came during the backoff: no new attempt
        last[:] = [attempt()]
        return last[0]

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            on_retry(state.attempt_number, state.outcome.result())

    def pause(seconds: float) -> None:  # a backoff that a shutdown cuts short
        stop.wait(seconds)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_when_event_set(stop),
        wait=tenacity.wait_exponential_jitter(
            multiplier=policy.initial_backoff_s, max=policy.max_backoff_s, jitter=policy.jitter_s
        ),
        retry=tenacity.retry_if_result(lambda result: not done(result)),
        sleep=pause,
        before_sleep=before_sleep,
        retry_error_callback=lambda state: last[0],
    )
    return retrying(once)
