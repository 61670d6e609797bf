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
    policy = RetryPolicy(initial_backoff_s=30, max_backoff_s=30)
    assert until_done(attempt, bool, policy=policy, stop=stop) is False  # the last result
    assert time.monotonic() - t0 < 5 and len(attempt.times) == 1


def test_the_first_attempt_is_made_even_after_shutdown() -> None:
    stop = threading.Event()
    stop.set()
    attempt = Attempts(10**6)
    assert until_done(attempt, bool, policy=FAST, stop=stop) is False
    assert len(attempt.times) == 1


def test_backoff_grows_exponentially_up_to_the_cap_with_jitter() -> None:
    attempt = Attempts(6)
    policy = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.1, jitter_s=0.01)
    until_done(attempt, bool, policy=policy, stop=threading.Event())
    gaps = [b - a for a, b in zip(attempt.times, attempt.times[1:], strict=False)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.08  # doubling
    assert all(0.1 <= g < 0.5 for g in gaps[3:])  # at the cap (plus jitter, a busy machine)


def test_invalid_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff_s=2, max_backoff_s=1)
