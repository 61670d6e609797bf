"""Topic names and partition counts, and a helper that creates them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from steplens.schema.kafka_config import admin_config
from steplens.schema.settings import NonEmptyStr, PositiveInt, about, resolve


@dataclass(frozen=True)
class Topics:
    ENV_PREFIX: ClassVar[str] = "STEPLENS_TOPIC_"

    raw: Annotated[NonEmptyStr, about("every producer record, key run_id:rank")] = "steplens.raw"
    signals: Annotated[NonEmptyStr, about("the worker's signals")] = "steplens.signals"
    alerts: Annotated[NonEmptyStr, about("the worker's incidents")] = "steplens.alerts"
    dead_letters: Annotated[
        NonEmptyStr, about("records no part could use", env="STEPLENS_TOPIC_DEADLETTER")
    ] = "steplens.deadletter"
    advice: Annotated[
        NonEmptyStr, about("the worker's advice to the ranks of a run, key run_id")
    ] = "steplens.advice"
    raw_partitions: Annotated[
        PositiveInt, about("partitions of a raw topic it creates", env="STEPLENS_RAW_PARTITIONS")
    ] = 8
    other_partitions: Annotated[
        PositiveInt,
        about("partitions of the other topics it creates", env="STEPLENS_OTHER_PARTITIONS"),
    ] = 3

    @classmethod
    def from_env(cls) -> Topics:
        """STEPLENS_TOPIC_RAW, _SIGNALS, _ALERTS, _DEADLETTER, _ADVICE, STEPLENS_RAW_PARTITIONS."""
        return resolve(cls)

    @classmethod
    def prefixed(cls, prefix: str, **partitions: int) -> Topics:
        """A set of its own: ``PREFIX.raw``, ``.signals``, ``.alerts``, ``.deadletter``,
        ``.advice`` (``partitions``: ``raw_partitions``, ``other_partitions``)."""
        return cls(
            raw=f"{prefix}.raw",
            signals=f"{prefix}.signals",
            alerts=f"{prefix}.alerts",
            dead_letters=f"{prefix}.deadletter",
            advice=f"{prefix}.advice",
            **partitions,
        )

    def env(self) -> dict[str, str]:
        """The variables that name these topics to every part (``from_env`` reads them)."""
        return {
            "STEPLENS_TOPIC_RAW": self.raw,
            "STEPLENS_TOPIC_SIGNALS": self.signals,
            "STEPLENS_TOPIC_ALERTS": self.alerts,
            "STEPLENS_TOPIC_DEADLETTER": self.dead_letters,
            "STEPLENS_TOPIC_ADVICE": self.advice,
        }

    def all(self) -> dict[str, int]:
        return {
            self.raw: self.raw_partitions,
            self.signals: self.other_partitions,
            self.alerts: self.other_partitions,
            self.dead_letters: self.other_partitions,
            self.advice: self.other_partitions,
        }


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create: its name, partitions and topic-level settings."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def create_missing(
    bootstrap: str | None, specs: Iterable[TopicSpec], timeout_s: float = 30.0
) -> list[str]:
    """Create each topic of ``specs`` that does not exist yet (one another process creates
    meanwhile counts as there); returns the names created. The one place a topic is made."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(admin_config(bootstrap))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [
        NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config)
        for t in specs
        if t.name not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, fut in admin.create_topics(wanted, operation_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
            created.append(name)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return created


def ensure_topics(
    bootstrap: str | None = None, topics: Topics | None = None, timeout_s: float = 30.0
) -> list[str]:
    """Create the steplens topics that do not exist yet; returns the names created."""
    topics = topics or Topics.from_env()
    specs = [TopicSpec(name, n) for name, n in topics.all().items()]
    return create_missing(bootstrap, specs, timeout_s)
