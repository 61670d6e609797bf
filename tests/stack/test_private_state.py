"""A private stack's state folder is its user's alone, and its services run under ceilings."""

from __future__ import annotations

import resource
import stat
from pathlib import Path

import pytest

from steplens.stack.services.influxdb import CACHE_AND_QUERY_LIMITS, memory_ceiling_bytes

pytestmark = [pytest.mark.stack, pytest.mark.slow]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_state_is_private_and_services_have_memory_ceilings(private_stack) -> None:
    stack = private_stack(["kafka", "influxdb", "s3"])
    home = stack.home
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    shared = {
        str(p.relative_to(home)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in home.rglob("*")
        if not p.is_symlink() and stat.S_IMODE(p.stat().st_mode) & 0o077
    }
    assert shared == {}  # logs, pids, configs, Kafka's and InfluxDB's data, S3 objects
    assert len(list(home.rglob("*"))) > 20  # the services did write there

    influxd = stack.pid("influxdb")
    ceiling = memory_ceiling_bytes()
    assert resource.prlimit(influxd, resource.RLIMIT_DATA) == (ceiling, ceiling)
    assert _environ(influxd)["GOMEMLIMIT"] == f"{ceiling * 2 // 3 >> 20}MiB"
    argv = Path(f"/proc/{influxd}/cmdline").read_bytes().decode().split("\0")
    for flag, value in CACHE_AND_QUERY_LIMITS:
        assert argv[argv.index(flag) + 1] == value
    log = stack.cfg.log_path("influxdb").read_text()
    assert "memory_bytes_quota_per_query=268435456" in log  # influxd took the query limits
    for name, heap in (("kafka", "-Xmx512m"), ("s3", "-Xmx256m")):
        java = Path(f"/proc/{stack.pid(name)}/cmdline").read_bytes().decode().split("\0")
        assert heap in java and "-XX:+ExitOnOutOfMemoryError" in java
