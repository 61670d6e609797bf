"""The per-host hardware sampler: a daemon thread that reads host and GPU statistics every
``interval_s`` and hands each sample (a ``hw`` payload) to a callback, and to ``listeners``
(the node exporter), which must not modify it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from steplens.producer.gpu_stats import GpuSampler
from steplens.producer.host_stats import HostSampler

log = logging.getLogger("steplens")


class HardwareSampler:
    def __init__(
        self,
        emit: Callable[[dict[str, Any]], None],
        interval_s: float = 1.0,
        slow_every: int = 10,
        gpu: GpuSampler | None = None,
        host: HostSampler | None = None,
    ) -> None:
        self._emit = emit
        self.interval_s = interval_s
        self.slow_every = max(1, slow_every)
        self.gpu = gpu or GpuSampler()
        self.host = host or HostSampler()
        self.errors = 0
        self.samples = 0
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="steplens-hw", daemon=True)
        self._thread.start()

    def sample_once(self) -> dict[str, Any]:
        """One ``hw`` payload (host + every GPU)."""
        data = self.host.sample(time.monotonic())
        data["gpus"] = self.gpu.sample(slow=self.samples % self.slow_every == 0)
        data["gpu_status"] = self.gpu.status
        self.samples += 1
        return data

    def _run(self) -> None:
        try:
            self.gpu.start()
        except Exception as exc:  # never let NVML trouble escape the thread
            log.info("steplens: GPU sampler disabled: %s", exc)
        self.host.sample(time.monotonic())  # baseline for the first rates
        while not self._stop.wait(self.interval_s):
            try:
                data = self.sample_once()
                for listener in self.listeners:
                    listener(data)
                self._emit(data)
            except Exception:
                self.errors += 1
        try:
            self.gpu.close()
        except Exception:
            self.errors += 1

    def stop(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
