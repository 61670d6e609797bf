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
* The commit of explicit offsets. The route agent commits a batch's raw offsets once its
  by-run writes are acknowledged. Faust's public ``Consumer.commit`` commits what the stream
  acknowledged, but flushes the whole producer (every pending signal and table write) first,
  and only one commit runs at a time: at full resolution the route agent waited on that at
  every batch and the log_step -> alert p99 went from 0.9 s to 3.2 s. ``commit`` calls the
  consumer's ``_commit`` with the offsets and records them as Faust's commit does.
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
                "stay Faust's 1.5 s (steplens_worker_fetch_wait_seconds shows the wait in use) "
                "and the route agent's commits may fail (Faust's periodic commit then commits)",
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


async def commit(consumer: Any, offsets: dict[Any, int]) -> bool:
    """Commit explicit ``offsets`` (topic partition -> next offset) of Faust's consumer now,
    without flushing its producer first: Faust's public ``commit`` flushes every pending send
    (signals, table writes) before each commit, and the route agent, which commits each
    batch once its by-run writes are acknowledged, waited on that and fell behind."""
    mine = consumer.assignment()
    offsets = {tp: off for tp, off in offsets.items() if tp in mine}
    if not offsets:
        return False
    done = await consumer._commit(offsets)
    if done:
        seen = consumer._committed_offset
        for tp, off in offsets.items():
            seen[tp] = max(seen.get(tp) or 0, off)
    return bool(done)


def quiet_root_logger(level: str) -> None:
    """Set the root logger back to ``level`` after Faust's worker set it to DEBUG."""
    with contextlib.suppress(ValueError):
        logging.getLogger().setLevel(level.upper())
