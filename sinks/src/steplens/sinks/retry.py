"""Retry, written once: bounded attempts, exponential backoff with jitter, a deadline.

Sleeps happen on the shutdown event, so ``stop.set()`` interrupts a backoff at once.
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
    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    jitter_s: float = 0.1
    deadline_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.deadline_s <= 0 or self.initial_backoff_s < 0:
            raise ValueError(f"invalid retry policy {self}")


class Stopped(Exception):
    """The shutdown event was set while an operation was being retried."""


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    retryable: Callable[[BaseException], bool],
    stop: threading.Event,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, a permanent error, the attempts or the deadline run out.

    Re-raises the last exception (or ``Stopped`` when ``stop`` ended the wait).
    """

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            exc = state.outcome.exception()
            if exc is not None:
                on_retry(exc)

    retrying = tenacity.Retrying(
        stop=(
            tenacity.stop_after_attempt(policy.max_attempts)
            | tenacity.stop_after_delay(policy.deadline_s)
            | tenacity.stop_when_event_set(stop)
        ),
        wait=tenacity.wait_exponential_jitter(
            multiplier=policy.initial_backoff_s, max=policy.max_backoff_s, jitter=policy.jitter_s
        ),
        retry=tenacity.retry_if_exception(retryable),
        sleep=lambda seconds: _wait(stop, seconds),
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(fn)


def _wait(stop: threading.Event, seconds: float) -> None:
    stop.wait(seconds)


def backoff_delays(policy: RetryPolicy) -> Callable[[int], float]:
    """Delay before attempt ``n`` (1-based) for loops that retry a whole batch themselves."""
    wait = tenacity.wait_exponential_jitter(
        multiplier=policy.initial_backoff_s, max=policy.max_backoff_s, jitter=policy.jitter_s
    )

    def delay(attempt: int) -> float:
        state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        state.attempt_number = max(1, attempt)
        return float(wait(state))

    return delay
