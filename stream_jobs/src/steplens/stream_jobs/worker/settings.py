"""The worker's settings, its topics and the by-run messages between its two agents."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steplens.schema.topics import Topics
from steplens.stream_jobs.engine.history import HistorySettings
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.worker.run_limits import LimitSettings

FETCH_WAIT_MS = 100  # longest a fetch waits at the broker for new records (compat.set_fetch_wait)


@dataclass
class WorkerSettings:
    bootstrap: str
    topics: Topics
    app_id: str = "steplens-worker"
    state_dir: str = "tmp/state"
    faust_web_port: int = 0  # 0: Faust's web server off
    batch: int = 1000
    within_s: float = 0.2
    fetch_wait_ms: int = FETCH_WAIT_MS
    by_run_partitions: int = 8
    signal_every: int = 50  # publish a non-breaching signal per rank and rule every N steps
    signal_interval_s: float = 15.0  # ... and at most once in this many seconds (a scrape)
    # a run's state goes to the table at most this often; its messages are acknowledged then
    checkpoint_s: float = 5.0
    fit_workers: int = 1
    max_pending_fits: int = 4096  # queued or running; past it a fit is skipped (asked again)
    fit_batch: int = 64  # fits per pool job at most
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    webhook_url: str | None = None
    alertmanager_url: str | None = None  # incidents posted to its /api/v2/alerts
    history: HistorySettings = field(default_factory=HistorySettings)  # warm starts
    limits: LimitSettings = field(default_factory=LimitSettings)  # runs and ranks kept
    session_timeout_s: float = 10.0  # a SIGKILLed worker's partitions move after this
    log_level: str = "warning"


def ensure_worker_topics(s: WorkerSettings, timeout_s: float = 30.0) -> None:
    """Create the steplens topics and the internal by-run topic if they do not exist."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from steplens.schema.settings import kafka_security_config
    from steplens.schema.topics import ensure_topics

    ensure_topics(s.bootstrap, s.topics, timeout_s)
    admin = AdminClient({"bootstrap.servers": s.bootstrap, **kafka_security_config()})
    name = f"{s.app_id}-by-run"
    if name in admin.list_topics(timeout=timeout_s).topics:
        return
    new = NewTopic(
        name,
        num_partitions=s.by_run_partitions,
        replication_factor=1,
        config={
            "retention.ms": str(24 * 3600 * 1000),
            "max.message.bytes": str(BY_RUN_MAX_BYTES),
        },
    )
    for fut in admin.create_topics([new], operation_timeout=timeout_s).values():
        try:
            fut.result(timeout=timeout_s)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


# A by-run message carries raw messages of one run as JSON strings; a batch of a backlog can
# hold megabytes of one run (step batches), more than Kafka takes in one message (1 MiB by
# default), so a run's share of a batch is cut into messages of about this many text bytes.
BY_RUN_MESSAGE_BYTES = 256 << 10
# one raw message alone (up to schema.MAX_RECORD_BYTES) must fit, escaped as a JSON string
BY_RUN_MAX_BYTES = 4 << 20


# a record batch stays under the 1 MiB Kafka takes by default per message (signals, changelog)
PRODUCER_BATCH_BYTES = 512 << 10
# table writes (checkpoint values, tens of KB each) that may wait to be sent before Faust holds
# back consumption
PRODUCER_BUFFER_MESSAGES = 1024
# routed batches whose commit (after their by-run writes are acknowledged) may be pending
# while the route agent takes the next ones
ROUTED_IN_FLIGHT = 8


def by_run_chunks(items: list[list[Any]], budget: int = BY_RUN_MESSAGE_BYTES) -> list[list[Any]]:
    """``items`` ([partition, offset, text]) in order, cut where the texts pass ``budget``
    bytes (an item larger than that goes alone)."""
    out: list[list[Any]] = []
    chunk: list[Any] = []
    size = 0
    for item in items:
        n = len(item[2]) + 32
        if chunk and size + n > budget:
            out.append(chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        out.append(chunk)
    return out


def run_of_key(key: bytes | None) -> str | None:
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    run, sep, rank = text.rpartition(":")
    return run if sep and run and rank.lstrip("-").isdigit() else None
