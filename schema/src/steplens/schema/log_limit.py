"""Logs that say a thing once: repeated messages rate-limited per reason, with counts.

The first message of a reason is logged. Later ones within ``interval_s`` are counted, not
logged; the first one after the interval is logged with how many were left out since the last
line of that reason ("... (1535 more in 60 s)"). So a reason logs at most one line per
interval however fast it repeats, and no occurrence goes uncounted. A count left when a reason
stops repeating is said by ``flush()`` (at shutdown) or with that reason's next message.

``RateLimit`` holds the counts; ``LimitedLog`` calls a logger through it (a reason given by the
caller); ``LimitFilter`` applies it to every record a ``logging.Logger`` handles, the reason
read from the record. ``kafka_logger(role)`` is a logger for confluent-kafka's ``logger``
setting: librdkafka's own lines (a broker refusing connections says so every second or more
often) go through Python logging, limited per facility and message.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Final

DEFAULT_INTERVAL_S: Final = 60.0
_NUMBER = re.compile(r"\d+")


class RateLimit:
    """Per-reason counts: ``admit`` says whether to log now, and how many were left out."""

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # reason -> when its last line was logged
        self._left_out: dict[str, int] = {}  # reason -> occurrences not logged since then

    def admit(self, reason: str) -> int | None:
        """None: count this occurrence, log nothing. A number: log it, saying that this many
        occurrences of ``reason`` were left out since its last line."""
        now = self._clock()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self.interval_s:
                self._left_out[reason] = self._left_out.get(reason, 0) + 1
                return None
            self._last[reason] = now
            return self._left_out.pop(reason, 0)

    def drain(self) -> dict[str, int]:
        """The counts not said yet, by reason (and forget them)."""
        with self._lock:
            left, self._left_out = self._left_out, {}
            return left

    def left_out(self, reason: str) -> int:
        with self._lock:
            return self._left_out.get(reason, 0)


def _more(n: int, interval_s: float) -> str:
    return f" ({n} more in {interval_s:g} s)" if n else ""


class LimitedLog:
    """A logger's ``warning``/``error``, limited per reason."""

    def __init__(self, logger: logging.Logger, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.logger = logger
        self.limit = RateLimit(interval_s)

    def log(self, level: int, reason: str, msg: str, *args: Any, exc_info: bool = False) -> bool:
        """Log ``msg % args`` unless ``reason`` was logged within the interval; True if logged."""
        left_out = self.limit.admit(reason)
        if left_out is None:
            return False
        more = _more(left_out, self.limit.interval_s).replace("%", "%%")
        self.logger.log(level, msg + more, *args, exc_info=exc_info)
        return True

    def warning(self, reason: str, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, reason, msg, *args)

    def error(self, reason: str, msg: str, *args: Any) -> bool:
        return self.log(logging.ERROR, reason, msg, *args)

    def exception(self, reason: str, msg: str, *args: Any) -> bool:
        """``error`` with the exception being handled."""
        return self.log(logging.ERROR, reason, msg, *args, exc_info=True)

    def flush(self) -> None:
        """Say the counts still left out, one line per reason."""
        for reason, n in self.limit.drain().items():
            self.logger.warning("steplens: %d more %r warnings were not logged", n, reason)


def record_reason(record: logging.LogRecord) -> str:
    """A record's reason: its message with numbers blanked (times, offsets, counts vary)."""
    return f"{record.name}:{_NUMBER.sub('#', record.getMessage())}"


class LimitFilter(logging.Filter):
    """Lets a record through when its reason may be logged now; the first one after a quiet
    interval says how many were left out."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        reason: Callable[[logging.LogRecord], str] = record_reason,
    ) -> None:
        super().__init__()
        self.limit = RateLimit(interval_s)
        self._reason = reason

    def filter(self, record: logging.LogRecord) -> bool:
        left_out = self.limit.admit(self._reason(record))
        if left_out is None:
            return False
        if left_out:
            record.msg = f"{record.getMessage()}{_more(left_out, self.limit.interval_s)}"
            record.args = ()
        return True


_kafka_lock = threading.Lock()


def kafka_logger(role: str, interval_s: float = DEFAULT_INTERVAL_S) -> logging.Logger:
    """The logger to pass as confluent-kafka's ``logger`` setting for a client of ``role``
    (``steplens.kafka.<role>``), its records limited per message (numbers aside)."""
    logger = logging.getLogger(f"steplens.kafka.{role}")
    with _kafka_lock:
        if not any(isinstance(f, LimitFilter) for f in logger.filters):
            logger.addFilter(LimitFilter(interval_s))
    return logger
