"""What the report's figures share: safe column access, the first rank, a log axis, the
threshold a rule judged against (its alert line)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def column(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df.columns else pd.Series(np.nan, index=df.index)


def first_rank(steps: pd.DataFrame) -> pd.DataFrame:
    if steps.empty or "rank" not in steps.columns:
        return steps
    first = steps["rank"].min()
    return steps[steps["rank"] == first].sort_values("step")


def log_scale_if_wide(ax: Any, values: pd.Series) -> None:
    v = pd.to_numeric(values, errors="coerce")
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / max(v.quantile(0.5), 1e-12) > 20:
        ax.set_yscale("log")


def step_windows(steps: pd.Series, n: int = 12) -> pd.Series:
    """A window number per step: ``n`` windows of equal step span over the run."""
    s = pd.to_numeric(steps, errors="coerce").astype("float64")
    if s.dropna().empty:
        return pd.Series(np.nan, index=steps.index)
    lo, hi = s.min(), s.max()
    width = max(1.0, (hi - lo + 1) / n)
    return ((s - lo) // width).clip(upper=n - 1)


def alert_line(
    signals: pd.DataFrame, name: str, metric: str, default: float, field: str = "expected"
) -> float:
    """The threshold detector ``name`` judged ``metric`` against, as its latest stored signal
    says (``field``: ``expected`` or ``upper``, in the signal's unit): the worker's own
    setting, not a default the report assumes; ``default`` when no signal carries one."""
    if signals.empty or not {"name", "metric", field} <= set(signals.columns):
        return default
    rows = signals[(signals["name"] == name) & (signals["metric"] == metric)]
    got = pd.to_numeric(rows[field], errors="coerce").dropna()
    got = got[np.isfinite(got)]
    if got.empty:
        return default
    if "step" in rows.columns:
        order = pd.to_numeric(rows.loc[got.index, "step"], errors="coerce").fillna(-1)
        return float(got.loc[order.sort_values(kind="stable").index].iloc[-1])
    return float(got.iloc[-1])


def nothing(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def signal_rows(signals: pd.DataFrame, name: str, metric: str) -> pd.DataFrame:
    """The stored signals of detector ``name`` on ``metric`` with a step, in step order."""
    if signals.empty or not {"name", "metric", "step"} <= set(signals.columns):
        return pd.DataFrame(columns=["step", "rank", "value", "expected"])
    rows = signals[(signals["name"] == name) & (signals["metric"] == metric)]
    rows = rows.dropna(subset=["step"])
    return rows.sort_values("step", kind="stable")
