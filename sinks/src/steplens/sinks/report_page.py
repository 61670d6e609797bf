"""The report on disk: one PNG per figure and ``index.html``, readable only by their owner
(telemetry of a training run: a folder 0700, files 0600)."""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd

from steplens.sinks.report_data import RunData
from steplens.sinks.report_figures import FIGURES, column, first_rank


def write_report(data: RunData, out_dir: Path) -> Path:
    """Write one PNG per figure and ``index.html``; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    out_dir.chmod(0o700)
    sections = []
    for name, (title, build) in FIGURES.items():
        fig = build(data)
        with _private(out_dir / f"{name}.png") as fh:
            fig.savefig(fh, format="png", dpi=110)
        plt.close(fig)
        sections.append(f'<h2>{html.escape(title)}</h2>\n<img src="{name}.png" alt="{name}">')
    page = _PAGE.format(
        run=html.escape(data.run_id),
        summary=_summary_html(data),
        alerts=_alerts_html(data.alerts),
        figures="\n".join(sections),
    )
    index = out_dir / "index.html"
    with _private(index) as fh:
        fh.write(page.encode())
    return index


def _private(path: Path) -> BinaryIO:
    """``path`` opened for writing from scratch, mode 0600 (an existing file's mode too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "wb")


def _summary_html(data: RunData) -> str:
    s = data.steps
    if s.empty:
        return "<p>No steps stored for this run.</p>"
    last = first_rank(s).iloc[-1]
    items = {
        "ranks": int(s["rank"].nunique()),
        "steps": int(s["step"].max()) + 1,
        "last loss": f"{float(last.get('loss', math.nan)):.4f}",
        "incidents": int(column(data.alerts, "fingerprint").nunique())
        if "fingerprint" in data.alerts
        else 0,
    }
    return "<ul>" + "".join(f"<li><b>{k}</b>: {v}</li>" for k, v in items.items()) + "</ul>"


def _alerts_html(alerts: pd.DataFrame) -> str:
    if alerts.empty:
        return "<p>No incidents.</p>"
    cols = [
        c
        for c in ("step", "started_step", "rank", "severity", "state", "rule", "scope", "hint")
        if c in alerts.columns
    ]
    rows = alerts.sort_values("step")[cols]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r) + "</tr>"
        for r in rows.itertuples(index=False)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:g}"
    return str(value)


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>steplens report - {run}</title>
<style>
body {{ font-family: sans-serif; max-width: 1120px; margin: 2em auto; color: #222; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 6px; text-align: left; }}
</style></head>
<body>
<h1>steplens report: run {run}</h1>
{summary}
<h2>Alerts</h2>
{alerts}
{figures}
</body></html>
"""
