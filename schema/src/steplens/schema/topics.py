"""Topic names and partition counts, and a helper that creates them."""

from __future__ import annotations

from dataclasses import dataclass

from steplens.schema.settings import env_value, kafka_bootstrap, kafka_security_config


@dataclass(frozen=True)
class Topics:
    raw: str = "steplens.raw"  # every producer record, key run_id:rank
    signals: str = "steplens.signals"
    alerts: str = "steplens.alerts"
    dead_letters: str = "steplens.deadletter"
    raw_partitions: int = 8
    other_partitions: int = 3

    @classmethod
    def from_env(cls) -> Topics:
        """STEPLENS_TOPIC_RAW, _SIGNALS, _ALERTS, _DEADLETTER, STEPLENS_RAW_PARTITIONS."""
        d = cls()
        return cls(
            raw=env_value("STEPLENS_TOPIC_RAW", str, d.raw),
            signals=env_value("STEPLENS_TOPIC_SIGNALS", str, d.signals),
            alerts=env_value("STEPLENS_TOPIC_ALERTS", str, d.alerts),
            dead_letters=env_value("STEPLENS_TOPIC_DEADLETTER", str, d.dead_letters),
            raw_partitions=env_value("STEPLENS_RAW_PARTITIONS", int, d.raw_partitions),
            other_partitions=env_value("STEPLENS_OTHER_PARTITIONS", int, d.other_partitions),
        )

    def all(self) -> dict[str, int]:
        return {
            self.raw: self.raw_partitions,
            self.signals: self.other_partitions,
            self.alerts: self.other_partitions,
            self.dead_letters: self.other_partitions,
        }


def ensure_topics(
    bootstrap: str | None = None, topics: Topics | None = None, timeout_s: float = 30.0
) -> list[str]:
    """Create the steplens topics that do not exist yet; returns the names created."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topics = topics or Topics.from_env()
    conf: dict[str, str | int | float | bool] = {
        "bootstrap.servers": kafka_bootstrap(bootstrap),
        **kafka_security_config(),
    }
    admin = AdminClient(conf)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [
        NewTopic(name, num_partitions=n, replication_factor=1)
        for name, n in topics.all().items()
        if name not in existing
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
