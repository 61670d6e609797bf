"""The hardware sampler: a daemon thread that reads host and GPU statistics every
``interval_s`` and hands each sample (a ``hw`` payload) to a callback, and to ``listeners``
(the node exporter), which must not modify it.

One per host (``host_wide``, local rank 0) reads NVML and the host; every process adds its
own PyTorch allocator's figures to its GPUs' entries (``allocator.py``): the other ranks' samplers
(``host_wide=False``) send only those, a ``hw`` record with ``gpus`` alone, when they have any.
Listeners get every sample; the record is sent when due (``report_cadence``): a node's sample
every ``report_every_s``, at once with news (an error counter, a throttle reason, a level
past its band), and every one while the process's steps have paused (``paused``); a rank's
allocator figures every ``allocator_every_s``, at once when the allocator retried or failed,
and at most every 5 s while its high-water mark climbs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from steplens.producer.instruments.allocator import AllocatorReader, merge
from steplens.producer.instruments.gpu_stats import GpuSampler
from steplens.producer.instruments.host_stats import HostSampler
from steplens.producer.instruments.report_cadence import (
    FOLLOW,
    ReportCadence,
    allocator_cadence,
    has_slow_fields,
    node_news,
)

log = logging.getLogger("steplens")


class HardwareSampler:
    def __init__(
        self,
        emit: Callable[[dict[str, Any]], None],
        interval_s: float = 1.0,
        slow_every: int = 10,
        gpu: GpuSampler | None = None,
        host: HostSampler | None = None,
        *,
        host_wide: bool = True,
        allocator_every_s: float = 0.0,
        report_every_s: float = 0.0,
        paused: Callable[[], bool] = lambda: False,
        phase: float = 0.0,
    ) -> None:
        self._emit = emit
        self.interval_s = interval_s
        self.slow_every = max(1, slow_every)
        self.gpu = gpu or GpuSampler()
        self.host = host or HostSampler()
        self.host_wide = host_wide
        self.allocator = AllocatorReader()
        self.paused = paused  # steps paused: every node sample is sent (``_kept``)
        self.cadence = (
            ReportCadence(report_every_s, node_news, FOLLOW, kept=self._kept, phase=phase)
            if host_wide
            else allocator_cadence(allocator_every_s, phase)
        )
        self.errors = 0
        self.samples = 0
        self.sent = 0  # samples sent (every sample goes to the listeners)
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="steplens-hw", daemon=True)
        self._thread.start()

    def sample_once(self) -> dict[str, Any]:
        """One ``hw`` payload (host + every GPU; not host-wide: this process's GPUs' allocator
        figures, or nothing)."""
        self.samples += 1
        if not self.host_wide:
            own = self.allocator.read()
            return {"gpus": own} if own else {}
        data = self.host.sample(time.monotonic())
        gpus = self.gpu.sample(slow=(self.samples - 1) % self.slow_every == 0)
        data["gpus"] = merge(gpus, self.allocator.read())
        data["gpu_status"] = self.gpu.status
        return data

    def _run(self) -> None:
        if self.host_wide:
            try:
                self.gpu.start()
            except Exception as exc:  # never let NVML trouble escape the thread
                log.info("steplens: GPU sampler disabled: %s", exc)
            self.host.sample(time.monotonic())  # baseline for the first rates
        while not self._stop.wait(self.interval_s):
            self._sample_and_send()
        if self.sent == 0:  # a run shorter than an interval (or starved) still reports once
            self._sample_and_send()
        try:
            if self.host_wide:
                self.gpu.close()
        except Exception:
            self.errors += 1

    def _kept(self, data: dict[str, Any]) -> bool:
        """A node sample sent off its cadence: one with the slow fields, and every one while
        the process's steps have paused (the stream jobs judge a hang by samples that keep
        coming: at the cadence a hang was confirmed up to two cadences late)."""
        if has_slow_fields(data):
            return True
        try:
            return self.paused()
        except Exception:
            self.errors += 1
            return False

    def due(self, data: dict[str, Any], now_s: float) -> bool:
        """Whether a sample is sent (``report_cadence``)."""
        return self.cadence.due(data, now_s)

    def _sample_and_send(self) -> None:
        try:
            data = self.sample_once()
            if not data:
                return
            for listener in self.listeners:
                listener(data)
            if self.due(data, time.monotonic()):
                self._emit(data)
                self.sent += 1
        except Exception:
            self.errors += 1

    def stop(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
