"""Repeated warnings are said once per reason and interval, with counts."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from steplens.producer.delivery.live_or_spool import DOWN, Delivery
from steplens.producer.delivery.spool import Spool
from steplens.producer.delivery.transport import MemoryTransport
from steplens.schema.log_limit import LimitedLog, LimitFilter, RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_reason_logs_once_per_interval_and_counts_the_rest() -> None:
    clock = Clock()
    limit = RateLimit(interval_s=10.0, clock=clock)
    assert limit.admit("a") == 0
    assert [limit.admit("a") for _ in range(5)] == [None] * 5
    assert limit.admit("b") == 0  # reasons are counted apart
    clock.now = 9.9
    assert limit.admit("a") is None and limit.left_out("a") == 6
    clock.now = 10.0
    assert limit.admit("a") == 6
    assert limit.admit("a") is None
    assert limit.drain() == {"a": 1} and limit.drain() == {}


def test_limited_log_says_how_many_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    out = LimitedLog(logging.getLogger("steplens.test.limited"), interval_s=0.0)
    out.limit = RateLimit(interval_s=10.0, clock=(clock := Clock()))
    with caplog.at_level(logging.WARNING, logger="steplens.test.limited"):
        for _ in range(100):
            out.warning("full", "disk %s is full (100%%)", "/x")
        clock.now = 11.0
        out.warning("full", "disk %s is full (100%%)", "/x")
        out.warning("full", "disk %s is full (100%%)", "/x")
        out.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "disk /x is full (100%)",
        "disk /x is full (100%) (99 more in 10 s)",
        "steplens: 1 more 'full' warnings were not logged",
    ]


def test_limit_filter_keys_by_message_without_numbers() -> None:
    f = LimitFilter(interval_s=60.0)

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("steplens.kafka.x", logging.ERROR, "", 0, msg, (), None)

    passed = [
        f.filter(rec(f"Connect to 127.0.0.1:{p} failed (after {ms}ms)"))
        for p, ms in [(1, 0), (1, 3), (1, 1000)]
    ]
    assert passed == [True, False, False]
    assert f.filter(rec("Metadata request timed out")) is True


def test_a_full_spool_disk_logs_one_line_not_one_per_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(str(tmp_path / "spool"), max_bytes=1 << 20)

    def full(_key: bytes, _value: bytes) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool, "append", full)
    delivery = Delivery(MemoryTransport, spool)
    delivery.state = DOWN
    with caplog.at_level(logging.WARNING, logger="steplens"):
        for i in range(1536):
            delivery.send(b"k", b"v%d" % i)
        delivery.close(0.1)
    lines = [
        r.getMessage()
        for r in caplog.records
        if "write the spool" in r.getMessage() or "spool write" in r.getMessage()
    ]
    assert spool.dropped_records == 1536
    assert lines == [
        "steplens: cannot write the spool: [Errno 28] No space left on device",
        "steplens: 1535 more 'spool write' warnings were not logged",
    ]
