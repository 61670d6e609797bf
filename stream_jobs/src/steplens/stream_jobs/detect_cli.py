"""`steplens detect INPUT.csv --out SCORES.csv`: score a CSV offline with the worker's detectors.

The CSV needs a ``step`` (or ``timestamp``/``time``) column and numeric columns; schema names
(loss, grad_norm, lr, step_time_s, ...) get their own detectors, any other column is a generic
metric (two-sided spikes and ARIMA). Every input row is written back with ``anomaly_score``
(the largest signal score, 0..1), ``alert`` (1 while an alert is firing) and one score column
per signal. Alerts are printed as they fire and resolve.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from datetime import datetime
from typing import TextIO

from steplens.stream_jobs.config import DetectorConfig
from steplens.stream_jobs.core import Alert
from steplens.stream_jobs.detector import RunDetector

STEP_COLUMNS = ("step", "iteration", "iter", "global_step")
TIME_COLUMNS = ("timestamp", "time", "time_ns", "ts", "date", "datetime")


def _number(cell: str) -> float | None:
    cell = cell.strip()
    if not cell:
        return None
    try:
        return float(cell)
    except ValueError:
        low = cell.lower()
        if low in ("nan", "inf", "+inf", "-inf", "infinity", "-infinity"):
            return float(low.replace("infinity", "inf"))
        return None


def _time_ns(cell: str) -> int:
    """Seconds, milliseconds or nanoseconds since the epoch, or an ISO 8601 date."""
    x = _number(cell)
    if x is not None and math.isfinite(x):
        if x > 1e17:
            return int(x)
        if x > 1e11:
            return int(x * 1e6)
        return int(x * 1e9)
    try:
        return int(datetime.fromisoformat(cell.strip()).timestamp() * 1e9)
    except ValueError:
        return 0


def format_alert(a: Alert) -> str:
    head = f"[{a.state:>8}] {a.severity:<8} {a.rule} ({a.scope}) step {a.step}"
    return f"{head}: {a.summary} -- {a.hint}"


def score_rows(
    rows: list[dict[str, str]],
    columns: list[str],
    cfg: DetectorConfig | None = None,
    out: TextIO | None = None,
) -> tuple[list[dict[str, float]], list[str]]:
    """Run the detectors over ``rows``; returns per-row result columns and the signal columns."""
    det = RunDetector("detect", cfg or DetectorConfig(), fit_inline=True, generic=True)
    low = {c.lower(): c for c in columns}
    step_col = next((low[c] for c in STEP_COLUMNS if c in low), None)
    time_col = next((low[c] for c in TIME_COLUMNS if c in low), None)
    metric_cols = [c for c in columns if c not in (step_col, time_col)]
    results: list[dict[str, float]] = []
    signal_cols: dict[str, None] = {}
    for i, row in enumerate(rows):
        step = i
        if step_col is not None:
            s = _number(row.get(step_col) or "")
            step = int(s) if s is not None and math.isfinite(s) else i
        t_ns = _time_ns(row.get(time_col) or "") if time_col else 0
        metrics: dict[str, float] = {}
        for c in metric_cols:
            x = _number(row.get(c) or "")
            if x is not None:
                metrics[c] = x
        sigs = det.process_step(0, step, t_ns, metrics)
        alerts = det.evaluate(sigs)
        res: dict[str, float] = {}
        top = 0.0
        for sig in sigs:
            col = f"{sig.name}_{sig.metric}"
            if sig.score > res.get(col, -1.0):
                res[col] = sig.score
            top = max(top, sig.score)
            signal_cols[col] = None
        res["anomaly_score"] = min(1.0, top)
        res["alert"] = 1.0 if det.rules.firing else 0.0
        results.append(res)
        if out is not None:
            for a in alerts:
                print(format_alert(a), file=out)
    return results, list(signal_cols)


def main(argv: list[str], prog: str = "steplens detect") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("input", help="CSV with a step or timestamp column and numeric columns")
    ap.add_argument("--out", required=True, help="CSV to write the scored rows to")
    ap.add_argument("--no-arima", action="store_true", help="skip the ARIMA baselines")
    ap.add_argument(
        "--arima-refit-every",
        type=int,
        default=10_000,
        help="values between ARIMA refits (the worker refits every 2,000)",
    )
    ap.add_argument("--quiet", action="store_true", help="do not print the alerts")
    args = ap.parse_args(argv)
    cfg = DetectorConfig(arima_enabled=not args.no_arima)
    cfg.arima.refit_every = args.arima_refit_every
    started = time.perf_counter()
    try:
        with open(args.input, newline="") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or [])
            rows = list(reader)
    except OSError as exc:
        print(f"{prog}: cannot read {args.input}: {exc}", file=sys.stderr)
        return 2
    if not columns:
        print(f"{prog}: {args.input} has no header", file=sys.stderr)
        return 2
    results, signal_cols = score_rows(rows, columns, cfg, None if args.quiet else sys.stdout)
    header = [*columns, "anomaly_score", "alert", *signal_cols]
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for row, res in zip(rows, results, strict=True):
            w.writerow(
                [
                    *(row.get(c, "") for c in columns),
                    f"{res['anomaly_score']:.4f}",
                    int(res["alert"]),
                    *(f"{res.get(c, 0.0):.4f}" for c in signal_cols),
                ]
            )
    elapsed = time.perf_counter() - started
    n_alerts = sum(1 for r in results if r["alert"])
    print(
        f"{len(rows)} rows scored in {elapsed:.2f} s ({len(rows) / max(elapsed, 1e-9):,.0f} "
        f"rows/s); alert firing on {n_alerts} rows -> {args.out}",
        file=sys.stderr,
    )
    return 0
