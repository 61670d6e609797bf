"""The report's 7-day baseline figure: stored baseline signals become rows (scope and baseline
kind from the detail where the store has no scope column), and each metric draws its worst
series with their bands."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from steplens.sinks.report_baseline import fig_baseline, worst
from steplens.sinks.report_data import RunData, _baselines


def _stored(n: int = 30) -> pd.DataFrame:
    t = pd.date_range("2026-01-01", periods=n, freq="1min", tz="UTC")
    rows = []
    for scope, drop in (("gpu:n1/0", False), ("gpu:n1/1", True), ("gpu:n1/2", False)):
        for i, when in enumerate(t):
            value = 40.0 if drop and i >= 20 else 90.0
            detail = {"scope": scope, "baseline": "7d" if scope != "gpu:n1/2" else "in-run"}
            rows.append(
                {
                    "time": when,
                    "metric": "gpu_util",
                    "value": value,
                    "expected": 90.0,
                    "lower": 85.0,
                    "upper": 95.0,
                    "detail": json.dumps(detail),  # S3 keeps the detail as JSON text
                }
            )
    rows.append(
        {
            "time": t[0],
            "metric": "tokens_per_s",
            "value": 1e5,
            "expected": 1e5,
            "lower": 9e4,
            "upper": 1.1e5,
            "detail": {"scope": "rank:0", "baseline": "7d"},
        }
    )
    return pd.DataFrame(rows)


def test_stored_signals_become_baseline_rows() -> None:
    rows = _baselines(_stored())
    assert list(rows.columns) == [
        "time",
        "metric",
        "scope",
        "value",
        "expected",
        "lower",
        "upper",
        "baseline",
    ]
    assert set(rows["scope"]) == {"gpu:n1/0", "gpu:n1/1", "gpu:n1/2", "rank:0"}
    assert set(rows["baseline"]) == {"7d", "in-run"}
    assert _baselines(pd.DataFrame()).empty


def test_the_figure_draws_the_worst_series_with_their_bands() -> None:
    import matplotlib.pyplot as plt

    rows = _baselines(_stored())
    gpu = rows[rows["metric"] == "gpu_util"]
    assert worst(gpu) == ["gpu:n1/1", "gpu:n1/0"]  # 10 minutes outside, then by name
    fig = fig_baseline(RunData("r", pd.DataFrame(), baselines=rows))
    ax_gpu, ax_tokens = fig.axes
    labels = [line.get_label() for line in ax_gpu.get_lines()]
    assert labels == ["gpu:n1/1 (7d)", "gpu:n1/0 (7d)"]
    assert len(ax_gpu.collections) == 4  # a band and the outside marks per series
    marks = ax_gpu.collections[1].get_offsets()
    assert len(marks) == 10 and np.allclose(np.asarray(marks)[:, 1], 40.0)
    assert [line.get_label() for line in ax_tokens.get_lines()] == ["rank:0 (7d)"]
    empty = fig_baseline(RunData("r", pd.DataFrame()))
    assert "no baseline signals" in empty.axes[0].texts[0].get_text()
    plt.close("all")
