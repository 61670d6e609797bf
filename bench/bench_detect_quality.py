"""Detection quality on real public data, beside two baselines run in the same process.

Corpora (``bench/data/quality``, licenses and sources in its README and MANIFEST.json):

* labelled machine and service telemetry, one row per minute (``smd``: SMD, 5 machines;
  ``psm``: eBay's Pooled Server Metrics, 6 days in two files) or per 5 minutes (``asd``: ASD,
  12 application servers; ``js2``, ``js3``: JumpStarter's Dataset2 and Dataset3, 8 services
  each, raw counters); every file is ``tune`` or ``holdout``;
* ``healthy``: 7 real training runs without a reported incident (false alarms per 10,000 steps);
* ``documented``: real training logs around documented incidents, onsets from the source;
* ``log-evident``: 4 real runs with loss spikes plain in their logs, onsets by a fixed rule.

Detectors, all in this process:

* ``steplens``: its detectors and alerts with default settings, as ``steplens detect`` runs them;
* ``steplens@T``: the same detectors' per-row ``anomaly_score`` (a calibrated rarity: 0.9999
  is "once in 10,000 values of this series") with one threshold ``T`` for every corpus, chosen
  once on the ``tune`` files (the best mean F1 over the labelled corpora); beside it, each
  corpus' own best threshold, to show what one threshold costs;
* ``z-score``: per metric, ``|x - mean| / std`` over the previous ``--z-window`` values;
* ``arima``: per metric, statsmodels' ARIMA(1,1,1) fitted (Hannan-Rissanen) on the file's
  first ``--arima-fit`` rows, then run over the whole file with those parameters (a rolling
  one-step forecast, Kalman filter); the score is the standardized one-step forecast error.

A row's score is its largest over the metrics; an alert starts at a row at or above the
threshold and ends after 10 rows without one (steplens' own resolve time). Each baseline gets its
best threshold per corpus, swept over a grid on all that corpus' files (on ``healthy`` and
``documented``: the one best on ``log-evident``), so the baselines are shown at their best.

Scores, per corpus: event-level precision, recall and F1 **without point adjustment** (an alert
starting inside an event, or up to 10 rows after it, detects it once; every other alert is a
false one). Point adjustment (counting every row of an event as found once any row is) inflates
scores: one lucky alert in a long event counts as hundreds of true rows, so a detector that
fires at random scores well on data with long events. Also: the share of series-days (one file,
one day) with at least one false alert, the threshold-free average precision (AP) of the
per-row score, the median delay, and the seconds each part took. The bench downloads nothing.

    python bench/bench_detect_quality.py                  # every corpus, a few minutes
    python bench/bench_detect_quality.py --corpus asd
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from event_scoring import (
    NO_QUALITY,
    Quality,
    average_precision,
    events_of,
    false_onsets,
    onsets_of,
    score,
)

DATA = Path(__file__).parent / "data" / "quality"
RESOLVE_ROWS = 10


@dataclass
class Series:
    """One CSV: its steps and metric columns (NaN where the source has no value)."""

    name: str
    steps: np.ndarray
    columns: dict[str, np.ndarray]  # NaN where the source has no value, or logged NaN
    missing: dict[str, np.ndarray]  # bool: no value in the source (an empty cell)
    labels: np.ndarray | None = None  # per row (SMD)
    onsets: list[int] = field(default_factory=list)  # labelled onset steps (training incidents)
    split: str = "tune"  # labelled telemetry: "tune" or "holdout"
    rows_per_day: int = 0  # labelled telemetry: rows in a day

    def rows(self) -> tuple[list[str], list[list[str]]]:
        names = ["step", *self.columns]
        cols = [self.steps.astype(np.int64).astype(str).tolist()] + [
            ["" if gone else repr(v) for v, gone in zip(c.tolist(), miss.tolist(), strict=True)]
            for c, miss in zip(self.columns.values(), self.missing.values(), strict=True)
        ]
        return names, [list(r) for r in zip(*cols, strict=True)]


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    raw = gzip.open(path, "rt") if path.suffix == ".gz" else open(path)  # noqa: SIM115
    with raw as f:
        reader = csv.reader(f)
        header = next(reader)
        return header, [r for r in reader if r]


def load(entry: dict) -> Series:
    header, rows = read_csv(DATA / entry["path"])
    cells = list(zip(*rows, strict=True))

    def col(i: int) -> np.ndarray:
        return np.array([float(c) if c else math.nan for c in cells[i]])

    steps = col(0).astype(np.int64)
    names = header[1:]
    labels = None
    if "label" in names:
        labels = col(header.index("label")).astype(np.int8)
        names = [n for n in names if n != "label"]
    columns = {n: col(header.index(n)) for n in names}
    missing = {n: np.array([not c for c in cells[header.index(n)]]) for n in names}
    onsets = [o["step"] for o in entry.get("onsets", entry.get("labelled_onsets", []))]
    name = Path(entry["path"]).name.split(".")[0]
    split, per_day = entry.get("split", "tune"), entry.get("rows_per_day", 0)
    return Series(name, steps, columns, missing, labels, onsets, split, per_day)


LABELLED = ("smd", "asd", "js2", "js3", "psm")  # MANIFEST "corpus" of labelled telemetry
TRAINING = {
    "healthy": "healthy",
    "documented": "incident_documented",
    "log-evident": "incident_log_evident",
}  # MANIFEST "kind" of training logs
CORPORA = (*LABELLED, *TRAINING)


def corpus(name: str) -> list[Series]:
    """The files of one corpus (``CORPORA``)."""
    manifest = json.loads((DATA / "MANIFEST.json").read_text())
    if name in LABELLED:
        return [load(e) for e in manifest["files"] if e.get("corpus") == name]
    return [load(e) for e in manifest["files"] if e["kind"] == TRAINING[name]]


# ---------------------------------------------------------------------------------------- detectors
def rolling_z(s: Series, window: int) -> np.ndarray:
    """Per row, the largest over metrics of ``|x - mean| / std`` of the previous ``window``."""
    n = len(s.steps)
    top = np.zeros(n)
    for x in s.columns.values():
        if n <= window:
            continue
        win = np.lib.stride_tricks.sliding_window_view(x[:-1], window)
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows
            zz = np.abs(x[window:] - np.nanmean(win, axis=1)) / np.nanstd(win, axis=1)
        zz[~np.isfinite(zz)] = 0.0
        top[window:] = np.maximum(top[window:], zz)
    return top


def arima(s: Series, fit_rows: int) -> np.ndarray:
    """Per row, the largest over metrics of the standardized one-step forecast error of an
    ARIMA(1,1,1) fitted (statsmodels) on the first ``fit_rows`` rows, then run over all."""
    from statsmodels.tsa.arima.model import ARIMA

    n = len(s.steps)
    top = np.zeros(n)
    for x in s.columns.values():
        head = x[:fit_rows]
        head = head[np.isfinite(head)]  # the estimator needs no gaps; the filter handles them
        if len(head) < 30 or not np.std(head) > 0:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Hannan-Rissanen: a tenth of the exact likelihood fit's time, near its estimates
            model = ARIMA(
                head, order=(1, 1, 1), enforce_stationarity=False, enforce_invertibility=False
            )
            try:
                res = model.fit(method="hannan_rissanen")
            except (ValueError, np.linalg.LinAlgError):
                res = model.fit()
            err = res.apply(x).filter_results.standardized_forecasts_error[0]
        err = np.abs(err)
        err[:2] = 0.0  # the diffuse start of the differenced series
        err[~np.isfinite(err)] = 0.0
        top = np.maximum(top, err)
    return top


@dataclass
class Steplens:
    score: np.ndarray  # per row: the largest calibrated anomaly score (0..1)
    onsets: list[int]  # rows where an incident opens (its alerts)


def steplens(s: Series) -> Steplens:
    """steplens' detectors with default settings, as ``steplens detect`` runs them."""
    from steplens.stream_jobs.offline.cli import score_rows

    names, rows = s.rows()
    results, _ = score_rows(rows, names, None, io.StringIO())
    res = np.asarray(results)
    return Steplens(np.nan_to_num(res[:, 0]), onsets_of(res[:, 1].astype(bool).tolist()))


def alerts_at(top: np.ndarray, threshold: float) -> list[int]:
    """Onsets of alerts that fire from a row at or above ``threshold`` until ``RESOLVE_ROWS``
    rows without one: a breach opens an alert when the previous one is that far back."""
    at = np.flatnonzero(top >= threshold)
    if not len(at):
        return []
    return [int(at[0]), *at[1:][np.diff(at) >= RESOLVE_ROWS].tolist()]


# ---------------------------------------------------------------------------------------- scoring
def events_in_rows(s: Series) -> list[tuple[int, int]]:
    if s.labels is not None:
        return events_of(s.labels.tolist())
    rows = {int(st): i for i, st in enumerate(s.steps.tolist())}
    return [(rows[o], rows[o]) for o in s.onsets if o in rows]


@dataclass
class Tally:
    """One detector's result over some files."""

    quality: Quality = NO_QUALITY
    onsets: int = 0
    steps: int = 0  # iterations spanned
    points: int = 0  # logged rows
    days: int = 0  # series-days (labelled telemetry)
    false_days: int = 0  # ... with at least one false alert
    ap: list[float] = field(default_factory=list)

    def add(self, s: Series, onsets: list[int], score_row: np.ndarray | None, tol: int) -> None:
        events = events_in_rows(s)
        before = 0 if s.labels is not None else tol
        self.quality = self.quality + score(events, onsets, tol, before)
        self.onsets += len(onsets)
        self.points += len(s.steps)
        self.steps += int(s.steps[-1] - s.steps[0]) + 1 if len(s.steps) else 0
        if s.rows_per_day:
            self.days += -(-len(s.steps) // s.rows_per_day)
            false = false_onsets(events, onsets, tol, before)
            self.false_days += len({t // s.rows_per_day for t in false})
        if s.labels is not None and score_row is not None:
            self.ap.append(average_precision(score_row.tolist(), s.labels.tolist()))

    def line(self) -> str:
        q = self.quality
        if not q.events:
            return (
                f"{self.onsets} alert onsets in {self.steps:,} steps ({self.points:,} points): "
                f"{1e4 * self.onsets / max(self.steps, 1):.2f} per 10,000 steps, "
                f"{1e4 * self.onsets / max(self.points, 1):.2f} per 10,000 points"
            )
        msg = (
            f"P {q.precision:.3f} R {q.recall:.3f} F1 {q.f1:.3f} "
            f"({q.detected}/{q.events} ev, {q.onsets} alerts, delay {q.median_delay:.0f})"
        )
        if self.days:
            share = self.false_days / self.days
            msg += f" false-alert days {self.false_days}/{self.days} ({share:.1%})"
        if self.ap:
            msg += f" AP {np.nanmean(self.ap):.3f}"
        return msg


Z_GRID = (2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0, 50.0, 100.0)
SCORE_GRID = (0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999, 0.999995, 0.999999)


def tally(files: list[tuple[Series, np.ndarray]], threshold: float, tol: int) -> Tally:
    t = Tally()
    for s, top in files:
        t.add(s, alerts_at(top, threshold), top, tol)
    return t


def f1_at(files: list[tuple[Series, np.ndarray]], threshold: float, tol: int) -> float:
    q = NO_QUALITY
    for s, top in files:
        before = 0 if s.labels is not None else tol
        q = q + score(events_in_rows(s), alerts_at(top, threshold), tol, before)
    return q.f1


def best(files: list[tuple[Series, np.ndarray]], grid: tuple[float, ...], tol: int) -> float:
    """The threshold of ``grid`` with the best F1 on ``files`` (the lowest on a tie)."""
    return max(grid, key=lambda g: (f1_at(files, g, tol), -g))


@contextmanager
def timed(clock: dict[str, float], key: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    clock[key] = clock.get(key, 0.0) + time.perf_counter() - t0


@dataclass
class Scored:
    """One corpus' files and every detector's per-row scores."""

    name: str
    files: list[Series]
    steplens: list[Steplens]
    z: list[np.ndarray]
    arima: list[np.ndarray]
    clock: dict[str, float]

    def pairs(self, which: str, split: str | None = None) -> list[tuple[Series, np.ndarray]]:
        tops = {"z": self.z, "arima": self.arima, "score": [v.score for v in self.steplens]}
        return [
            (s, t) for s, t in zip(self.files, tops[which], strict=True) if split in (None, s.split)
        ]


def scored(name: str, z_window: int, arima_fit: int) -> Scored:
    clock: dict[str, float] = {}
    with timed(clock, "load"):
        files = corpus(name)
    with timed(clock, "steplens"):
        sl = [steplens(s) for s in files]
    with timed(clock, "z-score"):
        zs = [rolling_z(s, z_window) for s in files]
    with timed(clock, "arima"):
        ar = [arima(s, arima_fit) for s in files]
    return Scored(name, files, sl, zs, ar, clock)


def tolerance(name: str) -> int:
    return RESOLVE_ROWS if name in LABELLED else 2


def report(
    c: Scored, single: float | None, z_at: float | None, arima_at: float | None
) -> dict[str, Tally]:
    """Print one corpus' results; returns each detector's tally (the baselines at their best
    threshold here, or ``z_at`` / ``arima_at`` when given)."""
    tol = tolerance(c.name)
    out: dict[str, Tally] = {}
    ev = sum(len(events_in_rows(s)) for s in c.files)
    held = sum(s.split == "holdout" for s in c.files) if c.name in LABELLED else 0
    around = "after its end" if c.name in LABELLED else "before or after it"
    print(
        f"\n== {c.name}: {len(c.files)} files ({held} holdout), {ev} events; an alert counts "
        f"for an event from its start to {tol} rows {around}"
    )
    t = Tally()
    for s, v in zip(c.files, c.steplens, strict=True):
        t.add(s, v.onsets, v.score, tol)
    out["steplens"] = t
    lines = [("steplens", "alerts", t)]
    if single is not None:
        t = tally(c.pairs("score"), single, tol)
        out["steplens@T"] = t
        lines.append(("steplens@T", f"T={single:g}", t))
        own = best(c.pairs("score"), SCORE_GRID, tol)
        lines.append(("", f"own best {own:g}", tally(c.pairs("score"), own, tol)))
    for key, at, label in (("z", z_at, "z-score"), ("arima", arima_at, "arima")):
        th = at if at is not None else best(c.pairs(key), Z_GRID, tol)
        t = tally(c.pairs(key), th, tol)
        out[label] = t
        lines.append((label, f"{'at' if at is not None else 'best'} {th:g}", t))
    for label, th, t in lines:
        print(f"  {label:>10} {th:>16}: {t.line()}")
    if held:
        for split in ("tune", "holdout"):
            t = Tally()
            for s, v in zip(c.files, c.steplens, strict=True):
                if s.split == split:
                    t.add(s, v.onsets, v.score, tol)
            print(f"  {'steplens':>10} {split:>16}: {t.line()}")
    print("  time: " + ", ".join(f"{k} {v:.1f} s" for k, v in c.clock.items()))
    return out


def single_threshold(labelled: list[Scored]) -> tuple[float, dict[float, float]]:
    """The anomaly-score threshold with the best mean F1 over the labelled corpora' ``tune``
    files; and that mean per threshold."""
    mean = {
        g: float(np.mean([f1_at(c.pairs("score", "tune"), g, tolerance(c.name)) for c in labelled]))
        for g in SCORE_GRID
    }
    return max(mean, key=lambda g: (mean[g], -g)), mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=[*CORPORA, "labelled", "training", "all"], default="all")
    ap.add_argument("--z-window", type=int, default=100, help="z-score window (rows)")
    ap.add_argument("--arima-fit", type=int, default=600, help="ARIMA fitted on these rows")
    ap.add_argument("--threshold", type=float, default=None, help="steplens@T (default: tuned)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    names = {"all": CORPORA, "labelled": LABELLED, "training": tuple(TRAINING)}.get(
        args.corpus, (args.corpus,)
    )
    done = {n: scored(n, args.z_window, args.arima_fit) for n in names}
    labelled = [done[n] for n in LABELLED if n in done]
    single = args.threshold
    if labelled and single is None:
        single, mean = single_threshold(labelled)
        print(
            "steplens@T: one anomaly-score threshold for every corpus, the best mean F1 on the "
            "tune files: " + ", ".join(f"{g:g} {f:.3f}" for g, f in mean.items())
        )
    results: dict[str, dict[str, Tally]] = {}
    for c in labelled:
        results[c.name] = report(c, single, None, None)
    # training logs: the baselines at the threshold best on log-evident
    z_at = arima_at = None
    if "log-evident" in done:
        c = done["log-evident"]
        z_at, arima_at = (best(c.pairs(k), Z_GRID, tolerance(c.name)) for k in ("z", "arima"))
    for n in TRAINING:
        if n in done:
            at = (None, None) if n == "log-evident" else (z_at, arima_at)
            results[n] = report(done[n], None, *at)
    with_events = [n for n in results if results[n]["steplens"].quality.events]
    if with_events:
        print("\n== F1 per corpus (event-level, no point adjustment)")
        dets = ["steplens", "steplens@T", "z-score", "arima"]
        print(f"  {'corpus':<16}" + "".join(f"{d:>12}" for d in dets))
        pooled = dict.fromkeys(dets, NO_QUALITY)
        for n in with_events:
            row = []
            for d in dets:
                t = results[n].get(d)
                row.append(f"{t.quality.f1:>12.3f}" if t else f"{'-':>12}")
                if t and n in LABELLED:
                    pooled[d] = pooled[d] + t.quality
            print(f"  {n:<16}" + "".join(row))
        print(
            f"  {'labelled pooled':<16}"
            + "".join(f"{pooled[d].f1:>12.3f}" if pooled[d].events else f"{'-':>12}" for d in dets)
        )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
