"""Helpers for the producer tests: a Monitor on the in-memory transport."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steplens.producer.delivery.transport import MemoryTransport
from steplens.producer.monitor import Monitor


@pytest.fixture
def memory_monitor(tmp_path: Path) -> Iterator[Callable[..., tuple[Monitor, MemoryTransport]]]:
    made: list[Monitor] = []

    def make(**config: Any) -> tuple[Monitor, MemoryTransport]:
        transport = MemoryTransport()
        config.setdefault("hw_interval_s", 0)
        config.setdefault("spool_dir", str(tmp_path / "spool"))
        monitor = Monitor(f"test-{uuid.uuid4().hex[:8]}", transport=transport, **config)
        made.append(monitor)
        return monitor, transport

    yield make
    for m in made:
        m.shutdown(timeout_s=2)
