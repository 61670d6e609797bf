"""The report's figures: pure functions of a ``RunData`` (no store, no stack needed).

Each returns a matplotlib figure; ``FIGURES`` names them with their titles, in page order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from steplens.sinks.report_bandwidth import fig_bandwidth
from steplens.sinks.report_baseline import fig_baseline
from steplens.sinks.report_data import RunData
from steplens.sinks.report_figures_data import fig_clipping, fig_eval, fig_layers, fig_lengths
from steplens.sinks.report_incidents import run_incidents
from steplens.sinks.report_node import fig_gpu_node, fig_io
from steplens.sinks.report_plot import column, first_rank, log_scale_if_wide
from steplens.sinks.report_quality import fig_data_quality, fig_loss_noise

__all__ = ["FIGURES", "column", "declared_lr", "first_rank"]

SEVERITY_COLOURS = {"info": "#4c78a8", "warning": "#f58518", "critical": "#e45756"}
SEVERITY_LEVEL = {"info": 0, "warning": 1, "critical": 2}
# incidents drawn on the gradient-norm figure: those with a member of these rules
GRAD_TOPICS = ("grad", "spike", "lr", "clipping", "vanishing", "nonfinite")


def declared_lr(schedule: dict[str, Any], steps: np.ndarray) -> np.ndarray:
    """The learning rate a declared schedule asks for at each step (linear warm-up first)."""
    kind = str(schedule.get("kind", "constant"))
    peak = float(schedule.get("peak_lr", schedule.get("lr", math.nan)))
    floor = float(schedule.get("min_lr", 0.0))
    warmup = int(schedule.get("warmup_steps", 0))
    total = int(schedule.get("total_steps", max(1, int(steps.max(initial=1)))))
    s = steps.astype(float)
    progress = np.clip((s - warmup) / max(1, total - warmup), 0.0, 1.0)
    if kind == "cosine":
        lr = floor + 0.5 * (peak - floor) * (1 + np.cos(np.pi * progress))
    elif kind == "linear":
        lr = peak + (floor - peak) * progress
    elif kind == "step":
        gamma = float(schedule.get("gamma", 0.1))
        milestones = np.asarray(schedule.get("milestones", []), dtype=float)
        lr = peak * gamma ** (s[:, None] >= milestones[None, :]).sum(axis=1)
    else:
        lr = np.full_like(s, peak)
    if warmup > 0:
        lr = np.where(s < warmup, peak * (s + 1) / warmup, lr)
    return np.asarray(lr, dtype=float)


def _mark_alerts(ax: Any, data: RunData) -> None:
    """A dashed line where each incident opened, coloured by its peak severity."""
    for inc in run_incidents(data).itertuples(index=False):
        if math.isfinite(inc.opened_step):
            colour = SEVERITY_COLOURS.get(inc.severity, "grey")
            ax.axvline(inc.opened_step, color=colour, alpha=0.6, lw=1, ls="--")


def _incidents_about(data: RunData, topics: tuple[str, ...]) -> pd.DataFrame:
    found = run_incidents(data)
    if not topics or found.empty:
        return found
    about = [any(t in r for r in inc.members for t in topics) for inc in found.itertuples()]
    return found[about]


def _incident_spans(ax: Any, data: RunData, topics: tuple[str, ...]) -> int:
    """Each incident as a band from opened to resolved (or the last step), coloured by its
    peak severity; returns how many were drawn."""
    found = _incidents_about(data, topics)
    last = float(data.steps["step"].max()) if not data.steps.empty else 0.0
    drawn = 0
    for inc in found.itertuples(index=False):
        if not math.isfinite(inc.opened_step):
            continue
        end = inc.resolved_step if math.isfinite(inc.resolved_step) else last
        colour = SEVERITY_COLOURS.get(inc.severity, "grey")
        label = None if drawn else "incident (opened to resolved)"
        ax.axvspan(
            inc.opened_step,
            max(end, inc.opened_step + 1),
            color=colour,
            alpha=0.18,
            label=label,
            zorder=1,
        )
        ax.axvline(inc.opened_step, color=colour, lw=1.2, zorder=2)
        drawn += 1
    return drawn


def _mark_spikes(ax: Any, sig: pd.DataFrame, alerts: pd.DataFrame) -> None:
    """Loss spikes: those an incident started at (within a step) clearly, the others (a hard
    batch: a note, one step up and back) faintly. A spike is a breach of the spike detector:
    its severity where the signals carry it, else rare (anomaly score 0.999) and 2 % up."""
    if sig.empty or not {"name", "metric"} <= set(sig.columns):
        return
    spikes = sig[(sig["name"] == "spike") & (sig["metric"] == "loss")]
    if "severity" in spikes.columns:
        spikes = spikes[spikes["severity"].notna()]
    else:
        rise = column(spikes, "value") >= 1.02 * column(spikes, "expected")
        spikes = spikes[(column(spikes, "score").fillna(0) >= 0.999) & rise]
    if spikes.empty:
        return
    starts = np.array([], dtype=float)
    if not alerts.empty and "started_step" in alerts.columns:
        firing = alerts[column(alerts, "state").fillna("firing") == "firing"]
        starts = column(firing, "started_step").dropna().to_numpy(dtype=float)
    near = np.array([bool(np.any(np.abs(starts - s) <= 1)) for s in spikes["step"]], dtype=bool)
    hard, paged = spikes[~near], spikes[near]
    if not hard.empty:
        ax.scatter(
            hard["step"],
            hard["value"],
            s=14,
            facecolors="none",
            edgecolors="grey",
            alpha=0.5,
            zorder=4,
            label=f"hard batch (info, {len(hard)})",
        )
    if not paged.empty:
        ax.scatter(
            paged["step"],
            paged["value"],
            marker="X",
            s=70,
            color="#e45756",
            edgecolors="black",
            zorder=6,
            label="loss spike (incident)",
        )


def fig_loss(data: RunData) -> Any:
    """Loss per step with the ARIMA expectation band; points outside the band marked; loss
    spikes marked, faintly the hard batches (notes), clearly those that opened an incident."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.2))
    for rank, group in data.steps.groupby("rank"):
        df = group.sort_values("step")
        ax.plot(df["step"], df["loss"], lw=1, label=f"loss rank {rank}", alpha=0.85, zorder=3)
    sig = data.signals
    if not sig.empty and {"name", "metric"} <= set(sig.columns):
        arima = sig[(sig["name"] == "arima") & (sig["metric"] == "loss")]
        if "rank" in arima.columns and not data.steps.empty:
            arima = arima[arima["rank"] == data.steps["rank"].min()]
        arima = arima.dropna(subset=["expected"]).sort_values("step")
        if not arima.empty:
            ax.fill_between(  # the band of the first rank (each rank has its own model)
                arima["step"],
                column(arima, "lower"),
                column(arima, "upper"),
                color="#9ecae1",
                alpha=0.45,
                label="ARIMA band",
            )
            ax.plot(
                arima["step"],
                column(arima, "expected"),
                color="#3182bd",
                lw=1,
                ls=":",
                label="ARIMA expected",
            )
            out = arima[
                (column(arima, "value") > column(arima, "upper"))
                | (column(arima, "value") < column(arima, "lower"))
            ]
            ax.scatter(
                out["step"], out["value"], color="#e45756", zorder=5, s=22, label="outside band"
            )
    _mark_spikes(ax, sig, data.alerts)
    _mark_alerts(ax, data)
    ax.set(title=f"Loss - run {data.run_id}", xlabel="step", ylabel="loss")
    log_scale_if_wide(ax, data.steps["loss"])
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def fig_grad_norm(data: RunData) -> Any:
    """Gradient norm (pre-clip where known), clipped steps and spike signals."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.2))
    df = first_rank(data.steps)
    pre = column(df, "grad_norm_preclip")
    norm = pre.where(pre.notna(), column(df, "grad_norm"))
    ax.plot(df["step"], norm, lw=1, color="#4c78a8", label="grad norm")
    clipped = column(df, "clipped").fillna(False).astype(bool)
    if clipped.any():
        ax.scatter(
            df["step"][clipped],
            norm[clipped],
            s=10,
            color="#f58518",
            label=f"clipped ({int(clipped.sum())} steps)",
            zorder=4,
        )
    sig = data.signals
    if not sig.empty and {"name", "metric"} <= set(sig.columns):
        loud = sig[
            (sig["metric"].isin(["grad_norm", "grad_norm_preclip"]))
            & (column(sig, "score").fillna(0) >= 0.5)
        ]
        if not loud.empty:  # a detector's score at its threshold, not an alert: faint
            ax.scatter(
                loud["step"],
                loud["value"],
                marker=".",
                s=8,
                color="#888888",
                alpha=0.35,
                lw=0,
                label=f"detector signals, no alert ({len(loud)})",
                zorder=3,
            )
    _incident_spans(ax, data, GRAD_TOPICS)
    log_scale_if_wide(ax, norm)
    ax.set(title="Gradient norm", xlabel="step", ylabel="L2 norm")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def fig_lr(data: RunData) -> Any:
    """Actual learning rate against the declared schedule, with the lr events the worker
    found (warm-up ended, a decay and the declared milestone it matches) marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.6))
    df = first_rank(data.steps)
    ax.plot(df["step"], column(df, "lr"), lw=1.2, color="#4c78a8", label="actual lr")
    if data.lr_schedule and len(df):
        steps = np.arange(0, int(df["step"].max()) + 1)
        ax.plot(
            steps,
            declared_lr(data.lr_schedule, steps),
            lw=1,
            ls="--",
            color="#54a24b",
            label=f"declared ({data.lr_schedule.get('kind', '?')})",
        )
    events = data.lr_events
    marks = zip(column(events, "step"), column(events, "text"), strict=True)
    for i, (step, text) in enumerate(marks):
        ax.axvline(float(step), color="#b279a2", lw=1, ls=":", label=None if i else "lr event")
        ax.annotate(
            str(text)[:60],
            (float(step), 0.97 - 0.12 * (i % 4)),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="#6b3e6b",
            va="top",
        )
    log_scale_if_wide(ax, column(df, "lr"))
    ax.set(title="Learning rate: actual vs declared", xlabel="step", ylabel="lr")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


TIME_FIELDS = {"step_time_s": "step time", "data_time_s": "data loading time"}


def fig_step_time(data: RunData) -> Any:
    """Per-rank step time (and data loading time) as heatmaps, ranks x step bins, log colour
    scale: a straggler is a bright row (in synchronous data parallelism every rank's wall-clock
    step slows down; the slow rank's own data loading time shows which one it is)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    df = data.steps
    shown = [f for f in TIME_FIELDS if f in df.columns and df[f].notna().any()]
    n_ranks = max(1, df["rank"].nunique()) if "rank" in df else 1
    fig, axes = plt.subplots(
        max(1, len(shown)),
        1,
        figsize=(10, 0.4 + len(shown or [0]) * (1.6 + 0.35 * n_ranks)),
        squeeze=False,
        sharex=True,
    )
    if not shown:
        axes[0][0].text(0.5, 0.5, "no step time recorded", ha="center", va="center")
        return fig
    n_bins = int(min(120, max(1, df["step"].max() + 1)))
    lo, hi = df["step"].min(), df["step"].max()
    for ax, name in zip([a[0] for a in axes], shown, strict=True):
        rows = df.dropna(subset=[name])
        grid = rows.assign(bin=pd.cut(rows["step"], n_bins, labels=False)).pivot_table(
            index="rank", columns="bin", values=name, aggfunc="max"
        )
        values = grid.to_numpy(dtype=float)
        positive = values[np.isfinite(values) & (values > 0)]
        norm = LogNorm(positive.min(), positive.max()) if positive.size else None
        im = ax.imshow(
            values,
            aspect="auto",
            norm=norm,  # log scale: a stall does not wash out a straggler
            cmap="magma",
            interpolation="nearest",
            extent=(lo, hi, grid.index.max() + 0.5, grid.index.min() - 0.5),
        )
        ax.set_yticks(list(grid.index))
        ax.set_yticklabels([f"rank {r}" for r in grid.index])
        ax.set_title(f"{TIME_FIELDS[name]} per rank (s, max per bin, log colour)", fontsize=10)
        fig.colorbar(im, ax=ax, pad=0.01)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    return fig


def fig_hardware(data: RunData) -> Any:
    """GPU utilisation and memory per GPU, host CPU and memory, against time."""
    import matplotlib.pyplot as plt

    fig, (ax_u, ax_m) = plt.subplots(2, 1, figsize=(10, 5.4), sharex=True)
    drawn = False
    if not data.gpu.empty:
        for keys, df in data.gpu.sort_values("time").groupby(["host", "gpu"]):
            label = f"GPU {keys[0]}/{keys[1]}"
            if "util_gpu" in df:
                ax_u.plot(df["time"], df["util_gpu"], lw=1, label=f"{label} util")
            if "mem_used_pct" in df:
                ax_m.plot(df["time"], df["mem_used_pct"], lw=1, label=f"{label} mem")
            drawn = True
    if not data.host.empty:
        for host, df in data.host.sort_values("time").groupby("host"):
            if "cpu_percent" in df:
                ax_u.plot(df["time"], df["cpu_percent"], lw=1, ls="--", label=f"{host} CPU")
            if {"mem_available_bytes", "mem_total_bytes"} <= set(df.columns):
                used = 100 * (1 - df["mem_available_bytes"] / df["mem_total_bytes"])
                ax_m.plot(df["time"], used, lw=1, ls="--", label=f"{host} host mem")
            drawn = True
    if data.gpu.empty and "gpu_status" in data.host.columns:
        status = data.host["gpu_status"].dropna()
        if not status.empty and status.iloc[-1] != "ok":
            ax_u.text(
                0.01,
                0.04,
                f"GPU: {status.iloc[-1]} (host only)",
                fontsize=8,
                transform=ax_u.transAxes,
            )
    if not drawn:
        ax_u.text(
            0.5, 0.5, "no hardware samples", ha="center", va="center", transform=ax_u.transAxes
        )
    ax_u.set(title="Utilisation and memory", ylabel="utilisation %", ylim=(0, 105))
    ax_m.set(ylabel="memory used %", xlabel="time (UTC)", ylim=(0, 105))
    for ax in (ax_u, ax_m):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def fig_alerts(data: RunData) -> Any:
    """Incident timeline: one row per incident (its lead rule), a bar from opened to resolved
    (or the last step, hatched: still open), coloured by its peak severity."""
    import matplotlib.pyplot as plt

    found = run_incidents(data)
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.4 * max(1, len(found))))
    if found.empty:
        ax.text(0.5, 0.5, "no incidents", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    last_step = float(data.steps["step"].max()) if not data.steps.empty else 0.0
    labels = []
    for y, inc in enumerate(found.itertuples(index=False)):
        start = inc.opened_step if math.isfinite(inc.opened_step) else 0.0
        end = inc.resolved_step if inc.state == "resolved" else last_step
        end = end if math.isfinite(end) else start
        colour = SEVERITY_COLOURS.get(inc.severity, "grey")
        width = max(end - start, max(last_step, 1.0) / 200)
        hatch = None if inc.state == "resolved" else "//"
        ax.barh(y, width, left=start, height=0.6, color=colour, alpha=0.85, hatch=hatch)
        ax.plot([start], [y], marker="|", color="black", ms=12)
        more = len(inc.members) - 1
        labels.append(f"{inc.rule}" + (f" (+{more})" if more > 0 else ""))
    ax.set_yticks(range(len(found)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in SEVERITY_COLOURS.values()]
    ax.legend(handles, list(SEVERITY_COLOURS), loc="lower right", fontsize=8)
    ax.set(
        title="Incidents by lead rule (+ other member rules; bar: open until resolved)",
        xlabel="step",
        xlim=(0, max(1.0, last_step) * 1.02),  # an incident opened at the last step shows
    )
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


FIGURES: dict[str, tuple[str, Callable[[RunData], Any]]] = {
    "loss": ("Loss with its ARIMA band and anomalies", fig_loss),
    "grad_norm": ("Gradient norm, spikes and clipping", fig_grad_norm),
    "clipping": ("Clipping rate", fig_clipping),
    "layers": ("Per-layer norms: the layers that moved most", fig_layers),
    "loss_noise": ("Loss volatility and the train-validation gap", fig_loss_noise),
    "lr": ("Learning rate against the declared schedule", fig_lr),
    "eval": ("Evaluation", fig_eval),
    "lengths": ("Input lengths per window", fig_lengths),
    "data_quality": ("Label balance, duplicated and repeated samples", fig_data_quality),
    "step_time": ("Step time per rank", fig_step_time),
    "hardware": ("GPU and host utilisation and memory", fig_hardware),
    "gpu_node": (
        "GPU power, temperature, PCIe, memory bandwidth, XID/ECC errors and throttling",
        fig_gpu_node,
    ),
    "io": ("Disk, network and inter-rank communication", fig_io),
    "bandwidth": (
        "Memory and network bandwidth against GPU utilisation: what the GPUs wait on",
        fig_bandwidth,
    ),
    "baseline": ("Hardware and throughput against their 7-day baselines", fig_baseline),
    "alerts": ("Incidents by severity", fig_alerts),
}
