"""A timer for an output's work between batches (resends, summaries): never on the loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("steplens.sinks")


class Every:
    """Calls ``fn`` every ``interval_s`` on a daemon thread until ``stop``; an exception is
    logged and the next call comes on time."""

    def __init__(self, interval_s: float, fn: Callable[[], None], name: str) -> None:
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._fn = fn
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._fn()
            except Exception:
                log.exception("steplens %s failed", self._thread.name)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
