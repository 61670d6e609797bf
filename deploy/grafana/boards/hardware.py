"""The hardware board: every GPU, host, disk, network, communication and producer statistic
the producer collects (``producer/src/steplens/producer/{gpu_stats,host_stats,comm}.py``)."""

from __future__ import annotations

from typing import Any

from steplens.schema import THROTTLE_REASONS

from .flux import Read, hot_only, latest, names, per_interval
from .layout import board, panel, right_axis, threshold_line

GPU = ("host", "gpu")
PRODUCER = ("rank", "host")  # one producer per process

# Thresholds of the stream jobs (stream_jobs/.../signals/thresholds.py, ThresholdConfig).
COMM_LATENCY_MS = 50.0
DISK_LATENCY_MS = 10.0
GPU_MEM_PCT = 90.0
# the report's judgement (sinks/.../report_bandwidth.py): waiting below both
LOW_UTIL = 40.0
LOW_MEM_BW = 30.0
WAITING = "waiting: input pipeline or parallel strategy (see the network)"


def gpu(*fields: str) -> Read:
    return Read("gpu", fields, keep=GPU)


def heat(
    title: str, query: str, fields: list[str], unit: str, description: str = ""
) -> dict[str, Any]:
    """One row per node and GPU, colour = value (a heatmap over time)."""
    return panel(
        title,
        "status-history",
        [query],
        fields,
        description=description,
        unit=unit,
        w=24,
        h=7,
        defaults={"min": 0, "max": 100, "color": {"mode": "continuous-GrYlRd"}},
        options={"showValue": "never"},
    )


def baseline_band(metrics: tuple[str, ...], keep: tuple[str, ...] = ("scope", "metric")) -> str:
    """The stream jobs' 7-day baseline signals of ``metrics``: each minute's mean (value) and
    the band it was judged against (expected, lower, upper)."""
    where = " or ".join(f'r.metric == "{m}"' for m in metrics)
    return per_interval(
        Read(
            "signal",
            ("value", "expected", "lower", "upper"),
            where=f'r.name == "baseline" and ({where})',
            keep=keep,
        ),
        "last",
    )


BASELINE_NOTE = (
    "The value (each minute's mean) and the normal range the stream jobs expect of it: a "
    "forecast band from the previous 7 days (ARIMA with a daily cycle where the history shows "
    "one), refitted hourly; a run with less than a day of history is judged by a band of its "
    "own minutes (the signal's detail says which). Ten minutes outside it alert."
)


def _memory_used_pct() -> str:
    return per_interval(
        gpu("mem_used_bytes", "mem_total_bytes"),
        "max",
        after=[
            'pivot(rowKey: ["_time", "host", "gpu"], columnKey: ["_field"], valueColumn: "_value")',
            "filter(fn: (r) => exists r.mem_used_bytes and exists r.mem_total_bytes "
            "and r.mem_total_bytes > 0)",
            'map(fn: (r) => ({_time: r._time, host: r.host, gpu: r.gpu, _field: "mem_used_pct", '
            "_value: 100.0 * r.mem_used_bytes / r.mem_total_bytes}))",
            f"group(columns: {names(('host', 'gpu', '_field'))})",
        ],
    )


def _gpu_waiting() -> str:
    """Per node, GPU and interval: "busy", or waiting (low utilisation with low memory
    bandwidth, or without a bandwidth figure)."""
    waiting = (
        f"r.util_gpu < {LOW_UTIL} and (not exists r.mem_bw_util or r.mem_bw_util < {LOW_MEM_BW})"
    )
    return per_interval(
        gpu("util_gpu", "mem_bw_util"),
        "mean",
        after=[
            'pivot(rowKey: ["_time", "host", "gpu"], columnKey: ["_field"], valueColumn: "_value")',
            "filter(fn: (r) => exists r.util_gpu)",
            'map(fn: (r) => ({_time: r._time, host: r.host, gpu: r.gpu, _field: "gpu_waiting", '
            f'_value: if {waiting} then "{WAITING}" else "busy"}}))',
            f"group(columns: {names(('host', 'gpu', '_field'))})",
        ],
    )


def bandwidth_panels() -> list[dict[str, Any]]:
    """Memory and network bandwidth beside GPU utilisation, and the judgement per GPU."""
    per_host = ("host",)
    return [
        panel(
            "Memory and network bandwidth against GPU utilisation (mean per node)",
            "timeseries",
            [
                per_interval(
                    Read("gpu", ("util_gpu", "mem_bw_util"), keep=per_host),
                    "mean",
                    group=["host", "_field"],
                ),
                per_interval(
                    Read("net", ("rx_mb_s", "tx_mb_s"), keep=per_host),
                    "mean",
                    group=["host", "_field"],
                ),
            ],
            ["util_gpu", "mem_bw_util", "rx_mb_s", "tx_mb_s"],
            description="GPU utilisation and memory bandwidth (% of peak, left) with the "
            "network (MB/s per interface, right). Low utilisation with low memory bandwidth "
            "means the GPUs wait: with a quiet network on the input pipeline (nothing "
            "arrives), with a busy one on the parallel strategy (communication the "
            "computation does not hide).",
            unit="percent",
            w=24,
            overrides=[right_axis({"id": "byFrameRefID", "options": "B"}, "MBs")],
        ),
        panel(
            "GPUs waiting: low utilisation with low memory bandwidth, per node and GPU",
            "state-timeline",
            [_gpu_waiting()],
            ["gpu_waiting"],
            description=f"Per interval: waiting when utilisation is under {LOW_UTIL:g} % and "
            f"memory bandwidth under {LOW_MEM_BW:g} % of peak; the panel above tells the input "
            "pipeline (quiet network) from the parallel strategy (busy network).",
            w=24,
            h=6,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "gpu_waiting"},
                    "properties": [
                        {
                            "id": "mappings",
                            "value": [
                                {
                                    "type": "value",
                                    "options": {
                                        "busy": {"color": "green", "index": 0},
                                        WAITING: {"color": "red", "index": 1},
                                    },
                                }
                            ],
                        }
                    ],
                }
            ],
        ),
    ]


def _throttle_reasons() -> str:
    """The mask of the interval's worst sample, as names (a higher bit is a harder limit)."""
    parts = " + ".join(
        f'(if bitwise.sand(a: mask, b: {1 << i}) != 0 then "{n}, " else "")'
        for i, n in enumerate(THROTTLE_REASONS)
    )
    decode = (
        'reasons = (mask) => if mask == 0 then "none"\n'
        f'  else strings.trimSuffix(v: {parts}, suffix: ", ")'
    )
    return per_interval(
        gpu("throttle_reasons"),
        "max",
        after=["map(fn: (r) => ({r with _value: reasons(mask: int(v: r._value))}))"],
        imports=["bitwise"],
        defs=decode,
    )


def _producer_backlog() -> list[str]:
    counts = Read(
        "producer_health",
        ("queue_len", "spooled", "replayed"),
        pattern="(dropped|error)_.+",
        keep=PRODUCER,
    )
    spool = Read("producer_health", ("spool_bytes",), keep=PRODUCER)
    return [per_interval(counts, "max"), per_interval(spool, "max")]


def hardware() -> dict[str, Any]:
    panels = [
        heat(
            "GPU utilisation per node and GPU",
            per_interval(gpu("util_gpu"), "mean"),
            ["util_gpu"],
            "percent",
            "One row per node/GPU; colour = utilisation (a heatmap over time).",
        ),
        heat(
            "GPU memory used per node and GPU",
            _memory_used_pct(),
            ["mem_used_pct"],
            "percent",
            f"Peak per interval; the stream jobs alert above {GPU_MEM_PCT:g} %.",
        ),
        heat(
            "GPU memory bandwidth utilisation per node and GPU",
            per_interval(gpu("mem_bw_util"), "mean"),
            ["mem_bw_util"],
            "percent",
            "DRAM bandwidth in use, in percent of the peak, from NVML's GPM where the GPU has "
            "it (Hopper and later); elsewhere the coarse utilization.memory, the share of time "
            "the memory controller was busy at all. The next panel says which each GPU reports.",
        ),
        panel(
            "GPU memory bandwidth: source per node and GPU (last hour)",
            "table",
            [
                hot_only(
                    gpu("mem_bw_source"),
                    [
                        "last()",
                        'keep(columns: ["_time", "host", "gpu", "_field", "_value"])',
                        "group()",
                    ],
                )
            ],
            ["mem_bw_source"],
            description='"gpm": DRAM bandwidth measured by GPM between two samples; "util": '
            "NVML's utilization.memory (GPUs without GPM). Text is kept in the hot bucket only.",
            hot_only=["mem_bw_source"],
            w=24,
            h=5,
        ),
        panel(
            "GPU utilisation against its 7-day baseline (per node and GPU)",
            "timeseries",
            [baseline_band(("gpu_util",), keep=("scope",))],
            ["value", "expected", "lower", "upper"],
            unit="percent",
            description=BASELINE_NOTE,
        ),
        panel(
            "GPU temperature, power and memory used against their 7-day baselines",
            "timeseries",
            [baseline_band(("gpu_temp_c", "gpu_power_w", "gpu_mem_used_bytes"))],
            ["value", "expected", "lower", "upper"],
            description=BASELINE_NOTE,
        ),
        panel(
            "Disk and network throughput against their 7-day baselines (MB/s)",
            "timeseries",
            [baseline_band(("disk_mb_s", "net_mb_s"))],
            ["value", "expected", "lower", "upper"],
            description="Per disk (read + write) and network interface (rx + tx). " + BASELINE_NOTE,
        ),
        panel(
            "GPU temperature and power (max per interval)",
            "timeseries",
            [per_interval(gpu("temp_c", "power_w"), "max")],
            ["temp_c", "power_w"],
        ),
        panel(
            "GPU SM clock (min per interval: throttling shows as dips)",
            "timeseries",
            [per_interval(gpu("sm_clock_mhz"), "min")],
            ["sm_clock_mhz"],
            unit="rotmhz",
        ),
        panel(
            "GPU clock throttle reasons",
            "state-timeline",
            [_throttle_reasons()],
            ["throttle_reasons"],
            description="Per interval, the reasons of its most limiting sample (the highest "
            "bit of NVML's mask: HW power brake > HW thermal > SW thermal > sync boost > HW "
            "slowdown > SW power cap).",
        ),
        panel(
            "GPU XID and ECC errors (counts, max per interval)",
            "timeseries",
            [per_interval(gpu("xid_count", "ecc_corrected", "ecc_uncorrected"), "max")],
            ["xid_count", "ecc_corrected", "ecc_uncorrected"],
            description="XID critical errors counted by the producer since it started (every "
            "event); ECC errors as the volatile NVML counters (since the driver loaded). A step "
            "up is a new error.",
            defaults={"custom": {"drawStyle": "line", "lineInterpolation": "stepAfter"}},
        ),
        panel(
            "GPU last XID code",
            "stat",
            [latest(gpu("xid_last"))],
            ["xid_last"],
            description="The code of the newest XID critical error per GPU (e.g. 79: fallen "
            "off the bus, 48: double-bit ECC).",
            defaults={"decimals": 0},
        ),
        panel(
            "GPU PCIe throughput (MB/s)",
            "timeseries",
            [per_interval(gpu("pcie_tx_mb_s", "pcie_rx_mb_s"), "mean")],
            ["pcie_tx_mb_s", "pcie_rx_mb_s"],
            description="Read at every 10th hardware sample (NVML takes about 20 ms to measure).",
        ),
        panel(
            "GPU energy (counter since the driver loaded)",
            "timeseries",
            [per_interval(gpu("energy_j"), "last")],
            ["energy_j"],
            unit="joule",
            description="The rise over a range is the energy used in it.",
        ),
        panel(
            "Host CPU",
            "timeseries",
            [per_interval(Read("host", ("cpu_percent",), keep=("host",)), "mean")],
            ["cpu_percent"],
            unit="percent",
        ),
        panel(
            "Host memory available (min per interval)",
            "timeseries",
            [per_interval(Read("host", ("mem_available_bytes",), keep=("host",)), "min")],
            ["mem_available_bytes"],
            unit="bytes",
        ),
        panel(
            "Disk throughput per node and device (MB/s)",
            "timeseries",
            [
                per_interval(
                    Read("disk", ("read_mb_s", "write_mb_s"), keep=("host", "device")), "mean"
                )
            ],
            ["read_mb_s", "write_mb_s"],
        ),
        panel(
            "Disk I/O latency per node and device (ms per request, max per interval)",
            "timeseries",
            [per_interval(Read("disk", ("io_latency_ms",), keep=("host", "device")), "max")],
            ["io_latency_ms"],
            unit="ms",
            description=f"The stream jobs alert above {DISK_LATENCY_MS:g} ms (dashed line).",
            defaults=threshold_line(DISK_LATENCY_MS),
        ),
        panel(
            "Network throughput per node and interface (MB/s)",
            "timeseries",
            [per_interval(Read("net", ("rx_mb_s", "tx_mb_s"), keep=("host", "iface")), "mean")],
            ["rx_mb_s", "tx_mb_s"],
        ),
        panel(
            "Inter-rank communication latency (max per interval)",
            "timeseries",
            [per_interval(Read("comm", ("latency_ms",), keep=("rank", "op", "peer")), "max")],
            ["latency_ms"],
            unit="ms",
            description="The producer's probe: a tiny all_reduce and a ring send/recv, timed per "
            f"rank. The stream jobs alert above {COMM_LATENCY_MS:g} ms (dashed line).",
            defaults=threshold_line(COMM_LATENCY_MS),
        ),
        panel(
            "Step time per rank (stragglers)",
            "status-history",
            [per_interval(Read("step", ("step_time_s",), keep=("rank",)), "max")],
            ["step_time_s"],
            unit="s",
            w=24,
            defaults={"color": {"mode": "continuous-GrYlRd"}},
            options={"showValue": "never"},
        ),
        panel(
            "Producer health: records sent per rank and node",
            "timeseries",
            [per_interval(Read("producer_health", ("sent",), keep=PRODUCER), "last")],
            ["sent"],
        ),
        panel(
            "Producer health: queue, spool and losses per rank and node (max per interval)",
            "timeseries",
            _producer_backlog(),
            ["queue_len", "spooled", "replayed", "spool_bytes", "dropped_queue_full", "error_hw"],
            description="Counters since the producer started: records spooled to disk while "
            "Kafka was away and replayed since, records dropped by reason (dropped_*), errors by "
            "place (error_*). Anything but flat zero lines deserves a look.",
            overrides=[right_axis({"id": "byFrameRefID", "options": "B"}, "bytes")],
        ),
        panel(
            "GPU sampler status per node (last hour)",
            "table",
            [
                hot_only(
                    Read("host", ("gpu_status",)),
                    ["last()", 'keep(columns: ["_time", "host", "_field", "_value"])', "group()"],
                )
            ],
            ["gpu_status"],
            description='Why GPU panels may be empty: "ok", "no_nvml", "no_gpu" or the NVML '
            "error. Text is kept in the hot bucket only.",
            hot_only=["gpu_status"],
        ),
        *bandwidth_panels(),
    ]
    return board("steplens-hardware", "steplens: hardware", panels)
