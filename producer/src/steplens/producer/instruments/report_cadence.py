"""When a hardware sample or a health reading is sent: every ``every_s`` seconds, and at once
when it holds news against the last one sent, then its next ``follow`` samples too.

The sampler reads NVML, the host and the allocator every second, and each rank reads its own
health every few seconds; sending every reading of every node and rank made them most of a
wide run's records, points in InfluxDB and the worker's time (bench/RESULTS.md), for
readings that repeat the last one. What the stream jobs judge at once is news and goes at
once:

- ``allocator_news``: a rank's own allocator figures: its devices, or the allocator retried a
  cudaMalloc or raised an out-of-memory error; ``allocator_moved``, at most every 5 s: its
  high-water mark rose by 0.1 % of the limit (``PEAK_RISE``: a leak's samples come as it
  grows) or its reserved memory moved past its band;
- ``health_news``: a rank's health: a dropped or error count or the spool changed, or the
  process's resident memory or its host's available memory moved past its band
  (``HEALTH_BANDS``);
- ``node_news``: a node's sample (local rank 0): the GPUs present or NVML's status; any GPU's
  error counters (ECC, XID), throttle reasons or allocator counters; a GPU's temperature,
  utilisation or memory (``GPU_BANDS``), the host's memory (``HOST_BANDS``), a network's rate
  (``NET_BAND``) or a disk's latency moved past its band since the last sample sent.

A node's sample with the slow fields (PCIe, energy, read every ``hw_slow_every`` samples) is
sent too (``has_slow_fields``), without the follow.

The ``follow`` samples after news let the checks that want a breach sustained for a few
samples (low utilisation, memory share: 3) confirm it as fast as at every sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from steplens.producer.instruments.allocator import LIMIT, OOMS, PEAK, RESERVED, RETRIES

Sample = Mapping[str, Any]
# a field's band: (the field it is a share of, None: in its own units; the band)
Bands = dict[str, tuple[str | None, float]]

# a GPU's fields whose every change is news
GPU_STATES = (
    "ecc_corrected",
    "ecc_uncorrected",
    "xid_count",
    "xid_last",
    "throttle_reasons",
    RETRIES,
    OOMS,
)
# a GPU's levels, news once they moved by their band since the sample last sent: those the
# stream jobs judge sample by sample (a temperature limit, utilisation low for 3 samples) and
# the memory. Power and clocks are not: they swing with every step on a busy GPU, only their
# minute means are judged (``baseline``), and a clock held down shows as a throttle reason.
GPU_BANDS: Bands = {
    "temp_c": (None, 3.0),
    "util_gpu": (None, 15.0),
    "mem_used_bytes": ("mem_total_bytes", 0.02),
    RESERVED: (LIMIT, 0.02),
    PEAK: (LIMIT, 0.02),
}
HOST_BANDS: Bands = {"mem_available_bytes": ("mem_total_bytes", 0.02)}
# a rank's allocator: its high-water mark risen by this share of the limit (a healthy run's
# stays where its first steps left it; a leak's climbs), at most every ``ALLOCATOR_GAP_S``
PEAK_RISE = 0.001
RESERVED_BAND: Bands = {RESERVED: GPU_BANDS[RESERVED]}  # ... or its reserved memory moved
ALLOCATOR_GAP_S = 5.0  # the stream jobs keep an allocator sample at most this often
# a process's memory against its host's: its own by 0.5 % (a leak's samples come as it grows)
HEALTH_BANDS: Bands = {"rss_bytes": ("mem_total_bytes", 0.005), **HOST_BANDS}
HEALTH_COUNTS = ("dropped", "errors", "spooled", "replayed")
NET_BAND = 0.5  # a network's receive or send rate halved or doubled ...
NET_FLOOR_MB_S = 1.0  # ... from or to at least this much
DISK_LATENCY_MS = 5.0  # a disk's I/O latency moved by this much
SLOW_FIELD = "energy_j"  # present in the samples that read the slow fields
FOLLOW = 3  # samples sent after news (the stream jobs' sustained checks count 3)


class ReportCadence:
    """``due(sample, now_s)``: whether to send this sample (``news(last sent, sample)``, the
    ``every_s`` heartbeat, one of the ``follow`` samples after news, or ``kept(sample)``);
    ``every_s`` 0: every sample. ``level_news(last sent, sample)``: news too, once ``gap_s``
    passed since the last sample sent (a level that moves at every sample is then sent as
    often as the stream jobs keep it, never more). The first heartbeat after the first sample
    comes ``phase`` of ``every_s`` early (a rank's ``Identity.phase``: a wide run's ranks, which
    start together, keep their heartbeats apart)."""

    def __init__(
        self,
        every_s: float,
        news: Callable[[Any, Any], bool],
        follow: int = 0,
        *,
        kept: Callable[[Any], bool] = lambda sample: False,
        level_news: Callable[[Any, Any], bool] = lambda last, now: False,
        gap_s: float = 0.0,
        phase: float = 0.0,
    ) -> None:
        self.every_s = every_s
        self.phase = phase
        self.news = news
        self.follow = follow
        self.kept = kept
        self.level_news = level_news
        self.gap_s = gap_s
        self._sent_s = 0.0
        self._early_s = 0.0  # how much earlier than ``every_s`` the next heartbeat comes
        self._last: Any = None  # the sample last sent (None: the next one is sent)
        self._following = 0

    def due(self, sample: Any, now_s: float) -> bool:
        last = self._last
        if last is not None and (
            self.news(last, sample)
            or (now_s - self._sent_s >= self.gap_s and self.level_news(last, sample))
        ):
            self._following = self.follow
        elif self._following > 0:
            self._following -= 1
        elif (
            last is not None
            and now_s - self._sent_s < self.every_s - self._early_s
            and not self.kept(sample)
        ):
            return False
        self._early_s = self.phase * self.every_s if last is None else 0.0
        self._sent_s, self._last = now_s, sample
        return True


def allocator_cadence(every_s: float, phase: float = 0.0) -> ReportCadence:
    """A rank's own allocator figures' cadence (``hw_allocator_every_s``)."""
    return ReportCadence(
        every_s,
        allocator_news,
        level_news=allocator_moved,
        gap_s=ALLOCATOR_GAP_S,
        phase=phase,
    )


def allocator_news(last: Sample, now: Sample) -> bool:
    return _counters(last) != _counters(now)


def allocator_moved(last: Sample, now: Sample) -> bool:
    """A rank's allocator's high-water mark rose past its band, or its reserved memory moved
    past its own (``allocator_news`` first: the same devices)."""
    for g, b in zip(now.get("gpus") or [], last.get("gpus") or [], strict=False):
        limit = g.get(LIMIT)
        if not limit:
            continue
        peak, before = g.get(PEAK), b.get(PEAK)
        if peak is not None and before is not None and peak - before >= PEAK_RISE * limit:
            return True
        if _moved(g, b, RESERVED_BAND):
            return True
    return False


def health_news(last: Sample, now: Sample) -> bool:
    return any(now.get(k) != last.get(k) for k in HEALTH_COUNTS) or _moved(now, last, HEALTH_BANDS)


def _counters(sample: Sample) -> list[tuple[Any, ...]]:
    return [(e.get("index"), e.get(RETRIES), e.get(OOMS)) for e in sample.get("gpus") or []]


def node_news(last: Sample, now: Sample) -> bool:
    if now.get("gpu_status") != last.get("gpu_status"):
        return True
    gpus, before = now.get("gpus") or [], last.get("gpus") or []
    if [g.get("index") for g in gpus] != [g.get("index") for g in before]:
        return True
    for g, b in zip(gpus, before, strict=True):
        if any(g.get(k) != b.get(k) for k in GPU_STATES):
            return True
        if _moved(g, b, GPU_BANDS):
            return True
    return _moved(now, last, HOST_BANDS) or _host_io_moved(now, last)


def has_slow_fields(sample: Sample) -> bool:
    return any(SLOW_FIELD in g for g in sample.get("gpus") or [])


def _moved(now: Sample, last: Sample, bands: Bands) -> bool:
    for key, (total_key, band) in bands.items():
        x, y = now.get(key), last.get(key)
        if x is None or y is None:
            if (x is None) != (y is None):
                return True
            continue
        scale = 1.0 if total_key is None else now.get(total_key)
        if scale and abs(x - y) >= band * scale:
            return True
    return False


def _host_io_moved(now: Sample, last: Sample) -> bool:
    before = {n.get("iface"): n for n in last.get("nets") or []}
    for net in now.get("nets") or []:
        b = before.get(net.get("iface"))
        if b is None:
            return True
        for key in ("rx_mb_s", "tx_mb_s"):
            x, y = net.get(key) or 0.0, b.get(key) or 0.0
            if max(x, y) >= NET_FLOOR_MB_S and abs(x - y) >= NET_BAND * max(x, y):
                return True
    disks = {d.get("device"): d for d in last.get("disks") or []}
    for disk in now.get("disks") or []:
        d = disks.get(disk.get("device"))
        if d is None:
            return True
        x, y = disk.get("io_latency_ms") or 0.0, d.get("io_latency_ms") or 0.0
        if abs(x - y) >= DISK_LATENCY_MS:
            return True
    return False
