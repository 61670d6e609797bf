"""Memory and network bandwidth beside GPU utilisation, judged: a pure function of a ``RunData``.

A GPU that computes little (utilisation under ``LOW_UTIL`` %) while its memory moves little
(DRAM bandwidth, or NVML's coarse memory utilisation, under ``LOW_MEM_BW`` % of peak) is
waiting for something. Which: if the network is quiet too (under ``LOW_NET_SHARE`` of the
run's own busy level, its 95th percentile: the link's speed is not known), nothing arrives:
the input pipeline; if the network is busy, the ranks are exchanging: the parallel strategy
(communication that the computation does not hide). Each time bin is judged on the means of
its samples over the run's GPUs and interfaces.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pandas as pd

from steplens.sinks.report_data import RunData
from steplens.sinks.report_plot import column, nothing

LOW_UTIL: Final = 40.0  # % GPU utilisation
LOW_MEM_BW: Final = 30.0  # % of peak memory bandwidth
LOW_NET_SHARE: Final = 0.25  # of the run's 95th percentile of network throughput
BINS: Final = 60
BUSY, INPUT, PARALLEL, EITHER = "busy", "input pipeline", "parallel strategy", "input or parallel"
VERDICT_COLOURS: Final = {BUSY: "#54a24b", INPUT: "#e45756", PARALLEL: "#b279a2", EITHER: "#f58518"}


def _binned(frame: pd.DataFrame, values: pd.Series, edges: pd.DatetimeIndex) -> pd.Series:
    """Mean of ``values`` per time bin (labelled by the bin's start)."""
    ok = values.notna() & frame["time"].notna()
    if not ok.any():
        return pd.Series(np.nan, index=edges[:-1])
    cut = pd.cut(frame.loc[ok, "time"], edges, labels=edges[:-1], include_lowest=True)
    per = values[ok].groupby(cut, observed=False).mean()
    return per.reindex(edges[:-1])


def bandwidth_verdict(gpu: pd.DataFrame, nets: pd.DataFrame, bins: int = BINS) -> pd.DataFrame:
    """Per time bin: ``time``, ``util`` (% GPU), ``mem_bw`` (% of peak), ``net_mb_s`` (rx + tx
    of all interfaces of a host, mean over hosts) and ``verdict`` (``BUSY``, ``INPUT``,
    ``PARALLEL``, ``EITHER`` without network samples; None where there is no GPU sample)."""
    cols = ["time", "util", "mem_bw", "net_mb_s", "verdict"]
    times = [f["time"] for f in (gpu, nets) if not f.empty and "time" in f]
    if gpu.empty or not times:
        return pd.DataFrame(columns=cols)
    every = pd.to_datetime(pd.concat(times, ignore_index=True), utc=True).dropna()
    if every.empty:
        return pd.DataFrame(columns=cols)
    lo, hi = every.min(), every.max()
    edges = pd.date_range(lo, hi + pd.Timedelta(milliseconds=1), periods=bins + 1)
    g = gpu.assign(time=pd.to_datetime(gpu["time"], utc=True))
    util = _binned(g, pd.to_numeric(column(g, "util_gpu"), errors="coerce"), edges)
    bw = pd.to_numeric(column(g, "mem_bw_util"), errors="coerce")
    bw = bw.where(bw.notna(), pd.to_numeric(column(g, "util_mem"), errors="coerce"))
    mem_bw = _binned(g, bw, edges)
    net = pd.Series(np.nan, index=edges[:-1])
    if not nets.empty and {"time", "host"} <= set(nets.columns):
        n = nets.assign(time=pd.to_datetime(nets["time"], utc=True))
        flow = pd.to_numeric(column(n, "rx_mb_s"), errors="coerce").fillna(0) + pd.to_numeric(
            column(n, "tx_mb_s"), errors="coerce"
        ).fillna(0)
        per_host = n.assign(flow=flow).groupby(["time", "host"], as_index=False)["flow"].sum()
        net = _binned(per_host, per_host["flow"], edges)
    out = pd.DataFrame(
        {"time": edges[:-1], "util": util.to_numpy(), "mem_bw": mem_bw.to_numpy()}
    ).assign(net_mb_s=net.to_numpy())
    busy_net = np.nanpercentile(out["net_mb_s"], 95) if out["net_mb_s"].notna().any() else np.nan
    starved = (out["util"] < LOW_UTIL) & (out["mem_bw"].isna() | (out["mem_bw"] < LOW_MEM_BW))
    quiet = out["net_mb_s"] <= LOW_NET_SHARE * busy_net
    verdict = np.where(
        ~starved,
        BUSY,
        np.where(out["net_mb_s"].isna(), EITHER, np.where(quiet, INPUT, PARALLEL)),
    )
    out["verdict"] = pd.Series(verdict, index=out.index).where(out["util"].notna(), None)
    return out


def verdict_text(judged: pd.DataFrame) -> str:
    """One sentence: the share of the judged time the GPUs waited, and on what."""
    v = judged["verdict"].dropna() if "verdict" in judged else pd.Series(dtype=object)
    if v.empty:
        return "no GPU samples: bandwidth not judged"
    waiting = v[v != BUSY]
    if waiting.empty:
        return "GPUs busy throughout (no stretch of low utilisation with low bandwidth)"
    cause = waiting.value_counts().index[0]
    return (
        f"GPUs waiting {100 * len(waiting) / len(v):.0f} % of the time, low bandwidth too: "
        f"mostly the {cause}"
    )


def fig_bandwidth(data: RunData) -> Any:
    """GPU utilisation with memory bandwidth, network throughput, and the verdict per bin."""
    import matplotlib.pyplot as plt

    fig, (ax_g, ax_n, ax_v) = plt.subplots(
        3, 1, figsize=(10, 6.4), sharex=True, gridspec_kw={"height_ratios": [2, 2, 0.6]}
    )
    judged = bandwidth_verdict(data.gpu, data.nets)
    text = verdict_text(judged)
    if judged.empty:
        nothing(ax_g, text)
        nets = data.nets
        if not nets.empty and {"time", "rx_mb_s"} <= set(nets.columns):
            for (host, iface), df in nets.sort_values("time").groupby(["host", "iface"]):
                flow = column(df, "rx_mb_s").fillna(0) + column(df, "tx_mb_s").fillna(0)
                ax_n.plot(df["time"], flow, lw=1, label=f"{host}/{iface} rx+tx")
            ax_n.legend(loc="upper right", fontsize=7)
    else:
        ax_g.plot(judged["time"], judged["util"], lw=1.2, color="#4c78a8", label="GPU util %")
        ax_g.plot(
            judged["time"],
            judged["mem_bw"],
            lw=1.2,
            color="#54a24b",
            label="memory bandwidth % of peak",
        )
        ax_g.axhline(LOW_UTIL, color="#4c78a8", ls=":", lw=1, label=f"low util ({LOW_UTIL:g} %)")
        ax_g.axhline(
            LOW_MEM_BW, color="#54a24b", ls=":", lw=1, label=f"low bandwidth ({LOW_MEM_BW:g} %)"
        )
        ax_g.legend(loc="upper right", fontsize=7)
        ax_n.plot(
            judged["time"],
            judged["net_mb_s"],
            lw=1.2,
            color="#b279a2",
            label="network rx+tx per host",
        )
        if judged["net_mb_s"].notna().any():
            busy = np.nanpercentile(judged["net_mb_s"], 95)
            ax_n.axhline(
                LOW_NET_SHARE * busy,
                color="#b279a2",
                ls=":",
                lw=1,
                label=f"quiet ({100 * LOW_NET_SHARE:g} % of the run's 95th pct)",
            )
        ax_n.legend(loc="upper right", fontsize=7)
        width = (judged["time"].iloc[1] - judged["time"].iloc[0]) if len(judged) > 1 else None
        for verdict, colour in VERDICT_COLOURS.items():
            at = judged[judged["verdict"] == verdict]
            if not at.empty and width is not None:
                ax_v.bar(at["time"], 1, width=width, align="edge", color=colour, label=verdict)
        ax_v.legend(loc="upper right", fontsize=7, ncol=4)
    ax_g.set(title=f"GPU utilisation and memory bandwidth: {text}", ylabel="%", ylim=(0, 105))
    ax_n.set(title="Network throughput (MB/s)", ylabel="MB/s")
    ax_v.set_yticks([])
    ax_v.set(title="What the GPUs wait on (per time bin)", xlabel="time (UTC)")
    for ax in (ax_g, ax_n):
        ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig
