"""Values written into Flux source (InfluxDB OSS takes no query parameters)."""

from __future__ import annotations

from datetime import datetime, timezone


def flux_string(value: str) -> str:
    """A Flux string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
    return f'"{escaped}"'


def flux_time(t: datetime) -> str:
    """A Flux time literal (RFC 3339, UTC)."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def flux_time_ns(ns: int) -> str:
    """A Flux time literal of integer nanoseconds (RFC 3339, UTC, every digit kept)."""
    t = datetime.fromtimestamp(ns // 10**9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{t}.{ns % 10**9:09d}Z"
