"""Topics made by a test session or a bench run, deleted when it ends.

Tests and benches create uniquely named topics (and Faust adds changelog, repartition and
assignor topics per app). Left behind, they pile up in the local broker's data directory
over many runs until its controller slows down.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


def topic_names(bootstrap: str, timeout_s: float = 10.0) -> set[str]:
    from confluent_kafka.admin import AdminClient

    from steplens.schema.kafka_config import admin_config

    admin = AdminClient(admin_config(bootstrap, extra={"log_level": 0}))
    return {t for t in admin.list_topics(timeout=timeout_s).topics if not t.startswith("__")}


def delete_topics(bootstrap: str, names: set[str], timeout_s: float = 30.0) -> list[str]:
    """Delete ``names``; returns those deleted (a topic already gone is not an error)."""
    from confluent_kafka.admin import AdminClient

    from steplens.schema.kafka_config import admin_config

    if not names:
        return []
    admin = AdminClient(admin_config(bootstrap, extra={"log_level": 0}))
    deleted = []
    futures = admin.delete_topics(sorted(names), operation_timeout=timeout_s)
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
            deleted.append(name)
        except Exception as exc:  # cleanup reports and goes on
            if "UNKNOWN_TOPIC" not in str(exc):
                print(f"steplens: could not delete topic {name}: {exc}", file=sys.stderr)
    return deleted


@contextlib.contextmanager
def scratch_topics(bootstrap: str) -> Iterator[None]:
    """Delete, on exit, every topic created while the block ran.

    Meant for a broker used by tests or benches: a topic that another client creates on the
    same broker during the block is deleted too, except the default steplens topics. Set
    ``STEPLENS_KEEP_SCRATCH_TOPICS=1`` when several sessions share one broker at once.
    """
    from steplens.schema.topics import Topics

    if os.environ.get("STEPLENS_KEEP_SCRATCH_TOPICS") == "1":
        yield
        return

    keep = set(Topics().all())
    try:
        before = topic_names(bootstrap)
    except Exception as exc:  # no broker: nothing to clean later
        print(f"steplens: topic cleanup off, Kafka did not answer: {exc}", file=sys.stderr)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            delete_topics(bootstrap, topic_names(bootstrap) - before - keep)
