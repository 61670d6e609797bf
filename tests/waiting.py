"""Waiting on a condition instead of sleeping for a guessed time: a test goes on as soon as
what it waits for holds, and a slow machine only makes it slower, never wrong."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object], timeout_s: float = 20.0, every_s: float = 0.01
) -> bool:
    """Call ``predicate`` every ``every_s`` until it is true or ``timeout_s`` have passed;
    returns its last answer (``assert wait_until(...)`` fails a test that timed out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())
