"""The sinks' settings, declared once (``steplens.schema.settings``): where they write
(InfluxDB, S3), how the S3 roller cuts objects, and the sink process itself.

``steplens sink``'s options, the ``STEPLENS_*`` variables and the settings tables of
docs/architecture.md come from these declarations: a flag (or keyword) given wins over the
variable, which wins over the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from steplens.schema.settings import (
    DEFAULT_KAFKA_BOOTSTRAP,
    NonEmptyStr,
    NonNegativeInt,
    Port,
    PositiveFloat,
    PositiveInt,
    about,
    resolve,
)


@dataclass(frozen=True)
class InfluxSettings:
    ENV_PREFIX: ClassVar[str] = "STEPLENS_INFLUX_"

    url: Annotated[NonEmptyStr, about("InfluxDB URL")] = "http://127.0.0.1:18086"
    ca_cert: Annotated[
        str | None,
        about(
            "InfluxDB: CA certificate file (PEM) an https URL's certificate is verified "
            "against (none: the system's CAs)",
        ),
    ] = None
    org: Annotated[NonEmptyStr, about("InfluxDB organisation")] = "steplens"
    # a secret: from the environment only, never a flag (a process's arguments are public)
    token: Annotated[str, about("InfluxDB API token", flag="")] = ""
    bucket: Annotated[NonEmptyStr, about("InfluxDB hot bucket")] = "steplens"
    rollup_bucket: Annotated[NonEmptyStr, about("bucket of the 1-minute rollups")] = (
        "steplens_rollup"
    )
    hot_retention_s: Annotated[PositiveInt, about("InfluxDB: the hot bucket's retention")] = 3600
    rollups: Annotated[
        bool,
        about(
            "make the 1-minute rollups, one run 5 s after each minute (--no-rollups: another "
            "influx sink makes them; runs of several sinks are idempotent but repeat the work)",
            flag="--no-rollups",
        ),
    ] = True
    timeout_ms: Annotated[PositiveInt, about("InfluxDB: timeout of one request")] = 10_000
    rollup_timeout_ms: Annotated[
        PositiveInt,
        about(
            "InfluxDB: timeout of one rollup run's query (a run of many series' minutes; it "
            "stays under the minute between runs)"
        ),
    ] = 50_000
    max_ranks_per_run: Annotated[
        PositiveInt,
        about(
            "InfluxDB: ranks of a run whose telemetry is written, first come, and a quarter as "
            "many more once an incident names them; the others' go to S3 only (counted)"
        ),
    ] = 256
    max_names_per_run: Annotated[
        PositiveInt,
        about("InfluxDB: distinct metric names a run may use per measurement"),
    ] = 1000
    max_names_per_measurement: Annotated[
        PositiveInt,
        about("InfluxDB: distinct metric names per measurement in the hot bucket"),
    ] = 5000

    @classmethod
    def from_env(cls) -> InfluxSettings:
        return resolve(cls)


@dataclass(frozen=True)
class S3Settings:
    """Endpoint and credentials fall back to boto3's own chain (env, profile, instance)."""

    ENV_PREFIX: ClassVar[str] = "STEPLENS_S3_"

    bucket: Annotated[NonEmptyStr, about("S3 bucket")] = "steplens"
    prefix: Annotated[str, about("S3 key prefix")] = "cold"
    endpoint_url: Annotated[
        str | None,
        about("S3 endpoint (none: AWS)", env="STEPLENS_S3_ENDPOINT"),
    ] = None
    ca_bundle: Annotated[
        str | None,
        about(
            "S3: CA certificate file (PEM) an https endpoint's certificate is verified against "
            "(none: boto3's own, or `AWS_CA_BUNDLE`)",
        ),
    ] = None
    profile: Annotated[str | None, about("AWS profile of the credentials")] = None
    region: Annotated[str | None, about("S3 region", env="AWS_DEFAULT_REGION")] = None
    access_key_id: str | None = None
    secret_access_key: str | None = None

    @classmethod
    def from_env(cls) -> S3Settings:
        return resolve(cls)


@dataclass(frozen=True)
class RollSettings:
    """When the S3 roller closes an object, and how it drops records sent twice."""

    ENV_PREFIX: ClassVar[str] = "STEPLENS_S3_"

    max_bytes: Annotated[PositiveInt, about("S3: roll an object at this size")] = 64 << 20
    max_age_s: Annotated[PositiveFloat, about("S3: roll an object at this age")] = 60.0
    buffer_bytes: Annotated[
        PositiveInt,
        about(
            "S3: messages held for every partition together at most (about three times that "
            "in memory); past it the largest object rolls early"
        ),
    ] = 128 << 20
    dedupe_window: Annotated[
        NonNegativeInt,
        about(
            "S3: a record sent twice is stored once when its copies are at most this many "
            "records apart in a partition (memory: about 60 bytes a record; 0: off)"
        ),
    ] = 50_000


@dataclass(frozen=True)
class WebhookSettings:
    """Where ``steplens sink webhook`` posts each alert transition."""

    ENV_PREFIX: ClassVar[str] = "STEPLENS_WEBHOOK_"

    url: Annotated[str | None, about("webhook: the URL each alert transition is POSTed to")] = None


@dataclass(frozen=True)
class AlertmanagerSettings:
    """The Alertmanager ``steplens sink alertmanager`` posts incidents to."""

    ENV_PREFIX: ClassVar[str] = "STEPLENS_ALERTMANAGER_"

    url: Annotated[
        str | None,
        about(
            "Alertmanager's base URL, e.g. http://127.0.0.1:19094 (`steplens stack env` sets "
            "it while the stack's Alertmanager runs)"
        ),
    ] = None


DEFAULT_METRICS_PORTS = {"influx": 9465, "s3": 9466, "webhook": 9468, "alertmanager": 9469}


@dataclass(frozen=True)
class SinkSettings:
    """``steplens sink influx|s3|webhook|alertmanager``: what it reads and how it batches."""

    ENV_PREFIX: ClassVar[str] = "STEPLENS_SINK_"

    bootstrap: Annotated[
        NonEmptyStr, about("Kafka bootstrap servers", env="STEPLENS_KAFKA_BOOTSTRAP")
    ] = DEFAULT_KAFKA_BOOTSTRAP
    group: Annotated[str | None, about("consumer group", default_doc="`steplens-sink-<which>`")] = (
        None
    )
    topics: Annotated[
        str | None,
        about(
            "comma-separated topics",
            default_doc="raw, signals, alerts, advice (from `STEPLENS_TOPIC_*`); the alerts "
            "topic for webhook and alertmanager",
        ),
    ] = None
    dead_letter_topic: Annotated[
        str | None,
        about("dead-letter topic", default_doc="from `STEPLENS_TOPIC_DEADLETTER`"),
    ] = None
    batch_size: Annotated[PositiveInt, about("records per batch at most")] = 5000
    metrics_port: Annotated[
        Port | None,
        about(
            "Prometheus port on 127.0.0.1 (0: off)",
            default_doc=", ".join(f"`{p}` ({w})" for w, p in DEFAULT_METRICS_PORTS.items()),
        ),
    ] = None
    setup: Annotated[bool, about("create the buckets (--no-setup: do not)", flag="--no-setup")] = (
        True
    )
    log_level: Annotated[NonEmptyStr, about("log level")] = "INFO"
    nice: Annotated[
        NonNegativeInt,
        about(
            "influx and s3: added to the process's CPU niceness at start, so that on a host "
            "shared with the stream jobs their alerts go first and the store catches up in "
            "the seconds between (0: as started)"
        ),
    ] = 10

    def port(self, which: str) -> int:
        return DEFAULT_METRICS_PORTS[which] if self.metrics_port is None else self.metrics_port
