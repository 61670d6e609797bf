"""NVML parsing with the real pynvml structures behind a stand-in device API (no GPU here),
and the "no NVML" path of this machine."""

from __future__ import annotations

from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

from steplens.producer.gpu_stats import GpuSampler  # noqa: E402


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


def test_parses_every_field_and_counts_every_xid() -> None:
    s = GpuSampler(FakeDevices())
    assert s.start() == "ok"
    fast = s.sample(slow=False)
    g0, g1 = fast
    assert g0["uuid"] == "GPU-0" and g0["name"] == "NVIDIA H200"
    assert g0["mem_used_bytes"] == 10 << 30 and g0["mem_total_bytes"] == 141 << 30
    assert (g0["util_gpu"], g0["util_mem"], g0["power_w"]) == (97.0, 40.0, 650.5)
    assert (g0["temp_c"], g0["sm_clock_mhz"], g0["throttle_reasons"]) == (71.0, 1980.0, 4)
    assert (g0["ecc_corrected"], g0["ecc_uncorrected"]) == (3, 0)
    assert "ecc_corrected" not in g1 and s.errors == 0  # NotSupported is absence, not an error
    assert (g0["xid_count"], g0["xid_last"], g1["xid_count"], g1["xid_last"]) == (2, 31, 1, 48)
    assert "pcie_tx_mb_s" not in g0
    slow = s.sample(slow=True)[0]
    assert (slow["pcie_tx_mb_s"], slow["pcie_rx_mb_s"]) == (2000.0, 500.0)
    assert slow["energy_j"] == pytest.approx(123456.789)
    s.close()


def test_no_gpu_here_says_so_and_carries_on() -> None:
    s = GpuSampler()
    status = s.start()
    if status == "ok":
        pytest.skip("this machine has a GPU")
    assert s.sample() == []
