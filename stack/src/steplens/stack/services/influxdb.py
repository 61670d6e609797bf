"""InfluxDB 2.x (influxd built once from source), set up through its HTTP API."""

from __future__ import annotations

import json
import os
import resource
import urllib.error
import urllib.request
from typing import Any, Final

from steplens.schema.settings import env_value
from steplens.stack.config import (
    INFLUX_BUCKET,
    INFLUX_ORG,
    INFLUX_ROLLUP_BUCKET,
    INFLUX_USER,
    INFLUXDB_VERSION,
    ROLLUP_RETENTION_S,
)
from steplens.stack.errors import StackError
from steplens.stack.install import ensure_influxd, influxd_binary
from steplens.stack.services.base import Progress, Service

# What influxd may hold in memory. InfluxDB 2.9 has no series or field-key limit of its own
# (1.x's max-series-per-database and max-values-per-tag are gone): the sinks cap metric names.
CACHE_AND_QUERY_LIMITS: Final = (
    # per shard; a full cache refuses writes, which the sink retries
    ("--storage-cache-max-memory-size", "256MiB"),
    ("--storage-cache-snapshot-memory-size", "25MiB"),
    ("--storage-max-concurrent-compactions", "1"),
    ("--storage-series-id-set-cache-size", "100"),
    # 8 queries at a time, 64 waiting, 256 MiB each and 512 MiB in all: a query past its
    # share fails ("allocation limit reached") instead of growing the server
    ("--query-concurrency", "8"),
    ("--query-queue-size", "64"),
    ("--query-initial-memory-bytes", "16MiB"),
    ("--query-memory-bytes", "256MiB"),
    ("--query-max-memory-bytes", "512MiB"),
)
DEFAULT_MEMORY_MB: Final = 3072


def memory_ceiling_bytes() -> int:
    """STEPLENS_INFLUX_MEMORY_MB (default 3072), in bytes."""
    mb = env_value("STEPLENS_INFLUX_MEMORY_MB", _at_least_256, DEFAULT_MEMORY_MB)
    return mb << 20


def _at_least_256(raw: str) -> int:
    value = int(raw)
    if value < 256:
        raise ValueError("influxd needs at least 256 MB")
    return value


class InfluxDB(Service):
    name = "influxdb"
    version = INFLUXDB_VERSION
    port_names = ("influxdb",)

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def install(self, progress: Progress) -> None:
        ensure_influxd(self.cfg, progress)

    def prepare(self, progress: Progress) -> None:
        self.private_dir("engine")

    def argv(self) -> list[str]:
        return [
            str(influxd_binary(self.cfg)),
            "--bolt-path",
            str(self.dir / "influxd.bolt"),
            "--engine-path",
            str(self.dir / "engine"),
            "--sqlite-path",
            str(self.dir / "influxd.sqlite"),
            "--http-bind-address",
            self.address,
            "--reporting-disabled",
            "--ui-disabled",
            "--log-level",
            "info",
            *(part for flag in CACHE_AND_QUERY_LIMITS for part in flag),
            *os.environ.get("STEPLENS_INFLUXD_OPTS", "").split(),  # later flags win
        ]

    def process_env(self) -> dict[str, str]:
        # INFLUXD_* variables of the caller would override our flags: drop them. The Go
        # runtime collects harder as the heap nears GOMEMLIMIT, two thirds of the ceiling.
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFLUXD_")}
        env["GOMEMLIMIT"] = f"{memory_ceiling_bytes() * 2 // 3 >> 20}MiB"
        return env

    def memory_limits(self) -> dict[int, int]:
        """The data segment (the Go heap, libflux's allocations; not the TSM files influxd
        maps) cannot pass the ceiling: influxd then stops, rather than the machine."""
        return {resource.RLIMIT_DATA: memory_ceiling_bytes()}

    def _call(
        self, method: str, path: str, body: Any = None, auth: bool = True, timeout_s: float = 10
    ) -> Any:
        """One JSON request; errors name the method, path and status, never the token."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Token {self.secrets.influx_token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise StackError(f"influxdb: {method} {path} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise StackError(f"influxdb: {method} {path} failed: {exc}") from None
        return json.loads(raw) if raw else None

    def probe(self) -> str | None:
        try:
            health = self._call("GET", "/health", auth=False, timeout_s=2)
        except StackError as exc:
            return str(exc)
        if health.get("status") != "pass":
            return f"/health says {health.get('status')}: {health.get('message', '')}"
        return None

    def _bucket(self, org_id: str, name: str) -> dict[str, Any] | None:
        found = self._call("GET", f"/api/v2/buckets?orgID={org_id}&limit=100")
        return next((b for b in found.get("buckets", []) if b["name"] == name), None)

    def configure(self, progress: Progress) -> None:
        hot = self.cfg.hot_retention_s
        if self._call("GET", "/api/v2/setup", auth=False).get("allowed"):
            progress(f"[influxdb] setting up org {INFLUX_ORG}, bucket {INFLUX_BUCKET} ({hot} s)")
            self._call(
                "POST",
                "/api/v2/setup",
                {
                    "username": INFLUX_USER,
                    "password": self.secrets.influx_password,
                    "org": INFLUX_ORG,
                    "bucket": INFLUX_BUCKET,
                    "token": self.secrets.influx_token,
                    "retentionPeriodSeconds": hot,
                },
                auth=False,
            )
        orgs = self._call("GET", f"/api/v2/orgs?org={INFLUX_ORG}").get("orgs", [])
        if not orgs:
            raise StackError(
                f"influxdb: org {INFLUX_ORG!r} is missing; run `steplens stack down` "
                f"and remove {self.dir} to set it up again"
            )
        org_id = orgs[0]["id"]
        for name, retention in ((INFLUX_BUCKET, hot), (INFLUX_ROLLUP_BUCKET, ROLLUP_RETENTION_S)):
            rules = [{"type": "expire", "everySeconds": retention}] if retention else []
            bucket = self._bucket(org_id, name)
            if bucket is None:
                self._call(
                    "POST",
                    "/api/v2/buckets",
                    {"orgID": org_id, "name": name, "retentionRules": rules},
                )
                progress(f"[influxdb] created bucket {name} (retention {retention} s)")
            elif [r.get("everySeconds") for r in bucket.get("retentionRules", [])] != [
                r["everySeconds"] for r in rules
            ]:
                self._call("PATCH", f"/api/v2/buckets/{bucket['id']}", {"retentionRules": rules})
                progress(f"[influxdb] bucket {name}: retention set to {retention} s")

    def env(self) -> dict[str, str]:
        return {
            "STEPLENS_INFLUX_URL": self.url,
            "STEPLENS_INFLUX_ORG": INFLUX_ORG,
            "STEPLENS_INFLUX_TOKEN": self.secrets.influx_token,
            "STEPLENS_INFLUX_BUCKET": INFLUX_BUCKET,
            "STEPLENS_INFLUX_ROLLUP_BUCKET": INFLUX_ROLLUP_BUCKET,
        }
