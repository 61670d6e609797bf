"""The retry policy: attempts, deadline, permanent errors, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from steplens.sinks.retry import RetryPolicy, backoff_delays, call_with_retry


class Flaky:
    def __init__(self, failures: int, exc: type[Exception] = ConnectionError) -> None:
        self.failures, self.calls, self.exc = failures, 0, exc

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc("boom")
        return "ok"


FAST = RetryPolicy(
    max_attempts=5, initial_backoff_s=0.001, max_backoff_s=0.01, jitter_s=0.001, deadline_s=5
)


def test_retries_transient_errors_until_success() -> None:
    f = Flaky(3)
    seen: list[BaseException] = []
    assert (
        call_with_retry(
            f, policy=FAST, retryable=lambda e: True, stop=threading.Event(), on_retry=seen.append
        )
        == "ok"
    )
    assert f.calls == 4 and len(seen) == 3


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    f = Flaky(100)
    with pytest.raises(ConnectionError):
        call_with_retry(f, policy=FAST, retryable=lambda e: True, stop=threading.Event())
    assert f.calls == FAST.max_attempts


def test_permanent_errors_are_not_retried() -> None:
    f = Flaky(100, ValueError)
    with pytest.raises(ValueError):
        call_with_retry(
            f,
            policy=FAST,
            retryable=lambda e: isinstance(e, ConnectionError),
            stop=threading.Event(),
        )
    assert f.calls == 1


def test_deadline_bounds_the_total_time() -> None:
    policy = RetryPolicy(
        max_attempts=1000, initial_backoff_s=0.05, max_backoff_s=0.05, jitter_s=0, deadline_s=0.3
    )
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        call_with_retry(
            Flaky(10**6), policy=policy, retryable=lambda e: True, stop=threading.Event()
        )
    assert time.monotonic() - t0 < 1.0


def test_shutdown_interrupts_a_backoff() -> None:
    stop = threading.Event()
    policy = RetryPolicy(max_attempts=10, initial_backoff_s=30, max_backoff_s=30, deadline_s=300)
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        call_with_retry(Flaky(10**6), policy=policy, retryable=lambda e: True, stop=stop)
    assert time.monotonic() - t0 < 5


def test_backoff_grows_exponentially_up_to_the_cap_with_jitter() -> None:
    delay = backoff_delays(RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, jitter_s=0.05))
    d = [delay(n) for n in range(1, 8)]
    assert 0.1 <= d[0] <= 0.15 and 0.2 <= d[1] <= 0.25 and 0.4 <= d[2] <= 0.45
    assert all(x <= 1.0 for x in d)


def test_invalid_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
