"""Host statistics from /proc (and psutil when installed): memory, CPU, disks, network.

The parsers are pure functions over file text, so they are tested on captured samples; rates
come from the difference of two readings.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size
_WHOLE_DISK_SKIP = re.compile(r"^(loop|ram|zram|fd|sr)\d*")
_PART_SUFFIX = re.compile(r"p?\d+")


@dataclass(frozen=True)
class DiskCounters:
    reads: int
    read_sectors: int
    read_ms: int
    writes: int
    write_sectors: int
    write_ms: int


def parse_diskstats(text: str) -> dict[str, DiskCounters]:
    """Whole devices (partitions and loop/ram devices left out) from /proc/diskstats."""
    out: dict[str, DiskCounters] = {}
    names = set()
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 14:
            continue
        names.add(parts[2])
        rows.append(parts)
    for parts in rows:
        name = parts[2]
        if _WHOLE_DISK_SKIP.match(name) or _is_partition(name, names):
            continue
        f = [int(x) for x in parts[3:14]]
        out[name] = DiskCounters(f[0], f[2], f[3], f[4], f[6], f[7])
    return out


def _is_partition(name: str, names: set[str]) -> bool:
    """sda1 of sda, nvme0n1p1 of nvme0n1, mmcblk0p1 of mmcblk0."""
    return any(
        other != name and name.startswith(other) and _PART_SUFFIX.fullmatch(name[len(other) :])
        for other in names
    )


def disk_rates(
    before: dict[str, DiskCounters], after: dict[str, DiskCounters], dt_s: float
) -> list[dict[str, Any]]:
    """read/write MB/s and mean I/O latency (ms per completed request) per device."""
    out: list[dict[str, Any]] = []
    if dt_s <= 0:
        return out
    for name, b in before.items():
        a = after.get(name)
        if a is None:
            continue
        ios = (a.reads - b.reads) + (a.writes - b.writes)
        busy_ms = (a.read_ms - b.read_ms) + (a.write_ms - b.write_ms)
        if ios < 0 or busy_ms < 0:  # counter reset
            continue
        out.append(
            {
                "device": name,
                "read_mb_s": (a.read_sectors - b.read_sectors) * SECTOR_BYTES / 1e6 / dt_s,
                "write_mb_s": (a.write_sectors - b.write_sectors) * SECTOR_BYTES / 1e6 / dt_s,
                "io_latency_ms": busy_ms / ios if ios else 0.0,
            }
        )
    return out


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """(rx bytes, tx bytes) per interface from /proc/net/dev, loopback left out."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[2:]:
        if ":" not in line:
            continue
        name, rest = line.split(":", 1)
        name = name.strip()
        fields = rest.split()
        if name == "lo" or len(fields) < 9:
            continue
        out[name] = (int(fields[0]), int(fields[8]))
    return out


def net_rates(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], dt_s: float
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if dt_s <= 0:
        return out
    for iface, (rx0, tx0) in before.items():
        if iface not in after:
            continue
        rx1, tx1 = after[iface]
        if rx1 < rx0 or tx1 < tx0:
            continue
        out.append(
            {
                "iface": iface,
                "rx_mb_s": (rx1 - rx0) / 1e6 / dt_s,
                "tx_mb_s": (tx1 - tx0) / 1e6 / dt_s,
            }
        )
    return out


def parse_meminfo(text: str) -> tuple[int, int]:
    """(available bytes, total bytes) from /proc/meminfo."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("MemTotal:", "MemAvailable:"):
            values[parts[0]] = int(parts[1]) * 1024
    return values.get("MemAvailable:", 0), values.get("MemTotal:", 0)


def parse_cpu_times(text: str) -> tuple[int, int]:
    """(busy jiffies, total jiffies) from the first line of /proc/stat."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            f = [int(x) for x in line.split()[1:]]
            idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
            total = sum(f[:8])  # guest time is already counted in user
            return total - idle, total
    return 0, 0


def parse_statm_rss(text: str, page_bytes: int) -> int:
    """Resident bytes from /proc/<pid>/statm (its second field, in pages); 0 if unreadable."""
    parts = text.split()
    return int(parts[1]) * page_bytes if len(parts) > 1 and parts[1].isdigit() else 0


def host_memory(proc: str = "/proc") -> tuple[int, int]:
    """(available bytes, total bytes) of the host: psutil when installed, else /proc/meminfo."""
    try:
        import psutil
    except ImportError:
        return parse_meminfo(_read(os.path.join(proc, "meminfo")))
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def process_memory(proc: str = "/proc") -> dict[str, int]:
    """This process's resident bytes and its host's available and total bytes; the fields it
    could not read are left out."""
    try:
        import psutil
    except ImportError:
        page = os.sysconf("SC_PAGE_SIZE")
        rss = parse_statm_rss(_read(os.path.join(proc, "self", "statm")), page)
    else:
        rss = int(psutil.Process().memory_info().rss)
    avail, total = host_memory(proc)
    out = {"rss_bytes": rss} if rss else {}
    if total:
        out["mem_available_bytes"], out["mem_total_bytes"] = avail, total
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class HostSampler:
    """Host statistics between consecutive ``sample()`` calls."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._last: (
            tuple[float, dict[str, DiskCounters], dict[str, tuple[int, int]], tuple[int, int]]
            | None
        ) = None

    def _snapshot(
        self, now: float
    ) -> tuple[float, dict[str, DiskCounters], dict[str, tuple[int, int]], tuple[int, int]]:
        return (
            now,
            parse_diskstats(_read(os.path.join(self.proc, "diskstats"))),
            parse_net_dev(_read(os.path.join(self.proc, "net", "dev"))),
            parse_cpu_times(_read(os.path.join(self.proc, "stat"))),
        )

    def totals(self) -> tuple[dict[str, DiskCounters], dict[str, tuple[int, int]]] | None:
        """The cumulative disk counters and (rx, tx) bytes per interface of the last sample."""
        last = self._last
        return None if last is None else (last[1], last[2])

    def sample(self, now: float) -> dict[str, Any]:
        snap = self._snapshot(now)
        out: dict[str, Any] = {}
        avail, total = host_memory(self.proc)
        if total:
            out["mem_available_bytes"], out["mem_total_bytes"] = avail, total
        last, self._last = self._last, snap
        if last is not None:
            dt = snap[0] - last[0]
            busy = snap[3][0] - last[3][0]
            total = snap[3][1] - last[3][1]
            if total > 0:
                out["cpu_percent"] = max(0.0, min(100.0, 100.0 * busy / total))
            out["disks"] = disk_rates(last[1], snap[1], dt)
            out["nets"] = net_rates(last[2], snap[2], dt)
        return out
