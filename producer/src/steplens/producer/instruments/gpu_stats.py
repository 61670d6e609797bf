"""GPU statistics through NVML (nvidia-ml-py), covering every GPU of the host.

Cheap queries (about 2-8 us each) run at every sample; PCIe throughput (about 21 ms, it samples
a window) and total energy (about 3 ms) only when ``slow`` is set. XID critical errors are
counted from an NVML event set, every event. A query the device does not support is left out.
Memory bandwidth (``mem_bw_util``, percent) comes from GPM's DRAM bandwidth where the device
has it and from the coarse ``utilization.memory`` elsewhere; ``mem_bw_source`` says which
("gpm" or "util", ``gpm.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from steplens.producer.instruments.gpm import GPM, UTIL, GpmReader, not_supported

# the names of the bits of ``throttle_reasons`` (nvmlClocksThrottleReason*), lowest first

log = logging.getLogger("steplens")


class GpuSampler:
    def __init__(self, nvml: Any = None) -> None:
        """``nvml``: the pynvml module (imported when None) or an object with its API."""
        self._nvml = nvml
        self.status = "ok"
        self.errors = 0
        self._handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._events: Any = None
        self._gpm: GpmReader | None = None
        self.xid_count: dict[int, int] = {}
        self.xid_last: dict[int, int] = {}

    def start(self) -> str:
        """Initialise NVML; returns the status ("ok", "no_nvml", "no_gpu" or an error)."""
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            nv = self._nvml
            nv.nvmlInit()
        except ImportError:
            self.status = "no_nvml"
        except Exception as exc:
            self.status = "no_nvml" if "LibraryNotFound" in type(exc).__name__ else str(exc)[:200]
        else:
            try:
                count = nv.nvmlDeviceGetCount()
                self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
                self._static = [self._identity(i, h) for i, h in enumerate(self._handles)]
                self.status = "ok" if count else "no_gpu"
                self._register_xid_events()
                self._gpm = GpmReader(nv, self._handles, self._count_error)
            except Exception as exc:
                self.status = str(exc)[:200] or type(exc).__name__
        if self.status != "ok":
            log.info("steplens: no GPU statistics on this host (%s); carrying on", self.status)
        return self.status

    def _identity(self, index: int, handle: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index}
        uuid = self._q(self._nvml.nvmlDeviceGetUUID, handle)
        name = self._q(self._nvml.nvmlDeviceGetName, handle)
        if uuid is not None:
            out["uuid"] = _text(uuid)
        if name is not None:
            out["name"] = _text(name)
        return out

    def _register_xid_events(self) -> None:
        nv = self._nvml
        try:
            self._events = nv.nvmlEventSetCreate()
        except Exception:
            return
        for handle in self._handles:
            self._q(
                nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError, self._events
            )

    def _count_error(self) -> None:
        self.errors += 1

    def _q(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML query; None when unsupported or failing (failures are counted)."""
        try:
            return fn(*args)
        except Exception as exc:
            if not not_supported(exc):
                self.errors += 1
            return None

    def drain_xid_events(self) -> None:
        """Count every pending XID critical-error event (non-blocking)."""
        if self._events is None:
            return
        nv = self._nvml
        for _ in range(1000):  # bounded; a storm of events is counted over several samples
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # timeout: no more events
                return
            index = self._q(nv.nvmlDeviceGetIndex, data.device)
            index = -1 if index is None else int(index)
            self.xid_count[index] = self.xid_count.get(index, 0) + 1
            self.xid_last[index] = int(data.eventData)

    def sample(self, slow: bool = False) -> list[dict[str, Any]]:
        if self.status != "ok":
            return []
        self.drain_xid_events()
        return [self.read(i, h, slow) for i, h in enumerate(self._handles)]

    def read(self, index: int, handle: Any, slow: bool) -> dict[str, Any]:
        nv, q = self._nvml, self._q
        out: dict[str, Any] = (
            dict(self._static[index]) if index < len(self._static) else {"index": index}
        )
        mem = q(nv.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            out["mem_used_bytes"], out["mem_total_bytes"] = int(mem.used), int(mem.total)
        util = q(nv.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            out["util_gpu"], out["util_mem"] = float(util.gpu), float(util.memory)
        self._memory_bandwidth(out, index, util)
        power = q(nv.nvmlDeviceGetPowerUsage, handle)  # milliwatts
        if power is not None:
            out["power_w"] = power / 1000.0
        temp = q(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        if temp is not None:
            out["temp_c"] = float(temp)
        clock = q(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
        if clock is not None:
            out["sm_clock_mhz"] = float(clock)
        throttle = q(nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        if throttle is not None:
            out["throttle_reasons"] = int(throttle)
        for key, kind in (
            ("ecc_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            ecc = q(nv.nvmlDeviceGetTotalEccErrors, handle, kind, nv.NVML_VOLATILE_ECC)
            if ecc is not None:
                out[key] = int(ecc)
        out["xid_count"] = self.xid_count.get(index, 0)
        if index in self.xid_last:
            out["xid_last"] = self.xid_last[index]
        if slow:
            tx = q(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_TX_BYTES)  # KB/s
            rx = q(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_RX_BYTES)
            if tx is not None:
                out["pcie_tx_mb_s"] = tx / 1000.0
            if rx is not None:
                out["pcie_rx_mb_s"] = rx / 1000.0
            energy = q(nv.nvmlDeviceGetTotalEnergyConsumption, handle)  # millijoules
            if energy is not None:
                out["energy_j"] = energy / 1000.0
        return out

    def _memory_bandwidth(self, out: dict[str, Any], index: int, util: Any) -> None:
        gpm = self._gpm
        bw = gpm.read(index) if gpm is not None else None
        if gpm is not None and gpm.source(index) == GPM:
            if bw is not None:  # none at the first sample: GPM measures between two
                out["mem_bw_util"], out["mem_bw_source"] = bw, GPM
        elif util is not None:
            out["mem_bw_util"], out["mem_bw_source"] = float(util.memory), UTIL

    def close(self) -> None:
        if self.status != "ok" or self._nvml is None:
            return
        if self._gpm is not None:
            self._gpm.close()
        if self._events is not None:
            self._q(self._nvml.nvmlEventSetFree, self._events)
        self._q(self._nvml.nvmlShutdown)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
