"""The Monitor made of its parts: a part given instead of the one the settings make gets what
the loop logs, a part that fails never raises into the loop, and no part hides the facade."""

from __future__ import annotations

import importlib
import pkgutil
import time
from pathlib import Path

import steplens.producer as sl
from steplens.producer import api
from steplens.producer.delivery.live_or_spool import Delivery
from steplens.producer.delivery.spool import Spool
from steplens.producer.delivery.transport import MemoryTransport
from steplens.producer.monitor import Monitor
from steplens.producer.remedies.advice_inbox import AdviceSource
from steplens.schema import Record, decode


class RecordingDelivery(Delivery):
    """Keeps each encoded record instead of sending it."""

    def __init__(self, spool_dir: Path) -> None:
        super().__init__(MemoryTransport, Spool(str(spool_dir), 1 << 20))
        self.records: list[Record] = []

    def send(self, key: bytes, value: bytes) -> None:
        self.records.append(decode(value))


class BrokenDelivery(Delivery):
    """Raises at every call the worker makes."""

    def __init__(self, spool_dir: Path) -> None:
        super().__init__(MemoryTransport, Spool(str(spool_dir), 1 << 20))
        self.calls = 0

    def _broken(self, *_args: object, **_kwargs: object) -> int:
        self.calls += 1
        raise RuntimeError("disk gone")

    send = service = flush = close = _broken  # type: ignore[assignment]


def _broken_source() -> AdviceSource:
    raise ConnectionError("no broker")


def test_a_given_delivery_gets_the_steps_logged(tmp_path: Path) -> None:
    delivery = RecordingDelivery(tmp_path / "own")
    m = Monitor("parts", delivery=delivery, hw_interval_s=0, remedies=[], sample_rate=1.0,
                spool_dir=str(tmp_path / "spool"))  # fmt: skip
    for step in range(20):
        m.log_step(step, loss=2.0, lr=1e-3, tokens=64)
    assert m.flush(10)
    m.shutdown()
    assert m.delivery is delivery
    assert [r.step for r in delivery.records if r.kind == "step"] == list(range(20))
    assert delivery.records[0].kind == "run_meta" and delivery.records[-1].kind == "health"
    assert not (tmp_path / "spool").exists()  # the settings' delivery was never made


def test_failing_parts_never_raise_into_the_loop(tmp_path: Path) -> None:
    delivery = BrokenDelivery(tmp_path / "own")
    m = Monitor("parts", delivery=delivery, advice_source=_broken_source, hw_interval_s=0,
                remedies=["skip_samples"], spool_dir=str(tmp_path / "spool"))  # fmt: skip
    for step in range(50):
        m.log_step(step, loss=2.0, lr=1e-3)
        m.log_eval(step, loss=1.0)
    assert m.advice() == ()
    assert m.flush(0.2) is False  # the delivery raised: nothing confirmed, nothing raised
    deadline = time.monotonic() + 10
    while m.stats()["advice"].get("source_error", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    m.shutdown(1.0)
    stats = m.stats()
    assert delivery.calls > 0 and stats["errors"]["worker"] == delivery.calls  # each counted
    assert stats["advice"]["source_error"] >= 1
    assert stats["caller_errors"] == 0


def test_no_module_of_the_producer_hides_a_function_of_the_facade() -> None:
    """Importing a sub-package sets it as an attribute of ``steplens.producer``: none may
    share a name with what ``sl.`` offers."""
    for info in pkgutil.walk_packages(sl.__path__, "steplens.producer."):
        if not info.name.startswith("steplens.producer.integrations"):  # framework imports
            importlib.import_module(info.name)
    for name in sl.__all__:
        if hasattr(api, name):
            assert getattr(sl, name) is getattr(api, name), name
