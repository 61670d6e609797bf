"""The report's figures of the data and of the model's inside: clipping rate, per-layer norms,
evaluation scores, input lengths. Pure functions of a ``RunData``, like ``report_figures``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from steplens.sinks.report_data import RunData
from steplens.sinks.report_plot import column, log_scale_if_wide, nothing, step_windows

TOP_LAYERS = 8
SCORES = {"accuracy": "#4c78a8", "f1": "#54a24b", "rouge": "#f58518"}  # 0..1; BLEU is 0..100


def fig_clipping(data: RunData) -> Any:
    """Share of steps whose gradients were clipped, per window of steps and rank: clipping on
    most steps means the lr or the data is off."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.2))
    steps = data.steps
    clipped = pd.to_numeric(column(steps, "clipped"), errors="coerce")
    rows = steps.assign(clipped=clipped).dropna(subset=["clipped"])
    if rows.empty:
        nothing(ax, "no clipping recorded (watch(max_grad_norm=...) or grad_norm_preclip)")
        return fig
    rows = rows.assign(window=step_windows(rows["step"]))
    for rank, group in rows.groupby("rank"):
        per = group.groupby("window").agg(step=("step", "median"), rate=("clipped", "mean"))
        ax.plot(per["step"], 100 * per["rate"], marker="o", ms=3, lw=1, label=f"rank {rank}")
    ax.axhline(50, color="#e45756", lw=0.8, ls="--", alpha=0.6)
    ax.set(
        title="Clipping rate (share of the recorded steps clipped, per window)",
        xlabel="step",
        ylabel="% of steps",
        ylim=(-2, 102),
    )
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def top_layers(layers: pd.DataFrame, n: int = TOP_LAYERS) -> list[str]:
    """The ``n`` layers whose gradient (else parameter) norm moved most over the run: largest
    max / median."""
    if layers.empty:
        return []
    value = "grad_norm" if column(layers, "grad_norm").notna().any() else "param_norm"
    v = layers.dropna(subset=[value])
    stats = v.groupby("layer")[value].agg(["max", "median"])
    moved = stats["max"] / stats["median"].abs().clip(lower=1e-30)
    return list(moved.sort_values(ascending=False, kind="stable").index[:n])


def fig_layers(data: RunData) -> Any:
    """Gradient and parameter norm of the layers that moved most (first rank)."""
    import matplotlib.pyplot as plt

    fig, (ax_g, ax_p) = plt.subplots(2, 1, figsize=(10, 5.6), sharex=True)
    layers = data.layers
    if not layers.empty and "rank" in layers:
        layers = layers[layers["rank"] == layers["rank"].min()]
    chosen = top_layers(layers)
    if not chosen:
        nothing(ax_g, "no per-layer norms (watch() sends them)")
        return fig
    for name in chosen:
        df = layers[layers["layer"] == name].sort_values("step")
        ax_g.plot(df["step"], column(df, "grad_norm"), lw=1, label=name)
        ax_p.plot(df["step"], column(df, "param_norm"), lw=1, label=name)
    log_scale_if_wide(ax_g, column(layers, "grad_norm"))
    ax_g.set(title=f"Per-layer gradient norm (top {len(chosen)} by max / median)", ylabel="L2")
    ax_p.set(title="Per-layer parameter norm", xlabel="step", ylabel="L2")
    for ax in (ax_g, ax_p):
        ax.grid(alpha=0.3)
    ax_g.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def fig_eval(data: RunData) -> Any:
    """Evaluation loss per split, and accuracy, F1, ROUGE (0..1) with BLEU (0..100)."""
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_s) = plt.subplots(2, 1, figsize=(10, 5.4), sharex=True)
    ev = data.evals
    if ev.empty or "step" not in ev:
        nothing(ax_l, "no evaluations")
        return fig
    ev = ev.sort_values("step")
    ax_b = ax_s.twinx()
    for split, df in ev.groupby(column(ev, "split").fillna("val")):
        if column(df, "loss").notna().any():
            ax_l.plot(df["step"], df["loss"], marker="o", ms=3, lw=1, label=f"{split} loss")
        for name, colour in SCORES.items():
            values = column(df, name)
            if values.notna().any():
                label = f"{split} {name}"
                ax_s.plot(df["step"], values, marker="o", ms=3, lw=1, color=colour, label=label)
        if column(df, "bleu").notna().any():
            label = f"{split} bleu"
            ax_b.plot(df["step"], df["bleu"], marker="s", ms=3, lw=1, color="#e45756", label=label)
    ax_l.set(title="Evaluation", ylabel="loss")
    ax_s.set(xlabel="step", ylabel="accuracy, F1, ROUGE", ylim=(-0.02, 1.02))
    ax_b.set(ylabel="BLEU", ylim=(-2, 102))
    handles = [h for ax in (ax_s, ax_b) for h in ax.get_legend_handles_labels()[0]]
    if handles:
        ax_s.legend(handles=handles, loc="lower right", fontsize=8)
    if ax_l.get_legend_handles_labels()[0]:
        ax_l.legend(loc="upper right", fontsize=8)
    for ax in (ax_l, ax_s):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def length_grid(batches: pd.DataFrame, n: int = 12) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(samples per length bin and window: rows = bins by upper edge, columns = the window's
    median step; per window: over-length and supervised shares)."""
    rows = []
    windows = step_windows(batches["step"], n)
    for w, bins in zip(windows, batches["lengths"], strict=True):
        for _, upper, count in bins or []:
            rows.append((w, upper, count))
    if not rows:
        return pd.DataFrame(), pd.DataFrame()
    counts = pd.DataFrame(rows, columns=["window", "upper", "count"])
    grid = counts.pivot_table(index="upper", columns="window", values="count", aggfunc="sum")
    b = batches.assign(window=windows)
    by = b["window"]
    over = column(b, "over_length").astype("float64")
    judged = column(b, "n_samples").astype("float64").where(over.notna())
    shares = pd.DataFrame(
        {
            "step": b.groupby("window")["step"].median(),
            "over_length_share": over.groupby(by).sum(min_count=1) / judged.groupby(by).sum(),
            "supervised_share": column(b, "supervised_share").groupby(by).mean(),
        }
    )
    grid.columns = [int(shares.loc[w, "step"]) for w in grid.columns]
    return grid.fillna(0), shares


def fig_lengths(data: RunData) -> Any:
    """Input length histogram per window of steps (share of the window's samples per length
    bin), with the share of samples over the maximum length."""
    import matplotlib.pyplot as plt

    fig, (ax_h, ax_o) = plt.subplots(
        2, 1, figsize=(10, 5.6), gridspec_kw={"height_ratios": [2, 1]}, sharex=False
    )
    b = data.batches
    grid, shares = length_grid(b) if not b.empty and "lengths" in b else (pd.DataFrame(), None)
    if grid.empty or shares is None:
        nothing(ax_h, "no batches (log_batch)")
        return fig
    share = grid / grid.sum(axis=0).replace(0, np.nan)
    im = ax_h.imshow(share.to_numpy(dtype=float), aspect="auto", origin="lower", cmap="viridis")
    ax_h.set_yticks(range(len(share.index)))
    ax_h.set_yticklabels([f"< {u}" for u in share.index], fontsize=7)
    ax_h.set_xticks(range(len(share.columns)))
    ax_h.set_xticklabels([str(c) for c in share.columns], fontsize=7)
    ax_h.set(title="Input lengths per window (share of samples)", xlabel="window (median step)")
    fig.colorbar(im, ax=ax_h, pad=0.01)
    over = 100 * shares["over_length_share"]
    ax_o.plot(shares["step"], over, marker="o", ms=3, label="over max_len")
    if shares["supervised_share"].notna().any():
        ax_o.plot(
            shares["step"], 100 * shares["supervised_share"], marker="s", ms=3, label="supervised"
        )
    ax_o.set(xlabel="step", ylabel="% of samples / tokens", ylim=(-2, 102))
    ax_o.legend(loc="upper right", fontsize=8)
    ax_o.grid(alpha=0.3)
    fig.tight_layout()
    return fig
