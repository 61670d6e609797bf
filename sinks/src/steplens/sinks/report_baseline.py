"""The report's 7-day baseline figure: each series' minutes against the band the stream jobs
judged them by (``baseline`` signals: GPUs, disks, network interfaces, ranks' step time and
tokens/s). Per metric, the series that left its band most often (the worst first)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from steplens.sinks.report_data import RunData
from steplens.sinks.report_plot import nothing

UNITS = {
    "gpu_util": "GPU util %",
    "gpu_temp_c": "GPU °C",
    "gpu_power_w": "GPU W",
    "gpu_mem_used_bytes": "GPU memory used (bytes)",
    "disk_mb_s": "disk MB/s",
    "net_mb_s": "network MB/s",
    "step_time_s": "step time (s)",
    "tokens_per_s": "tokens/s",
}
PER_METRIC = 2  # series drawn per metric at most


def worst(rows: pd.DataFrame, n: int = PER_METRIC) -> list[str]:
    """The scopes with the most minutes outside their band, most first (ties: by name)."""
    outside = (rows["value"] < rows["lower"]) | (rows["value"] > rows["upper"])
    counts = outside.groupby(rows["scope"]).sum()
    order = sorted(counts.index, key=lambda s: (-int(counts[s]), str(s)))
    return [str(s) for s in order[:n]]


def fig_baseline(data: RunData) -> Any:
    import matplotlib.pyplot as plt

    df = data.baselines
    metrics = [m for m in UNITS if not df.empty and (df["metric"] == m).any()]
    fig, axes = plt.subplots(
        max(1, len(metrics)),
        1,
        figsize=(10, 0.6 + 2.2 * max(1, len(metrics))),
        squeeze=False,
        sharex=True,
    )
    if not metrics:
        nothing(axes[0][0], "no baseline signals (a run's first band comes after 32 minutes)")
        return fig
    for ax, metric in zip([a[0] for a in axes], metrics, strict=True):
        rows = df[df["metric"] == metric]
        for scope in worst(rows):
            one = rows[rows["scope"] == scope].sort_values("time")
            kinds = sorted({str(b) for b in one["baseline"].dropna()})
            when = pd.to_datetime(one["time"], utc=True).dt.tz_localize(None)
            (line,) = ax.plot(
                when, one["value"], lw=1, label=f"{scope} ({', '.join(kinds) or '?'})"
            )
            ax.fill_between(
                when,
                one["lower"].to_numpy(dtype=float),
                one["upper"].to_numpy(dtype=float),
                color=line.get_color(),
                alpha=0.18,
                lw=0,
            )
            out = (one["value"] < one["lower"]) | (one["value"] > one["upper"])
            ax.scatter(when[out], one["value"][out], s=10, color="#e45756", zorder=3)
        ax.set_ylabel(UNITS[metric], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    axes[0][0].set_title("Minute means against their band (shaded); red: outside", fontsize=10)
    axes[-1][0].set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig
