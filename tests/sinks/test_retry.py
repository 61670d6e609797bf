"""The one retry policy: again until done, backoff with jitter up to its cap, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from steplens.sinks.retry import RetryPolicy, until_done

FAST = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.01, jitter_s=0.001)


class Attempts:
    """Fails ``failures`` times (returns False), then succeeds (True); keeps call times."""

    def __init__(self, failures: int) -> None:
        self.failures, self.times = failures, []

    def __call__(self) -> bool:
        self.times.append(time.monotonic())
        return len(self.times) > self.failures


def test_attempts_again_until_done_and_reports_each_retry() -> None:
    attempt = Attempts(3)
    seen: list[tuple[int, bool]] = []
    done = until_done(
        attempt,
        bool,
        policy=FAST,
        stop=threading.Event(),
        on_retry=lambda n, r: seen.append((n, r)),
    )
    assert done is True and len(attempt.times) == 4
    assert seen == [(1, False), (2, False), (3, False)]


def test_shutdown_interrupts_a_backoff_and_no_attempt_follows() -> None:
    stop = threading.Event()
    attempt = Attempts(10**6)
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    policy = RetryPolicy(initial_backoff_s=3600, max_backoff_s=3600)
    assert until_done(attempt, bool, policy=policy, stop=stop) is False  # the last result
    assert time.monotonic() - t0 < 600 and len(attempt.times) == 1  # not the hour's backoff


def test_the_first_attempt_is_made_even_after_shutdown() -> None:
    stop = threading.Event()
    stop.set()
    attempt = Attempts(10**6)
    assert until_done(attempt, bool, policy=FAST, stop=stop) is False
    assert len(attempt.times) == 1


class NotedBackoffs(threading.Event):
    """A shutdown event never set: notes each backoff slept on it and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.backoffs: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.backoffs.append(timeout)
        return False


def test_backoff_grows_exponentially_up_to_the_cap_with_jitter() -> None:
    """The backoffs asked for, not the wall clock: the schedule holds on a busy machine."""
    stop = NotedBackoffs()
    policy = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.1, jitter_s=0.01)
    assert until_done(Attempts(6), bool, policy=policy, stop=stop) is True
    b = stop.backoffs
    assert len(b) == 6, b
    for n, got in enumerate(b[:3]):  # doubling, plus at most jitter_s
        assert got is not None and 0.02 * 2**n <= got <= 0.02 * 2**n + 0.01, b
    assert all(got == pytest.approx(0.1) for got in b[3:]), b  # at the cap


def test_invalid_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff_s=2, max_backoff_s=1)
