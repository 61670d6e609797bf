"""DRAM bandwidth utilisation from NVML's GPU Performance Monitoring (GPM, Hopper and later).

GPM gives the share of the DRAM's peak bandwidth in use between two samples of a device's
counters, without a profiler. ``nvmlDeviceGetUtilizationRates().memory`` is coarser: the share
of time the memory controller was busy at all, however little it moved. A device where GPM is
not supported (older GPUs, an nvidia-ml-py without it) has no ``GpmReader`` state: the caller
falls back to that counter and says so (``mem_bw_source`` "util" instead of "gpm").

Every call runs on the hardware sampler's thread, never on the training thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("steplens")

GPM = "gpm"
UTIL = "util"
MAX_FAILURES = 3  # consecutive failed readings after which a device falls back to "util"


def not_supported(exc: Exception) -> bool:
    return "NotSupported" in type(exc).__name__ or "NOT_SUPPORTED" in str(exc).upper()


class GpmDevice:
    """Two GPM samples of one device, alternately the earlier and the later one."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.earlier = nvml.nvmlGpmSampleAlloc()
        try:
            self.later = nvml.nvmlGpmSampleAlloc()
        except Exception:
            nvml.nvmlGpmSampleFree(self.earlier)
            raise
        self.primed = False  # whether ``earlier`` holds a sample
        self.failures = 0

    def read(self) -> float | None:
        """DRAM bandwidth used since the previous call, in percent of peak (None at the first
        call, which only takes the sample the next one is measured from)."""
        nv = self.nvml
        nv.nvmlGpmSampleGet(self.handle, self.later)
        if not self.primed:
            self.earlier, self.later = self.later, self.earlier
            self.primed = True
            return None
        query = nv.c_nvmlGpmMetricsGet_t()
        query.version = nv.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = 1
        query.sample1, query.sample2 = self.earlier, self.later
        query.metrics[0].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
        nv.nvmlGpmMetricsGet(query)
        self.earlier, self.later = self.later, self.earlier
        metric = query.metrics[0]
        if metric.nvmlReturn != nv.NVML_SUCCESS:
            raise RuntimeError(f"GPM DRAM_BW_UTIL: NVML return {metric.nvmlReturn}")
        return float(metric.value)

    def free(self) -> None:
        for sample in (self.earlier, self.later):
            self.nvml.nvmlGpmSampleFree(sample)


class GpmReader:
    """DRAM bandwidth per device index where GPM works; ``None`` marks the fallback."""

    def __init__(self, nvml: Any, handles: list[Any], on_error: Callable[[], None]) -> None:
        self.on_error = on_error  # counts a failure (the GPU sampler's error counter)
        self.devices: list[GpmDevice | None] = [self._open(nvml, h) for h in handles]

    def _open(self, nvml: Any, handle: Any) -> GpmDevice | None:
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return None
            return GpmDevice(nvml, handle)
        except AttributeError:  # an nvidia-ml-py without GPM
            return None
        except Exception as exc:
            if not not_supported(exc):
                self.on_error()
            return None

    def source(self, index: int) -> str:
        return GPM if index < len(self.devices) and self.devices[index] is not None else UTIL

    def read(self, index: int) -> float | None:
        """The device's DRAM bandwidth utilisation (percent) since its last reading; None at
        the first one or after a failed reading (counted). After ``MAX_FAILURES`` in a row
        the device falls back to the utilisation counter for good."""
        dev = self.devices[index] if index < len(self.devices) else None
        if dev is None:
            return None
        try:
            value = dev.read()
        except Exception as exc:
            self.on_error()
            dev.failures += 1
            dev.primed = False
            if dev.failures >= MAX_FAILURES:
                log.info("steplens: GPU %d: GPM failed (%s); using utilization.memory", index, exc)
                self._close(index)
            return None
        if value is not None:
            dev.failures = 0
        return value

    def _close(self, index: int) -> None:
        dev, self.devices[index] = self.devices[index], None
        if dev is not None:
            try:
                dev.free()
            except Exception:
                self.on_error()

    def close(self) -> None:
        for index in range(len(self.devices)):
            self._close(index)
