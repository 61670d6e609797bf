"""Where the worker departs from Faust as its documentation uses it, in one place: each entry
states its measured reason in a sentence. The entries that reach into private attributes name
the library versions they were written against; ``check`` logs at start whether the installed
ones are those (a warning when not: the entry may then do nothing, and says so).

* ``set_fetch_wait``: Faust builds its aiokafka consumer with a 1,500 ms fetch wait and no
  setting for it, and at full resolution a fetch for some of its partitions alone held back
  the others until it timed out, leaving the worker seconds behind with its loop idle.
* ``quiet_root_logger``: Faust's worker leaves the root logger at DEBUG, and building the
  debug records of faust and aiokafka took a tenth of the loop's time under load.
* ``runs_table``: a run's state is stored as ``state``'s versioned bytes, a head and one value
  per rank, because one value per run grew with its ranks past what Kafka takes in a message
  and Faust's serializers would pickle it.
* ``unacked``: a by-run message is acknowledged once a checkpoint of its run holds it, not when
  the agent moves past it, so a worker killed between checkpoints loses nothing. Faust's
  ``processing_guarantee="exactly_once"`` does not replace it: a write to a topic
  the app reads itself (the by-run hop) joins a transaction that never commits, and 0 of
  3,968 records crossed such a hop (bench/RESULTS.md, "Faust's exactly-once, tried").
* ``send``: signals go to the producer directly, as a Faust topic's send (its message futures,
  callbacks and sensors) cost more than encoding the signal at hundreds of signals a second.
* ``raise_producer_buffer``: past 100 messages in its producer buffer Faust holds back every
  fetched message, and a wide run's checkpoint writes a value per rank at once.
* ``recovery_watch.RecoveryWatch``: a table recovery that read nothing from the changelog for
  3 s is started over through Faust's own ``signal_recovery_start`` (what a rebalance during
  a recovery does): in busy runs of the group test about one takeover in eight never read a
  changelog record, and a killed worker's runs never moved.
* ``NUDGE``: Faust accepts table writes only inside an agent's event (a timer's write raises,
  and ``use_partitioner`` would put a run's rank keys on partitions other than its own), so a
  quiet run's checkpoint, an ended history load and an idle run's retirement are triggered by
  an empty by-run message sent to the run (``nudge``).
"""

from __future__ import annotations

import contextlib
import logging
from importlib import metadata
from typing import Any, Final

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


def runs_table(app: Any, name: str, partitions: int) -> Any:
    """The table of run states: bytes keys (a run id, or ``state.rank_key``) to bytes values."""
    return app.Table(name, default=None, partitions=partitions, key_type=bytes, value_type=bytes)


def unacked(stream: Any) -> Any:
    """``stream`` whose events the agent acknowledges itself (``stream.ack``)."""
    return stream.noack()


def send(app: Any, topic: str, key: bytes | None, value: bytes) -> Any:
    """Send ``value`` to ``topic`` through the app's producer; returns the delivery future."""
    return app.producer.send(topic, key, value, None, None, None)


def raise_producer_buffer(app: Any, max_messages: int) -> None:
    """Let the app's producer buffer hold ``max_messages`` before Faust holds fetches back."""
    app.producer.buffer.max_messages = max_messages


NUDGE: Final = b"[]"  # an empty by-run message: checkpoint, install a load, or retire


async def nudge(by_run: Any, run: str, partition: int | None = None) -> None:
    """Send ``run`` an empty by-run message (``by_run``: the by-run topic), to ``partition``
    (else its key's)."""
    await by_run.send(key=run.encode(), value=NUDGE, partition=partition)
