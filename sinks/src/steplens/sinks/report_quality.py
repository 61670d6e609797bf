"""The report's figures of data quality and of the loss's behaviour: label balance, duplicate
and repeat rates, loss volatility, the train-validation gap. Pure functions of a ``RunData``.

The loss volatility's alert line is the threshold its stored signals were judged against
(``expected``: the worker's own setting), in percent as the values are drawn; the data limits
are the stream jobs' defaults (``DataConfig``).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pandas as pd

from steplens.sinks.report_data import RunData
from steplens.sinks.report_plot import alert_line, column, nothing, signal_rows, step_windows

LABEL_IMBALANCE: Final = 100.0  # most / least frequent label (DataConfig.label_imbalance)
DUPLICATE_RATE: Final = 0.05  # DataConfig.duplicate_rate, for duplicates and repeats
VOLATILITY: Final = 0.10  # VolatilityConfig.threshold, where no stored signal says its own
TOP_LABELS: Final = 8
TRAIN_POINTS: Final = 5  # stored training losses averaged before each evaluation
RATES: Final = {
    "duplicate_rate": ("same sample on two ranks in a step", "#e45756"),
    "repeat_rate": ("seen before in the epoch (recent batches)", "#f58518"),
    "repeat_share": ("seen before in the epoch (whole epoch)", "#4c78a8"),
}
_LABEL_PREFIXES: Final = ("label_counts.", "label_")  # S3's flattened map, InfluxDB's fields


def label_counts(batches: pd.DataFrame) -> pd.DataFrame:
    """Class-label counts per batch record: a ``step`` column and one column per label."""
    if batches.empty or "step" not in batches:
        return pd.DataFrame()
    names: dict[str, str] = {}
    for c in map(str, batches.columns):
        prefix = next((p for p in _LABEL_PREFIXES if c.startswith(p)), None)  # longest first
        if prefix is not None:
            names[c] = c[len(prefix) :]
    if not names:
        return pd.DataFrame()
    counts = batches[list(names)].apply(pd.to_numeric, errors="coerce").rename(columns=names)
    counts = counts.T.groupby(level=0).sum(min_count=1).T  # both stores' names of one label
    keep = counts.notna().any(axis=1)
    return counts[keep].fillna(0).assign(step=batches.loc[keep, "step"].astype("float64"))


def label_balance(batches: pd.DataFrame, n: int = 12) -> tuple[pd.DataFrame, pd.Series]:
    """(share of each label per window of steps: rows = the window's median step, columns the
    ``TOP_LABELS`` most frequent labels and "other"; the imbalance after each window: most /
    least frequent label over all batches so far, as the stream jobs judge it)."""
    counts = label_counts(batches)
    if counts.empty:
        return pd.DataFrame(), pd.Series(dtype="float64")
    windows = step_windows(counts["step"], n)
    labels = counts.drop(columns="step")
    per = labels.groupby(windows).sum()
    per.index = counts.groupby(windows)["step"].median().round().to_numpy()
    top = list(labels.sum().sort_values(ascending=False).index[:TOP_LABELS])
    shown = per[top].copy()
    if len(labels.columns) > len(top):
        shown["other"] = per.drop(columns=top).sum(axis=1)
    shares = shown.div(shown.sum(axis=1).replace(0, np.nan), axis=0)
    running = per.cumsum()
    low = running.min(axis=1)
    ratio = running.max(axis=1) / low.where(low > 0)
    return shares, ratio.where(low > 0, np.inf)


def fig_data_quality(data: RunData) -> Any:
    """Label balance per window (and the imbalance ratio against its alert line); the rates of
    duplicated and repeated samples against theirs."""
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_r) = plt.subplots(2, 1, figsize=(10, 6.0))
    shares, ratio = label_balance(data.batches)
    if shares.empty:
        supervised = column(data.batches, "supervised_share").notna().any()
        nothing(
            ax_l,
            "no class labels (log_batch(labels=...) of a classifier)"
            + ("; language-model batches: see the supervised share" if supervised else ""),
        )
        ax_l.set_xticks([])
        ax_l.set_yticks([])
    else:
        x = np.arange(len(shares))
        bottom = np.zeros(len(shares))
        for label in shares.columns:
            values = shares[label].fillna(0).to_numpy()
            ax_l.bar(x, 100 * values, bottom=100 * bottom, width=0.8, label=str(label))
            bottom += values
        ax_l.set_xticks(x)
        ax_l.set_xticklabels([f"{s:.0f}" for s in shares.index], fontsize=7)
        ax_l.set(ylabel="% of labels", xlabel="window (median step)", ylim=(0, 100))
        ax_i = ax_l.twinx()
        ax_i.plot(x, ratio.replace(np.inf, np.nan), color="black", marker="o", ms=3, lw=1)
        ax_i.axhline(LABEL_IMBALANCE, color="#e45756", ls="--", lw=1)
        ax_i.set_yscale("log")
        ax_i.set_ylabel("most / least frequent (so far)")
        ax_l.legend(loc="upper left", fontsize=7, ncol=3)
    ax_l.set_title(
        f"Label balance per window (bars) and imbalance ratio (line; alert above "
        f"{LABEL_IMBALANCE:g})",
        fontsize=10,
    )
    drawn = False
    for metric, (words, colour) in RATES.items():
        rows = signal_rows(data.signals, "data", metric)
        if rows.empty:
            continue
        per = rows.groupby("step")["value"].max()  # the worst rank at each step
        ax_r.plot(
            per.index,
            100 * per.to_numpy(),
            marker=".",
            ms=4,
            lw=1,
            color=colour,
            label=f"{metric}: {words}",
        )
        drawn = True
    if drawn:
        ax_r.axhline(100 * DUPLICATE_RATE, color="#e45756", ls="--", lw=1, label="alert line")
        ax_r.legend(loc="upper left", fontsize=7)
        ax_r.set(xlabel="step", ylabel="% of samples")
    else:
        nothing(ax_r, "no duplicate or repeat rates (log_batch with sample hashes)")
    ax_r.set_title("Duplicated and repeated samples (worst rank per step)", fontsize=10)
    for ax in (ax_l, ax_r):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def train_val_gap(steps: pd.DataFrame, evals: pd.DataFrame) -> pd.DataFrame:
    """Per evaluation with a loss: ``step``, ``split``, ``eval_loss``, ``train_loss`` (mean of
    the last ``TRAIN_POINTS`` stored training losses up to its step, averaged over ranks) and
    ``gap`` (validation minus training: it widens as the model overfits)."""
    cols = ["step", "split", "eval_loss", "train_loss", "gap"]
    if evals.empty or "loss" not in evals or steps.empty or "loss" not in steps:
        return pd.DataFrame(columns=cols)
    train = steps.dropna(subset=["loss"]).groupby("step")["loss"].mean().sort_index()
    smooth = train.rolling(TRAIN_POINTS, min_periods=1).mean()
    ev = evals.dropna(subset=["loss", "step"]).sort_values("step")
    if ev.empty or smooth.empty:
        return pd.DataFrame(columns=cols)
    at = np.searchsorted(smooth.index.to_numpy(), ev["step"].to_numpy(dtype=float), "right") - 1
    train_loss = np.where(at >= 0, smooth.to_numpy()[np.clip(at, 0, None)], np.nan)
    out = pd.DataFrame(
        {
            "step": ev["step"].to_numpy(dtype=float),
            "split": ev["split"].fillna("val").to_numpy() if "split" in ev else "val",
            "eval_loss": ev["loss"].to_numpy(dtype=float),
            "train_loss": train_loss,
        }
    )
    out["gap"] = out["eval_loss"] - out["train_loss"]
    return out.dropna(subset=["gap"]).reset_index(drop=True)


def fig_loss_noise(data: RunData) -> Any:
    """The loss's relative noise (volatility) against its alert line, and the gap between the
    validation and the training loss."""
    import matplotlib.pyplot as plt

    fig, (ax_v, ax_g) = plt.subplots(2, 1, figsize=(10, 5.6), sharex=True)
    vol = signal_rows(data.signals, "volatility", "loss")
    if "expected" in vol:  # judged values only (before its window fills, a series says 0)
        vol = vol[vol["expected"].notna()]
    if vol.empty:
        nothing(ax_v, "no volatility signals stored (log_step(loss=...))")
    else:
        per = vol.groupby("step")["value"].max()  # one series per rank, all of the run's
        ax_v.plot(
            per.index,
            100 * per.to_numpy(),
            lw=1,
            marker=".",
            ms=3,
            color="#4c78a8",
            label="relative noise (worst rank)",
        )
        line = alert_line(data.signals, "volatility", "loss", VOLATILITY)
        hot = vol[vol["severity"].isin(["warning", "critical"])] if "severity" in vol else vol[:0]
        if not hot.empty:
            ax_v.scatter(
                hot["step"],
                100 * hot["value"],
                s=12,
                color="#e45756",
                zorder=3,
                label="over the line (an alert, or a member of the incident it follows)",
            )
        ax_v.axhline(100 * line, color="#e45756", ls="--", lw=1, label=f"alert line {line:.0%}")
        ax_v.legend(loc="upper right", fontsize=8)
    ax_v.set(title="Loss volatility (std of the last steps' changes / mean, %)", ylabel="%")
    gap = train_val_gap(data.steps, data.evals)
    if gap.empty:
        nothing(ax_g, "no evaluation loss to compare (log_eval(step, loss=...))")
    else:
        for split, g in gap.groupby("split"):
            ax_g.plot(g["step"], g["gap"], marker="o", ms=3, lw=1, label=f"{split} - train")
        worker = signal_rows(data.signals, "generalization_gap", "eval_loss")
        if not worker.empty:
            ax_g.scatter(
                worker["step"],
                worker["value"],
                s=14,
                color="grey",
                alpha=0.6,
                label="the stream jobs' gap (against their loss average)",
                zorder=3,
            )
        ax_g.axhline(0, color="black", lw=0.6)
        ax_g.legend(loc="upper left", fontsize=8)
    ax_g.set(
        title="Train-validation gap (validation loss - training loss)",
        xlabel="step",
        ylabel="loss difference",
    )
    for ax in (ax_v, ax_g):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
