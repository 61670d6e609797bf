"""Where the stack keeps state and caches, which ports it uses, which versions it runs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from steplens.schema.settings import env_value

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
S3PROXY_VERSION = "2.6.0"
INFLUXDB_VERSION = "2.9.1"
ALERTMANAGER_VERSION = "0.35.0"
MLFLOW_VERSION = "3.17.2"  # the server; the same as the client (mlflow-skinny in constraints.txt)

SERVICES = ("kafka", "influxdb", "s3", "mlflow")  # what `up` starts unless told otherwise
OPTIONAL_SERVICES = ("alertmanager",)  # only when asked for (`up --with alertmanager`)
ALL_SERVICES = SERVICES + OPTIONAL_SERVICES

# port name -> (default, environment variable)
DEFAULT_PORTS: dict[str, tuple[int, str]] = {
    "kafka": (19092, "STEPLENS_KAFKA_PORT"),
    "kafka_controller": (19093, "STEPLENS_KAFKA_CONTROLLER_PORT"),
    "influxdb": (18086, "STEPLENS_INFLUX_PORT"),
    "s3": (19000, "STEPLENS_S3_PORT"),
    "alertmanager": (19094, "STEPLENS_ALERTMANAGER_PORT"),
    "mlflow": (19050, "STEPLENS_MLFLOW_PORT"),
}

INFLUX_ORG = "steplens"
INFLUX_BUCKET = "steplens"
INFLUX_ROLLUP_BUCKET = "steplens_rollup"
INFLUX_USER = "steplens"
S3_BUCKET = "steplens"
HOT_RETENTION_S = 3600
ROLLUP_RETENTION_S = 30 * 24 * 3600


def default_home() -> Path:
    raw = os.environ.get("STEPLENS_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".local" / "state" / "steplens"


def default_cache() -> Path:
    raw = os.environ.get("STEPLENS_CACHE")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "steplens"


def _port(raw: str) -> int:
    port = int(raw)
    if not 1 <= port <= 65535:
        raise ValueError("not a TCP port")
    return port


def default_ports() -> dict[str, int]:
    return {name: env_value(var, _port, port) for name, (port, var) in DEFAULT_PORTS.items()}


def _retention(raw: str) -> int:
    value = int(raw)
    if value != 0 and value < 3600:
        raise ValueError("InfluxDB needs 0 (forever) or at least 3600 s")
    return value


@dataclass(frozen=True)
class StackConfig:
    home: Path = field(default_factory=default_home)
    cache: Path = field(default_factory=default_cache)
    ports: Mapping[str, int] = field(default_factory=default_ports)
    hot_retention_s: int = field(
        default_factory=lambda: env_value("STEPLENS_HOT_RETENTION_S", _retention, HOT_RETENTION_S)
    )
    host: str = "127.0.0.1"

    @classmethod
    def create(
        cls,
        home: Path | str | None = None,
        ports: Mapping[str, int] | None = None,
        cache: Path | str | None = None,
    ) -> StackConfig:
        """Defaults for everything not given; ``ports`` may name only some ports."""
        merged = {**default_ports(), **(ports or {})}
        return cls(
            home=Path(home).expanduser().resolve() if home else default_home(),
            cache=Path(cache).expanduser().resolve() if cache else default_cache(),
            ports=merged,
        )

    def service_dir(self, service: str) -> Path:
        return self.home / service

    def log_path(self, service: str) -> Path:
        return self.home / "logs" / f"{service}.log"

    def pid_path(self, service: str) -> Path:
        return self.home / "pids" / f"{service}.pid"
