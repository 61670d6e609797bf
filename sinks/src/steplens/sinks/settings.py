"""Where the sinks write: InfluxDB and S3 settings from keywords, ``STEPLENS_*`` or defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass

from steplens.schema.settings import env_value

DEFAULT_DEDUPE_WINDOW = 50_000  # S3: recent records remembered per partition (about 3 MB)


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


@dataclass(frozen=True)
class InfluxSettings:
    url: str
    org: str
    token: str
    bucket: str
    rollup_bucket: str
    hot_retention_s: int = 3600
    timeout_ms: int = 10_000
    max_names_per_run: int = 1000  # distinct field names of a run in one measurement
    max_names_per_measurement: int = 5000  # distinct field names of a measurement
    max_future_skew_s: int = 300  # records later than now + this are refused

    @classmethod
    def from_env(cls) -> InfluxSettings:
        return cls(
            url=env_value("STEPLENS_INFLUX_URL", str, "http://127.0.0.1:18086"),
            org=env_value("STEPLENS_INFLUX_ORG", str, "steplens"),
            token=os.environ.get("STEPLENS_INFLUX_TOKEN", ""),
            bucket=env_value("STEPLENS_INFLUX_BUCKET", str, "steplens"),
            rollup_bucket=env_value("STEPLENS_INFLUX_ROLLUP_BUCKET", str, "steplens_rollup"),
            hot_retention_s=env_value("STEPLENS_INFLUX_HOT_RETENTION_S", int, 3600),
            max_names_per_run=env_value("STEPLENS_INFLUX_MAX_NAMES_PER_RUN", _positive, 1000),
            max_names_per_measurement=env_value(
                "STEPLENS_INFLUX_MAX_NAMES_PER_MEASUREMENT", _positive, 5000
            ),
            max_future_skew_s=env_value("STEPLENS_MAX_FUTURE_SKEW_S", _positive, 300),
        )


@dataclass(frozen=True)
class S3Settings:
    """Endpoint and credentials fall back to boto3's own chain (env, profile, instance)."""

    bucket: str
    prefix: str = "cold"
    endpoint_url: str | None = None
    profile: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None

    @classmethod
    def from_env(cls) -> S3Settings:
        return cls(
            bucket=env_value("STEPLENS_S3_BUCKET", str, "steplens"),
            prefix=env_value("STEPLENS_S3_PREFIX", str, "cold"),
            endpoint_url=os.environ.get("STEPLENS_S3_ENDPOINT") or None,
            profile=os.environ.get("STEPLENS_S3_PROFILE") or None,
            region=os.environ.get("AWS_DEFAULT_REGION") or None,
        )
