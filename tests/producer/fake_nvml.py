"""Stand-ins for NVML's device API over the real pynvml structures (no GPU here): two GPUs,
one of them with GPM."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml


class FakeDevices:
    """pynvml's API for two GPUs; GPU 1 does not support ECC queries; two XID events wait."""

    def __init__(self) -> None:
        self.events = [(0, 79), (1, 48), (0, 31)]
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        m = pynvml.c_nvmlMemory_t()
        m.total, m.used, m.free = 141 << 30, (10 + h) << 30, (131 - h) << 30
        return m

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = 97, 40
        return u

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 650_500

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x4

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        if h == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 3 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        return 2_000_000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 500_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 123_456_789

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, s: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> Any:
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        dev, xid = self.events.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.eventData = xid
        return type("Event", (), {"device": dev, "eventData": data.eventData})()

    def nvmlEventSetFree(self, s: str) -> None: ...


PEAK_BYTES_S = 4.8e12  # an H200's HBM3e


class FakeGpmDevices(FakeDevices):
    """GPU 0 has GPM (DRAM bytes moved at a scripted rate per second); GPU 1 does not. GPM's
    metric is computed here from the two samples the sampler hands back, in their order."""

    def __init__(self, rates: list[float], fail_metrics: int = 0) -> None:
        super().__init__()
        for name in dir(pynvml):
            if name.startswith(("NVML_GPM_", "c_nvmlGpm")):
                setattr(self, name, getattr(pynvml, name))
        self.rates = list(rates)  # share of peak per sample interval, GPU 0
        self.fail_metrics = fail_metrics
        self.t = 0.0
        self.moved = 0.0
        self.snapshots: dict[int, tuple[float, float]] = {}
        self.allocated: set[int] = set()
        self.freed: set[int] = set()
        self._next = 0x1000

    @staticmethod
    def _addr(sample: Any) -> int:
        return ctypes.cast(sample, ctypes.c_void_p).value or 0

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(h == 0)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._next += 0x10
        self.allocated.add(self._next)
        return ctypes.cast(ctypes.c_void_p(self._next), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed.add(self._addr(sample))

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:
        assert h == 0, "GPM asked of a device that does not support it"
        if self.snapshots:  # one second passes between the sampler's readings
            self.t += 1.0
            self.moved += self.rates.pop(0) * PEAK_BYTES_S
        self.snapshots[self._addr(sample)] = (self.t, self.moved)
        return sample

    def nvmlGpmMetricsGet(self, query: Any) -> Any:
        assert query.version == pynvml.NVML_GPM_METRICS_GET_VERSION and query.numMetrics == 1
        metric = query.metrics[0]
        assert metric.metricId == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        if self.fail_metrics:
            self.fail_metrics -= 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        (t1, b1), (t2, b2) = (self.snapshots[self._addr(s)] for s in (query.sample1, query.sample2))
        metric.nvmlReturn = pynvml.NVML_SUCCESS
        metric.value = 100.0 * (b2 - b1) / (t2 - t1) / PEAK_BYTES_S
        return query
