"""The node exporter: a node's newest hardware sample as Prometheus metrics (opt-in).

Local rank 0 of a node, which runs the hardware sampler, serves its samples on
``exporter_host:exporter_port`` (``STEPLENS_EXPORTER_PORT``, default 0: off; host
127.0.0.1 unless set, e.g. 0.0.0.0 on a cluster whose Prometheus scrapes the nodes). A scrape
reads the newest sample the sampler already took: it never calls NVML and never touches the
training thread. Names follow the exporters a team already scrapes, so its dashboards and
rules read steplens's nodes unchanged:

- per GPU, the DCGM exporter's (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED`` in MiB,
  ``DCGM_FI_DEV_POWER_USAGE`` in W, ``DCGM_FI_DEV_XID_ERRORS`` = the last XID code, ...) with
  its labels ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``; all typed gauge (the
  DCGM exporter types its energy and ECC totals as counters without the ``_total`` suffix
  Prometheus's client requires of a counter);
- per host, node_exporter's (``node_memory_MemAvailable_bytes``, ``node_disk_read_bytes_total``,
  ``node_network_receive_bytes_total``, ... with label ``device``);
- what neither has under the ``steplens_`` prefix: every XID counted
  (``steplens_gpu_xid_errors_total``; the DCGM metric keeps only the last code), memory
  bandwidth with its source (``steplens_gpu_mem_bw_util_percent{source="gpm"|"util"}``), the
  host's CPU share, the sample's time, and ``steplens_node_info`` (run id, GPU status).

Served by ``prometheus_client`` (the ``exporter`` extra: pure Python, no dependencies). A port
already taken (a second job on the node) logs a warning and training goes on without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from steplens.producer.instruments.host_stats import SECTOR_BYTES

log = logging.getLogger("steplens")

MIB = 1 << 20
# hw GPU field -> (DCGM exporter name, help, scale to the DCGM unit)
DCGM_FIELDS: Mapping[str, tuple[str, str, float]] = {
    "util_gpu": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 1.0),
    "util_mem": ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 1.0),
    "mem_used_bytes": ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 1 / MIB),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", 1.0),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 1.0),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1.0),
    "throttle_reasons": (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Current clock throttle reasons (NVML bitmask).",
        1.0,
    ),
    "ecc_corrected": (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        1.0,
    ),
    "ecc_uncorrected": (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        1.0,
    ),
    "energy_j": (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        1000.0,
    ),
    "pcie_tx_mb_s": ("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe transmitted bytes per second.", 1e6),
    "pcie_rx_mb_s": ("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe received bytes per second.", 1e6),
}
# read at every ``hw_slow_every``-th sample only: the newest value stands until the next
SLOW_FIELDS = ("pcie_tx_mb_s", "pcie_rx_mb_s", "energy_j")
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")


class NodeCollector:
    """The newest sample, as metric families (``prometheus_client``'s collector protocol).

    ``update`` runs on the sampler's thread and replaces the state in one assignment;
    ``collect`` runs on a scrape's thread and reads it: no lock, no NVML."""

    def __init__(self, run_id: str, host: str) -> None:
        self.run_id = run_id
        self.host = host
        self._state: tuple[float, dict[str, Any], dict[int, dict[str, Any]], Any] | None = None

    def update(self, data: dict[str, Any], totals: Any = None) -> None:
        """A new ``hw`` sample (and the host's cumulative counters, ``HostSampler.totals``)."""
        old = self._state[2] if self._state is not None else {}
        gpus: dict[int, dict[str, Any]] = {}
        for entry in data.get("gpus") or []:
            index = int(entry.get("index", len(gpus)))
            kept = {k: old[index][k] for k in SLOW_FIELDS if k in old.get(index, {})}
            gpus[index] = {**kept, **entry}
        host = {k: v for k, v in data.items() if k != "gpus"}
        self._state = (time.time(), host, gpus, totals)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state = self._state
        info = GaugeMetricFamily(
            "steplens_node_info",
            "The steplens run this node's exporter belongs to (value 1).",
            labels=["run_id", "Hostname", "gpu_status"],
        )
        status = str(state[1].get("gpu_status", "")) if state is not None else "no_sample"
        info.add_metric([self.run_id, self.host, status], 1.0)
        yield info
        if state is None:
            return
        at, host, gpus, totals = state
        yield GaugeMetricFamily(
            "steplens_node_sample_timestamp_seconds",
            "When the newest hardware sample was taken (Unix time).",
            value=at,
        )
        yield from self._gpu_families(gpus, GaugeMetricFamily, CounterMetricFamily)
        yield from _host_families(host, totals, GaugeMetricFamily, CounterMetricFamily)

    def _gpu_families(self, gpus: dict[int, dict[str, Any]], gauge: Any, counter: Any) -> Any:
        families = {
            field: gauge(name, help_, labels=list(GPU_LABELS))
            for field, (name, help_, _) in DCGM_FIELDS.items()
        }
        free = gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=GPU_LABELS)
        xid = gauge(
            "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=GPU_LABELS
        )
        dram = gauge(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active (GPM DRAM bandwidth).",
            labels=GPU_LABELS,
        )
        bandwidth = gauge(
            "steplens_gpu_mem_bw_util_percent",
            'Memory bandwidth utilisation (in %): source "gpm" is GPM\'s DRAM bandwidth, '
            '"util" the coarse share of time the memory controller was busy.',
            labels=[*GPU_LABELS, "source"],
        )
        xids = counter(
            "steplens_gpu_xid_errors",
            "XID critical errors counted since the producer started (every event).",
            labels=GPU_LABELS,
        )
        for index, g in sorted(gpus.items()):
            labels = [
                str(index),
                str(g.get("uuid", "")),
                f"nvidia{index}",
                str(g.get("name", "")),
                self.host,
            ]
            for field, (_, _, scale) in DCGM_FIELDS.items():
                if _number(g.get(field)):
                    families[field].add_metric(labels, float(g[field]) * scale)
            if _number(g.get("mem_used_bytes")) and _number(g.get("mem_total_bytes")):
                free.add_metric(labels, (g["mem_total_bytes"] - g["mem_used_bytes"]) / MIB)
            xid.add_metric(labels, float(g.get("xid_last", 0)))
            xids.add_metric(labels, float(g.get("xid_count", 0)))
            if _number(g.get("mem_bw_util")):
                source = str(g.get("mem_bw_source", "util"))
                bandwidth.add_metric([*labels, source], float(g["mem_bw_util"]))
                if source == "gpm":
                    dram.add_metric(labels, float(g["mem_bw_util"]) / 100.0)
        yield from families.values()
        yield from (free, xid, dram, bandwidth, xids)


def _host_families(host: dict[str, Any], totals: Any, gauge: Any, counter: Any) -> Any:
    for field, name, help_ in (
        (
            "mem_available_bytes",
            "node_memory_MemAvailable_bytes",
            "Memory information field MemAvailable_bytes.",
        ),
        (
            "mem_total_bytes",
            "node_memory_MemTotal_bytes",
            "Memory information field MemTotal_bytes.",
        ),
    ):
        if _number(host.get(field)):
            yield gauge(name, help_, value=float(host[field]))
    if _number(host.get("cpu_percent")):
        yield gauge(
            "steplens_node_cpu_busy_ratio",
            "Share of CPU time not idle between the last two samples, all CPUs.",
            value=float(host["cpu_percent"]) / 100.0,
        )
    if totals is None:
        return
    disks, nets = totals
    for name, help_, value_of in (
        (
            "node_disk_read_bytes",
            "The total number of bytes read successfully.",
            lambda d: d.read_sectors * SECTOR_BYTES,
        ),
        (
            "node_disk_written_bytes",
            "The total number of bytes written successfully.",
            lambda d: d.write_sectors * SECTOR_BYTES,
        ),
        (
            "node_disk_reads_completed",
            "The total number of reads completed successfully.",
            lambda d: d.reads,
        ),
        (
            "node_disk_writes_completed",
            "The total number of writes completed successfully.",
            lambda d: d.writes,
        ),
    ):
        family = counter(name, help_, labels=["device"])
        for device, d in sorted(disks.items()):
            family.add_metric([device], float(value_of(d)))
        yield family
    for name, help_, i in (
        ("node_network_receive_bytes", "Network device statistic receive_bytes.", 0),
        ("node_network_transmit_bytes", "Network device statistic transmit_bytes.", 1),
    ):
        family = counter(name, help_, labels=["device"])
        for device, pair in sorted(nets.items()):
            family.add_metric([device], float(pair[i]))
        yield family


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class NodeExporter:
    """Serves a ``NodeCollector`` over HTTP from a daemon thread of its own."""

    def __init__(self, collector: NodeCollector, host: str, port: int) -> None:
        self.collector = collector
        self.host = host
        self.port = port
        self.server: Any = None
        self._started = threading.Event()

    def start(self) -> None:
        """Bind and serve in a thread (a host name to resolve never holds the caller up)."""
        threading.Thread(target=self._serve, name="steplens-exporter", daemon=True).start()

    def _serve(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server

            registry = CollectorRegistry(auto_describe=False)
            registry.register(self.collector)
            self.server, _ = start_http_server(self.port, addr=self.host, registry=registry)
            self.port = self.server.server_address[1]
        except ImportError:
            log.warning(
                "steplens: STEPLENS_EXPORTER_PORT is set but prometheus_client is missing "
                "(pip install 'steplens-producer[exporter]'); no node exporter"
            )
        except OSError as exc:
            log.warning(
                "steplens: node exporter not started on %s:%s (%s); training goes on",
                self.host,
                self.port,
                exc,
            )
        finally:
            self._started.set()

    def wait_started(self, timeout_s: float = 5.0) -> bool:
        """Whether it serves (for tests and the caller's log)."""
        return self._started.wait(timeout_s) and self.server is not None

    def stop(self) -> None:
        """Stop serving, off the caller's thread (the serve loop polls every 0.5 s)."""
        server, self.server = self.server, None
        if server is not None:
            threading.Thread(target=_close, args=(server,), daemon=True).start()

    def forget_in_child(self) -> None:
        """In a forked child: close the inherited listening socket (the parent keeps its own);
        the serving thread was not inherited."""
        server, self.server = self.server, None
        if server is not None:
            server.socket.close()


def _close(server: Any) -> None:
    server.shutdown()
    server.server_close()


def start_exporter(sampler: Any, run_id: str, hostname: str, host: str, port: int) -> NodeExporter:
    """Serve ``sampler``'s samples (a ``HardwareSampler``) on ``host:port``."""
    collector = NodeCollector(run_id, hostname)
    sampler.listeners.append(lambda data: collector.update(data, sampler.host.totals()))
    exporter = NodeExporter(collector, host, port)
    exporter.start()
    return exporter
