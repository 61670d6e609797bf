"""The report on disk: one PNG per figure and ``index.html``, readable only by their owner
(telemetry of a training run: a folder 0700, files 0600)."""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd

from steplens.sinks.report_data import RunData, checks_by_name
from steplens.sinks.report_figures import FIGURES, first_rank
from steplens.sinks.report_incidents import duration_text, run_incidents
from steplens.sinks.trace_links import Link, presigner

EVIDENCE_CHARS = 6000  # of one incident's evidence shown on the page


def write_report(data: RunData, out_dir: Path, link: Link | None = None) -> Path:
    """Write one PNG per figure and ``index.html``; returns the HTML path. ``link``: a
    trace's address to the URL shown (default: presigned, ``trace_links``)."""
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
        alerts=_incidents_html(data, link or presigner()),
        checks=_checks_html(data),
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
        "incidents": len(run_incidents(data)),
    }
    return "<ul>" + "".join(f"<li><b>{k}</b>: {v}</li>" for k, v in items.items()) + "</ul>"


def _incidents_html(data: RunData, link: Link) -> str:
    """One row per incident, each with a link to its evidence (below the table)."""
    found = run_incidents(data)
    if found.empty:
        return "<p>No incidents.</p>"
    head = "".join(
        f"<th>{c}</th>"
        for c in (
            "opened",
            "severity",
            "state",
            "duration",
            "lead rule",
            "hint",
            "members",
            "advice given and answers",
            "loss after",
            "",
        )
    )
    rows, details = [], []
    for i, inc in enumerate(found.itertuples(index=False)):
        anchor = f"incident-{i + 1}"
        when = f"step {_fmt(inc.opened_step)}"
        if math.isfinite(inc.opened_ns):
            stamp = pd.Timestamp(int(inc.opened_ns), unit="ns", tz="UTC")
            when += f"<br><small>{stamp:%H:%M:%S} UTC</small>"
        state = inc.state if inc.state == "open" else f"resolved at step {_fmt(inc.resolved_step)}"
        hint = html.escape(inc.hint) + "".join(
            f"<br><b>advice</b>: {html.escape(a)}" for a in inc.advice
        )
        cells = [
            when,
            f'<span class="sev-{html.escape(inc.severity)}">{html.escape(inc.severity)}</span>',
            html.escape(state),
            html.escape(duration_text(inc.duration_steps, inc.duration_s)),
            f"<code>{html.escape(inc.rule)}</code>",
            hint,
            html.escape(", ".join(inc.members)),
            _remedies_html(inc.remedies, link),
            html.escape(inc.recovery),
            f'<a href="#{anchor}">evidence</a>',
        ]
        rows.append(f'<tr class="incident">{"".join(f"<td>{c}</td>" for c in cells)}</tr>')
        text = json.dumps(inc.evidence, indent=1, default=str)
        if len(text) > EVIDENCE_CHARS:
            text = text[:EVIDENCE_CHARS] + f"\n... ({len(text) - EVIDENCE_CHARS} more characters)"
        details.append(
            f'<details id="{anchor}"><summary>incident {i + 1}: <code>{html.escape(inc.rule)}'
            f"</code> from step {_fmt(inc.opened_step)} ({inc.records} records, fingerprint "
            f"<code>{html.escape(inc.fingerprint)}</code>)</summary>"
            f"<pre>{html.escape(text)}</pre></details>"
        )
    table = f'<table class="incidents"><tr>{head}</tr>{"".join(rows)}</table>'
    return table + "\n<h3>Evidence</h3>\n" + "\n".join(details)


def _remedies_html(remedies: list[dict[str, Any]], link: Link) -> str:
    """Each piece of advice (what, to whom, when) and the ranks' answers below it, with a
    link to each trace a rank took."""
    if not remedies:
        return "none"
    items = []
    for r in remedies:
        at = "" if r["step"] is None else f" at step {_fmt(r['step'])}"
        items.append(
            f'<span class="advice"><b>{html.escape(r["advice"])}</b> to '
            f"{html.escape(r['to'] + at)}<br>&rarr; "
            f'<span class="answers">{html.escape(r["answered"])}</span>'
            f"{_traces_html(r.get('traces') or (), link)}</span>"
        )
    return "<br>".join(items)


def _traces_html(traces: Any, link: Link) -> str:
    """``trace of rank 3`` linked to where it is (a path on the rank's host: named)."""
    out = []
    for t in traces:
        who = "every rank" if t["rank"] is None else f"rank {t['rank']}"
        url = link(t["uri"])
        if url is None:
            out.append(f"<br>trace of {who}: <code>{html.escape(t['uri'])}</code>")
        else:
            href = html.escape(url, quote=True)
            out.append(f'<br><a class="trace" href="{href}">trace of {who}</a>')
    return "".join(out)


def _checks_html(data: RunData) -> str:
    """Each check of the design: on, on use (and the call that feeds it) or off (why, and the
    one line that turns it on)."""
    table = checks_by_name(data.checks)
    if table.empty:
        return "<p>The run did not say which checks it runs (no checks in run_meta).</p>"
    head = "<tr><th>check</th><th>state</th><th>fed by / why off</th><th>turn it on</th></tr>"
    body = "".join(
        f'<tr class="check state-{html.escape(r.state.split()[0])}"><td>{html.escape(r.check)}'
        f"</td><td>{html.escape(r.state)}</td><td>{html.escape(r.detail)}</td>"
        f"<td><code>{html.escape(r.enable)}</code></td></tr>"
        for r in table.itertuples(index=False)
    )
    off = [r for r in table.itertuples(index=False) if "off" in r.state]
    lead = f"<p>{len(table) - len(off)} of {len(table)} checks run"
    lead += (", these do not:</p><ul>" if off else ".</p>") + "".join(
        f"<li><b>{html.escape(r.check)}</b> ({html.escape(r.state)}): {html.escape(r.detail)}"
        f"; turn it on: <code>{html.escape(r.enable)}</code></li>"
        for r in off
    )
    lead += "</ul>" if off else ""
    table_html = f'<table class="checks">{head}{body}</table>'
    return f"{lead}\n<details><summary>every check</summary>{table_html}</details>"


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
td, th {{ border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }}
.sev-critical {{ color: #b2182b; font-weight: bold; }}
.sev-warning {{ color: #d46a00; font-weight: bold; }}
.sev-info {{ color: #4c78a8; }}
tr.state-off td {{ background: #fff4e5; }}
details {{ margin: 0.3em 0; }}
details:target {{ outline: 2px solid #f58518; }}
pre {{ font-size: 11px; max-height: 24em; overflow: auto; background: #f7f7f7; padding: 6px; }}
</style></head>
<body>
<h1>steplens report: run {run}</h1>
{summary}
<h2>Incidents</h2>
{alerts}
<h2>Checks</h2>
{checks}
{figures}
<script>
// a link to an incident's evidence opens it
function openTarget() {{
  const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (target && target.tagName === "DETAILS") target.open = true;
}}
addEventListener("hashchange", openTarget);
openTarget();
</script>
</body></html>
"""
