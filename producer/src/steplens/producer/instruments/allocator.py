"""PyTorch's caching-allocator figures of the GPUs this process holds memory on, for the
``hw`` record's GPU entries (the memory training holds, which NVML's "used" hides under the
allocator's cache).

Read in the hardware sampler's thread, never the caller's: ``torch.cuda.memory_stats`` reads the
allocator's host-side counters (no device work, no sync) and ``torch.cuda.mem_get_info`` asks
the driver for the device's free memory (no stream is waited on). Nothing is read before the
training code initialised CUDA itself (reading would create a CUDA context in this thread),
nor on a process without torch imported (torch is never imported here).

Keys of an entry (``steplens.schema.kinds.Hw``): ``torch_allocated_bytes`` and
``torch_reserved_bytes`` (current), ``torch_peak_bytes`` (the allocated high-water mark since
start or the last ``reset_peak_memory_stats``), ``torch_alloc_retries`` (cudaMalloc retried
after freeing the cache) and ``torch_ooms`` (out-of-memory errors raised), both cumulative;
``torch_limit_bytes``, what allocated memory can reach: reserved plus the device's free memory.
"""

from __future__ import annotations

import os
import sys
from typing import Any

RETRIES, OOMS = "torch_alloc_retries", "torch_ooms"
RESERVED, PEAK, LIMIT = "torch_reserved_bytes", "torch_peak_bytes", "torch_limit_bytes"
STATS = (
    ("torch_allocated_bytes", "allocated_bytes.all.current"),
    (RESERVED, "reserved_bytes.all.current"),
    (PEAK, "allocated_bytes.all.peak"),
    (RETRIES, "num_alloc_retries"),
    (OOMS, "num_ooms"),
)


class AllocatorReader:
    def __init__(self) -> None:
        self._ids: dict[int, dict[str, Any]] = {}  # torch device -> its NVML index and uuid
        self.errors = 0

    def read(self) -> list[dict[str, Any]]:
        """One entry per device this process holds memory on (none without CUDA in use)."""
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None:
            return []
        try:
            if not cuda.is_initialized():
                return []
            count = cuda.device_count()
        except Exception:
            self.errors += 1
            return []
        out = []
        for device in range(count):
            try:
                entry = self._device(cuda, device)
            except Exception:
                self.errors += 1
                continue
            if entry is not None:
                out.append(entry)
        return out

    def _device(self, cuda: Any, device: int) -> dict[str, Any] | None:
        stats = cuda.memory_stats(device)
        reserved = int(stats.get("reserved_bytes.all.current", 0))
        if not reserved and not stats.get("num_ooms"):
            return None  # not this process's device
        ids = self._ids.get(device)
        if ids is None:
            ids = self._ids[device] = _identity(cuda, device)
        out: dict[str, Any] = dict(ids)
        for key, name in STATS:
            out[key] = int(stats.get(name, 0))
        free, _total = cuda.mem_get_info(device)
        out[LIMIT] = reserved + int(free)
        return out


def _identity(cuda: Any, device: int) -> dict[str, Any]:
    """The NVML index (through ``CUDA_VISIBLE_DEVICES`` when it lists indexes) and uuid of a
    torch device, which the NVML sampler's entry of the same GPU carries."""
    index = device
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if device < len(visible) and visible[device].isdigit():
        index = int(visible[device])
    out: dict[str, Any] = {"index": index}
    uuid = str(getattr(cuda.get_device_properties(device), "uuid", "") or "")
    if uuid:
        out["uuid"] = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return out


def merge(gpus: list[dict[str, Any]], allocator: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """NVML's entries with the allocator's added to the entry of the same GPU (by uuid, else
    index); an allocator entry NVML does not list is appended."""
    by_uuid = {g["uuid"]: g for g in gpus if "uuid" in g}
    by_index = {g.get("index"): g for g in gpus}
    for entry in allocator:
        same = by_uuid.get(entry.get("uuid")) or by_index.get(entry["index"])
        if same is None:
            gpus.append(entry)
        else:
            same.update({k: v for k, v in entry.items() if k.startswith("torch_")})
    return gpus
