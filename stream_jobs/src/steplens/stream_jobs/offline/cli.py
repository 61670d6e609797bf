"""`steplens detect INPUT.csv --out SCORES.csv`: score a CSV offline with the worker's detectors.

The CSV needs a ``step`` (or ``timestamp``/``time``) column and numeric columns; schema names
(loss, grad_norm, lr, step_time_s, ...) get their own detectors, any other column is a generic
metric (two-sided spikes and ARIMA). Every input row is written back with ``anomaly_score``
(the largest calibrated anomaly score, 0..1: 0.9999 is about once in 10,000 values of that
series), ``alert`` (1 while an incident is open) and one score column per signal. Incidents
(the alerts of one event, with the most specific hint) are printed as they open, escalate and
resolve.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TextIO

import numpy as np

from steplens.stream_jobs.engine.core import Alert, Signals
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals import arima, registry
from steplens.stream_jobs.engine.signals.registry import DetectorConfig

STEP_COLUMNS = ("step", "iteration", "iter", "global_step")
TIME_COLUMNS = ("timestamp", "time", "time_ns", "ts", "date", "datetime")
# a column no signal scored in a row (written as 0); scores above it are kept, as the
# largest score of the row's signals for that column
ABSENT = -1.0
CHUNK_ROWS = 4096  # rows scored at a time, one metric after the other


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


def read_rows(f: TextIO) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of a CSV, each row padded or cut to the header's width
    (blank lines are skipped, as ``csv.DictReader`` does)."""
    reader = csv.reader(f)
    columns = next(reader, [])
    n = len(columns)
    rows = []
    for cells in reader:
        if not cells:
            continue
        rows.append(cells if len(cells) == n else (cells + [""] * (n - len(cells)))[:n])
    return columns, rows


def score_rows(
    rows: list[list[str]],
    columns: list[str],
    cfg: DetectorConfig | None = None,
    out: TextIO | None = None,
) -> tuple[list[list[float]], list[str]]:
    """Run the detectors over ``rows`` (lists of cells in ``columns`` order); returns per-row
    results and the signal columns. A row's results are ``[anomaly_score, alert, *scores]``,
    one score per signal column known by then, ``ABSENT`` where no signal scored that column
    (shorter rows: the later columns are absent too)."""
    det = RunDetector("detect", cfg or DetectorConfig(), fit_inline=True, generic=True)
    index = {c: i for i, c in enumerate(columns)}  # a repeated name: its last column
    low = {c.lower(): c for c in columns}
    step_col = next((low[c] for c in STEP_COLUMNS if c in low), None)
    time_col = next((low[c] for c in TIME_COLUMNS if c in low), None)
    step_at = index[step_col] if step_col is not None else -1
    time_at = index[time_col] if time_col is not None else -1
    metric_at = [(c, index[c]) for c in columns if c not in (step_col, time_col)]
    results: list[list[float]] = []
    signal_cols: dict[str, int] = {}  # column -> its index in a row's results
    width = 2  # anomaly_score, alert, then the signal columns
    metric_names = list(dict.fromkeys(c for c, _ in metric_at))  # a repeated name once
    metric_cols = [(c, index[c]) for c in metric_names]
    for lo in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[lo : lo + CHUNK_ROWS]
        steps: list[int] = []
        times: list[int] = []
        for i, row in enumerate(chunk, lo):
            step = i
            if step_at >= 0:
                cell = row[step_at]
                s: float | None
                try:
                    s = float(cell)  # the common case; _number handles the rest
                except ValueError:
                    s = _number(cell)
                if s is not None and math.isfinite(s):
                    step = int(s)
            steps.append(step)
            times.append(_time_ns(row[time_at]) if time_at >= 0 else 0)
        cells: dict[str, Sequence[float | None]] = {}
        for c, at in metric_cols:
            raw = [row[at] for row in chunk]
            try:
                cells[c] = list(map(float, raw))  # the common case: every cell a number
            except ValueError:
                cells[c] = [_number(cell) if cell else None for cell in raw]
        batch = det.process_columns(0, steps, times, cells)
        width = _add_columns(batch, signal_cols, width)
        res = np.full((len(chunk), width), ABSENT)
        for sigs in batch:
            j = signal_cols[f"{sigs.name}_{sigs.metric}"]
            np.fmax.at(res[:, j], sigs.row, sigs.score)
        # the row's largest score (0 when none is above 0), at most 1
        top = np.fmax(res[:, 2:].max(axis=1, initial=0.0), 0.0) if width > 2 else 0.0
        res[:, 0] = np.fmin(top, 1.0)
        for i, alerts in enumerate(det.incident_rows(batch, len(chunk), times)):
            res[i, 1] = 1.0 if det.incidents.open else 0.0
            if alerts and out is not None:
                for a in alerts:
                    print(format_alert(a), file=out)
        results += res.tolist()
    return results, list(signal_cols)


def _add_columns(batch: list[Signals], signal_cols: dict[str, int], width: int) -> int:
    """Give the signals' columns that are new in ``batch`` their place, in the order a row
    after row reading would meet them; returns the new width."""
    first: dict[str, tuple[int, int]] = {}  # column -> (row, place in the batch)
    for p, sigs in enumerate(batch):
        col = f"{sigs.name}_{sigs.metric}"
        if len(sigs) and col not in signal_cols:
            key = (int(sigs.row[0]), p)
            if col not in first or key < first[col]:
                first[col] = key
    for col in sorted(first, key=first.__getitem__):
        signal_cols[col] = width
        width += 1
    return width


def write_rows(
    f: TextIO,
    columns: list[str],
    signal_cols: list[str],
    rows: list[list[str]],
    results: list[list[float]],
) -> None:
    """Write the header and each input row with its results (``score_rows``), byte for byte
    as ``csv.writer`` would."""
    w = csv.writer(f)
    w.writerow([*columns, "anomaly_score", "alert", *signal_cols])
    n = 2 + len(signal_cols)
    # a row's results in one format call: 4 decimals, the alert as an integer, absent as 0
    fmt = ",".join(["%.4f", "%d", *["%.4f"] * len(signal_cols)])
    pad = [ABSENT] * n
    lines: list[str] = []
    for row, res in zip(rows, results, strict=True):
        full = res if len(res) == n else res + pad[len(res) :]
        if ABSENT in full:  # results hold no NaN and nothing below ABSENT
            full = [v if v > ABSENT else 0.0 for v in full]
        tail = fmt % tuple(full)
        line = ",".join(row)
        if line.count(",") == len(row) - 1 and not ('"' in line or "\r" in line or "\n" in line):
            lines.append(f"{line},{tail}\r\n")  # no field csv.writer would quote
            if len(lines) >= 4096:
                f.write("".join(lines))
                lines.clear()
        else:
            f.write("".join(lines))
            lines.clear()
            w.writerow([*row, *tail.split(",")])
    f.write("".join(lines))


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
    # before the clock starts: the compiled loops (compiled at their first use on a machine,
    # then loaded from numba's cache) and statsmodels (once per process)
    t = time.perf_counter()
    registry.warm_up()
    loaded = f"; before: compiled loops ready in {time.perf_counter() - t:.1f} s"
    if cfg.arima_enabled:
        t = time.perf_counter()
        arima.warm_up()
        loaded += f", statsmodels loaded in {time.perf_counter() - t:.1f} s"
    started = time.perf_counter()
    try:
        with open(args.input, newline="") as f:
            columns, rows = read_rows(f)
    except OSError as exc:
        print(f"{prog}: cannot read {args.input}: {exc}", file=sys.stderr)
        return 2
    if not columns:
        print(f"{prog}: {args.input} has no header", file=sys.stderr)
        return 2
    results, signal_cols = score_rows(rows, columns, cfg, None if args.quiet else sys.stdout)
    index = {c: i for i, c in enumerate(columns)}
    picks = [index[c] for c in columns]
    if picks != list(range(len(columns))):  # a repeated name repeats its last column
        rows = [[row[j] for j in picks] for row in rows]
    with open(args.out, "w", newline="") as f:
        write_rows(f, columns, signal_cols, rows, results)
    elapsed = time.perf_counter() - started
    n_alerts = sum(1 for r in results if r[1])
    print(
        f"{len(rows)} rows scored in {elapsed:.2f} s ({len(rows) / max(elapsed, 1e-9):,.0f} "
        f"rows/s{loaded}); alert firing on {n_alerts} rows -> {args.out}",
        file=sys.stderr,
    )
    return 0
