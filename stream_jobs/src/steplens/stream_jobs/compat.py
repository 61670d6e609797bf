"""What the worker needs of Faust and aiokafka that has no public way, in one place.

Each entry names the library versions it was written against; ``check`` logs at start whether
the installed ones are those (a warning when not: the entry may then do nothing, and says so).

* The consumer's fetch wait. Faust builds its aiokafka consumer with ``fetch_max_wait_ms=1500``
  and no setting for it; aiokafka takes it only as a constructor argument and its fetcher reads
  ``_fetch_max_wait_ms`` for each request. aiokafka keeps one fetch in flight per broker, for
  the partitions that hold no fetched records yet: a fetch for by-run partitions alone (the raw
  ones still held records when it went) then held back every raw partition, and with them the
  by-run records they route to, until it timed out. At full resolution the worker fell seconds
  behind with its loop idle.
* The root logger's level. Faust's worker leaves the root logger at DEBUG (its handler
  filters): every debug call of faust and aiokafka then builds a record, a tenth of the loop's
  time under load. The level is set back with the standard library's public call, after
  Faust's logging setup.
"""

from __future__ import annotations

import contextlib
import logging
from importlib import metadata
from typing import Any

log = logging.getLogger("steplens.stream_jobs")

# distribution -> the version the entries here were written against
WRITTEN_AGAINST = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}


def check() -> dict[str, str | None]:
    """Log the installed versions against ``WRITTEN_AGAINST``; returns the installed ones."""
    got: dict[str, str | None] = {}
    for dist, want in WRITTEN_AGAINST.items():
        try:
            have: str | None = metadata.version(dist)
        except metadata.PackageNotFoundError:
            have = None
        got[dist] = have
        if have != want:
            log.warning(
                "compat: written against %s %s, %s is installed: the consumer's fetch wait may "
                "stay Faust's 1.5 s (steplens_worker_fetch_wait_seconds shows the wait in use)",
                dist,
                want,
                have,
            )
        else:
            log.info("compat: %s %s as written against", dist, have)
    return got


def set_fetch_wait(consumer: Any, ms: int) -> int | None:
    """Set the fetch wait of Faust's aiokafka consumer; returns the wait in use, or None where
    the consumer is not there (not started, or another client library or version)."""
    fetcher = getattr(
        getattr(getattr(consumer, "_thread", None), "_consumer", None), "_fetcher", None
    )
    if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
        return None
    fetcher._fetch_max_wait_ms = ms
    return int(fetcher._fetch_max_wait_ms)


def quiet_root_logger(level: str) -> None:
    """Set the root logger back to ``level`` after Faust's worker set it to DEBUG."""
    with contextlib.suppress(ValueError):
        logging.getLogger().setLevel(level.upper())
