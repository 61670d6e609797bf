"""The report's node figures: every hardware statistic the producer collects, against time.

Pure functions of a ``RunData`` like ``report_figures``: GPU power, temperature, PCIe, memory
bandwidth (with the source of each GPU's figure), XID/ECC errors and clock throttle reasons;
disk throughput and I/O latency, network throughput and inter-rank communication latency.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from steplens.schema import THROTTLE_REASONS
from steplens.sinks.report_data import RunData
from steplens.sinks.report_plot import alert_line, nothing

# Thresholds of the stream jobs (stream_jobs/.../signals/thresholds.py, ThresholdConfig),
# drawn as dashed lines as on the hardware board where no stored signal says the worker's own.
COMM_LATENCY_MS = 50.0
DISK_LATENCY_MS = 10.0


def _lines(ax: Any, frame: pd.DataFrame, keys: list[str], fields: dict[str, str]) -> bool:
    """One line per device and field (label: device, field); whether anything was drawn."""
    drawn = False
    if frame.empty or not set(keys) <= set(frame.columns):
        return False
    for ident, df in frame.sort_values("time").groupby(keys):
        name = "/".join(str(k) for k in (ident if isinstance(ident, tuple) else (ident,)))
        for field, label in fields.items():
            if field in df.columns:
                values = pd.to_numeric(df[field], errors="coerce")
                if values.notna().any():
                    ax.plot(df["time"], values, lw=1, label=f"{name} {label}")
                    drawn = True
    return drawn


def _finish(fig: Any, axes: list[Any], drawn: list[bool], empty: str) -> Any:
    for ax, ok in zip(axes, drawn, strict=True):
        ax.grid(alpha=0.3)
        if not ok:
            nothing(ax, empty)
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def _memory_bandwidth(gpu: pd.DataFrame) -> pd.DataFrame:
    """``mem_bw_util`` as ``bw_gpm`` or ``bw_util`` by its source (samples of producers that
    predate GPM carry only ``util_mem``: the coarse counter)."""
    if gpu.empty:
        return gpu
    value = gpu["mem_bw_util"] if "mem_bw_util" in gpu.columns else gpu.get("util_mem")
    if value is None:
        return gpu
    source = gpu["mem_bw_source"] if "mem_bw_source" in gpu.columns else "util"
    source = pd.Series(source, index=gpu.index).fillna("util")
    return gpu.assign(bw_gpm=value.where(source == "gpm"), bw_util=value.where(source != "gpm"))


def _throttle(ax: Any, gpu: pd.DataFrame) -> bool:
    """A row per throttle reason: a mark at each sample whose NVML mask has that bit."""
    if gpu.empty or "throttle_reasons" not in gpu.columns:
        return False
    masks = pd.to_numeric(gpu["throttle_reasons"], errors="coerce").fillna(0).astype("int64")
    drawn = False
    for bit in range(len(THROTTLE_REASONS)):
        hit = (masks & (1 << bit)) != 0
        if hit.any():
            ax.scatter(gpu.loc[hit, "time"], [bit] * int(hit.sum()), s=6, marker="|")
            drawn = True
    ax.set_yticks(range(len(THROTTLE_REASONS)))
    ax.set_yticklabels(THROTTLE_REASONS, fontsize=7)
    ax.set_ylim(-0.5, len(THROTTLE_REASONS) - 0.5)
    return drawn


def fig_gpu_node(data: RunData) -> Any:
    """Power and temperature, PCIe, memory bandwidth, XID/ECC errors, throttle reasons."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(10, 12), sharex=True)
    gpu, keys = data.gpu, ["host", "gpu"]
    ax_power, ax_pcie, ax_bw, ax_err, ax_thr = axes
    ax_temp = ax_power.twinx()
    drawn = [
        _lines(ax_power, gpu, keys, {"power_w": "power W"})
        | _lines(ax_temp, gpu, keys, {"temp_c": "temp °C"}),
        _lines(ax_pcie, gpu, keys, {"pcie_tx_mb_s": "tx", "pcie_rx_mb_s": "rx"}),
        _lines(
            ax_bw,
            _memory_bandwidth(gpu),
            keys,
            {"bw_gpm": "DRAM bandwidth (GPM)", "bw_util": "memory util (NVML, coarse)"},
        ),
        _lines(
            ax_err,
            gpu,
            keys,
            {"xid_count": "XID", "ecc_uncorrected": "ECC uncorr.", "ecc_corrected": "ECC corr."},
        ),
        _throttle(ax_thr, gpu),
    ]
    ax_power.set(title="GPU power (W, solid) and temperature (°C, dashed)", ylabel="W")
    for line in ax_temp.get_lines():
        line.set_linestyle("--")
    ax_temp.set_ylabel("°C")
    if ax_temp.get_legend_handles_labels()[0]:
        ax_temp.legend(loc="upper left", fontsize=7)
    ax_pcie.set(title="PCIe throughput (MB/s)", ylabel="MB/s")
    ax_bw.set(
        title="Memory bandwidth (% of peak: GPM's DRAM bandwidth where the GPU has it, "
        "else NVML's memory utilisation)",
        ylabel="%",
        ylim=(0, 105),
    )
    ax_err.set(title="XID and ECC errors (counts)", ylabel="count")
    ax_thr.set_title("Clock throttle reasons (a mark per sample with the reason set)")
    return _finish(fig, list(axes), drawn, "no GPU samples")


def _comm(ax: Any, comm: pd.DataFrame) -> bool:
    if comm.empty or not {"latency_ms", "time_ns"} <= set(comm.columns):
        return False
    frame = comm.assign(time=pd.to_datetime(comm["time_ns"], unit="ns", utc=True))
    frame = frame.assign(op=frame.get("op", "probe"))
    return _lines(ax, frame, ["rank", "op"], {"latency_ms": "ms"})


def fig_io(data: RunData) -> Any:
    """Disk throughput and latency, network throughput, inter-rank communication latency."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    ax_disk, ax_lat, ax_net, ax_comm = axes
    host_dev, host_if = ["host", "device"], ["host", "iface"]
    drawn = [
        _lines(ax_disk, data.disks, host_dev, {"read_mb_s": "read", "write_mb_s": "write"}),
        _lines(ax_lat, data.disks, host_dev, {"io_latency_ms": "latency"}),
        _lines(ax_net, data.nets, host_if, {"rx_mb_s": "rx", "tx_mb_s": "tx"}),
        _comm(ax_comm, data.comm),
    ]
    ax_disk.set(title="Disk throughput (MB/s)", ylabel="MB/s")
    disk = alert_line(data.signals, "threshold", "disk_io_latency_ms", DISK_LATENCY_MS, "upper")
    comm = alert_line(data.signals, "threshold", "comm_latency_ms", COMM_LATENCY_MS, "upper")
    ax_lat.axhline(disk, ls="--", color="#e45756", lw=1, label="alert line")
    ax_lat.set(title=f"Disk I/O latency (ms per request; alert above {disk:g} ms)")
    ax_net.set(title="Network throughput (MB/s)", ylabel="MB/s")
    ax_comm.axhline(comm, ls="--", color="#e45756", lw=1, label="alert line")
    ax_comm.set(
        title=f"Inter-rank communication latency (ms; alert above {comm:g} ms)",
        ylabel="ms",
    )
    return _finish(fig, list(axes), drawn, "no samples")
