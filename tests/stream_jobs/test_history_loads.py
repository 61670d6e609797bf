"""History loads in the worker, without Kafka: a load fails soft (the run starts cold, counted)
and is bounded in time and in the bytes of the messages it holds."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from history_helpers import steps
from prometheus_client import CollectorRegistry

from steplens.schema import encode
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.worker.history_loads import HistoryLoads
from steplens.stream_jobs.worker.settings import HistorySettings

NOWHERE = "http://127.0.0.1:9"  # nothing listens there: every store refuses


class Event:
    """A by-run message as the detect agent gets it."""

    def __init__(self, first: int, last: int) -> None:
        texts = [encode(r).decode() for r in steps("r", first, last)]
        self.value = orjson.dumps([[0, first + i, t] for i, t in enumerate(texts)])


@pytest.fixture(autouse=True)
def no_stores(monkeypatch):
    monkeypatch.setenv("STEPLENS_INFLUX_URL", NOWHERE)
    monkeypatch.setenv("STEPLENS_S3_ENDPOINT", NOWHERE)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")


def load_once(settings: HistorySettings, events: list[Event]):
    """``events`` of a run first seen (the first begins a load, the others wait with it);
    the run's detector, the messages handed back, and the load's outcome counts."""
    registry = CollectorRegistry()

    async def run():
        woke = asyncio.Event()

        async def wake(run: str) -> None:
            woke.set()

        loads = HistoryLoads(settings, DetectorConfig(), registry, wake)
        load = loads.begin("r", events[0])
        assert load is not None and not load.done
        for e in events[1:]:
            loads.hold(load, e)
        await asyncio.wait_for(woke.wait(), 60)
        assert load.done
        det, held = loads.finish("r", None)
        assert loads.held_bytes == 0 and not loads.loads
        return det, held

    det, held = asyncio.run(run())
    counts = {
        s.labels["outcome"]: s.value
        for m in registry.collect()
        if m.name == "steplens_worker_history_loads"
        for s in m.samples
        if s.name.endswith("_total")
    }
    return det, held, counts


def test_a_run_whose_stores_cannot_be_reached_starts_cold_and_is_counted():
    events = [Event(1000, 1010), Event(1010, 1020)]
    det, held, counts = load_once(HistorySettings(timeout_s=60), events)
    assert held == events  # handed back in order, to be scored now
    assert det.run_id == "r" and not det.series and not det.baseline
    assert counts == {"empty": 1}


def test_a_load_past_its_time_ends_and_the_run_starts_cold():
    events = [Event(1000, 1010)]
    det, held, counts = load_once(HistorySettings(timeout_s=0.0), events)
    assert held == events and not det.series
    assert counts == {"timeout": 1}


def test_a_load_that_would_hold_too_many_bytes_ends_there():
    events = [Event(1000, 1010), Event(1010, 1020), Event(1020, 1030)]
    budget = len(events[0].value) + len(events[1].value) // 2
    det, held, counts = load_once(HistorySettings(timeout_s=60, hold_bytes=budget), events)
    assert held == events and not det.series
    assert counts == {"over_budget": 1}


def test_a_run_that_starts_at_step_0_is_not_loaded():
    registry = CollectorRegistry()

    async def run():
        async def wake(run: str) -> None:
            raise AssertionError("no load, no wake")

        loads = HistoryLoads(HistorySettings(), DetectorConfig(), registry, wake)
        return loads.begin("r", Event(0, 10))

    assert asyncio.run(run()) is None
    got = registry.get_sample_value(
        "steplens_worker_history_loads_total", {"why": "start", "outcome": "fresh"}
    )
    assert got == 1
