"""Detection quality on real public data, beside a rolling z-score baseline run in the same process.

Corpora (``bench/data/quality``, licenses and sources in its README and MANIFEST.json):

* ``smd``: labelled server-machine telemetry (SMD, 5 machines, 6 metrics each, 66 events);
* ``healthy``: 7 real training runs without a reported incident (false alarms per 10,000 steps);
* ``documented``: real training logs around documented incidents (loss spikes, a divergence, a
  NaN, a throughput drop; BigScience's chronicles and a nanoGPT issue), onsets from the source;
* ``log-evident``: 4 real runs with loss spikes plain in their logs (Megatron-LM's Mixtral
  release test), onsets labelled by a fixed rule (see the data's README).

Every corpus is scored by steplens' detectors (the code ``steplens detect`` and the worker run,
default settings) and by a plain rolling z-score: per metric, the mean and standard deviation of
the previous ``--z-window`` values; a row breaches when any metric is ``--z`` deviations away; an
alert starts at a breach and ends after 10 rows without one (steplens' own resolve time).
Event-level precision, recall and F1 without point adjustment, the median delay in rows, alert
onsets per 10,000 healthy steps, and the threshold-free average precision of the per-row score
(``event_scoring``). The bench downloads nothing.

    python bench/bench_detect_quality.py                  # every corpus, about a minute
    python bench/bench_detect_quality.py --corpus smd
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from event_scoring import (
    NO_QUALITY,
    Quality,
    average_precision,
    events_of,
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
    return Series(name, steps, columns, missing, labels, onsets)


KINDS = {
    "smd": "labelled_machine_telemetry",
    "healthy": "healthy",
    "documented": "incident_documented",
    "log-evident": "incident_log_evident",
}


def corpus(kind: str) -> list[tuple[dict, Series]]:
    """The files of one corpus (``KINDS``; "incidents": documented and log-evident ones)."""
    manifest = json.loads((DATA / "MANIFEST.json").read_text())
    want = {KINDS["documented"], KINDS["log-evident"]} if kind == "incidents" else {KINDS[kind]}
    return [(entry, load(entry)) for entry in manifest["files"] if entry["kind"] in want]


# ---------------------------------------------------------------------------------------- detectors
@dataclass
class Verdict:
    score: np.ndarray  # per row
    onsets: list[int]  # rows where an alert starts


def rolling_z(s: Series, window: int, z: float) -> Verdict:
    """The baseline: per metric, |x - mean| / std over the previous ``window`` values."""
    n = len(s.steps)
    top = np.zeros(n)
    for x in s.columns.values():
        filled = np.where(np.isnan(x), np.nan, x)
        zs = np.zeros(n)
        if n > window:
            win = np.lib.stride_tricks.sliding_window_view(filled[:-1], window)
            with np.errstate(invalid="ignore", divide="ignore"):
                mu = np.nanmean(win, axis=1)
                sd = np.nanstd(win, axis=1)
                zz = np.abs(filled[window:] - mu) / sd
            zz[~np.isfinite(zz)] = 0.0
            zs[window:] = zz
        top = np.maximum(top, zs)
    return Verdict(top, onsets_of(_hold(top >= z, RESOLVE_ROWS)))


def _hold(breach: np.ndarray, rows: int) -> list[bool]:
    """Firing from a breach until ``rows`` rows without one."""
    out, quiet, on = [], 0, False
    for b in breach.tolist():
        if b:
            on, quiet = True, 0
        elif on:
            quiet += 1
            on = quiet < rows
        out.append(on)
    return out


def steplens(s: Series) -> Verdict:
    """steplens' detectors with default settings, as ``steplens detect`` runs them."""
    from steplens.stream_jobs.offline.cli import score_rows

    names, rows = s.rows()
    results, _ = score_rows(rows, names, None, io.StringIO())
    res = np.asarray(results)
    return Verdict(res[:, 0], onsets_of(res[:, 1].astype(bool).tolist()))


# ---------------------------------------------------------------------------------------- scoring
def events_in_rows(s: Series) -> list[tuple[int, int]]:
    if s.labels is not None:
        return events_of(s.labels.tolist())
    rows = {int(st): i for i, st in enumerate(s.steps.tolist())}
    return [(rows[o], rows[o]) for o in s.onsets if o in rows]


@dataclass
class Tally:
    quality: Quality = NO_QUALITY
    onsets: int = 0
    steps: int = 0  # iterations spanned
    points: int = 0  # logged rows
    ap: list[float] = field(default_factory=list)
    seconds: float = 0.0


def run(kind: str, detectors: dict[str, Callable[[Series], Verdict]], tolerance: int) -> None:
    items = corpus(kind)
    tallies = {name: Tally() for name in detectors}
    per_file: list[str] = []
    for _, s in items:
        events = events_in_rows(s)
        line = [f"  {s.name[:46]:<46}"]
        for name, detect in detectors.items():
            t0 = time.perf_counter()
            v = detect(s)
            t = tallies[name]
            t.seconds += time.perf_counter() - t0
            q = score(events, v.onsets, tolerance, 0 if s.labels is not None else tolerance)
            t.quality = t.quality + q
            t.onsets += len(v.onsets)
            t.points += len(s.steps)
            t.steps += int(s.steps[-1] - s.steps[0]) + 1 if len(s.steps) else 0
            if s.labels is not None:
                t.ap.append(average_precision(v.score.tolist(), s.labels.tolist()))
            line.append(f"{name}: {q.detected}/{q.events} ev, {len(v.onsets)} onsets")
        per_file.append("  ".join(line))
    around = "after its end" if kind == "smd" else "before or after it"
    print(
        f"\n== {kind} ({len(items)} files; an onset counts for an event up to {tolerance} rows "
        f"{around})"
    )
    print("\n".join(per_file))
    for name, t in tallies.items():
        q = t.quality
        msg = [f"{name:>10}:"]
        if q.events:
            msg.append(
                f"recall {q.recall:.3f} precision {q.precision:.3f} F1 {q.f1:.3f} "
                f"median delay {q.median_delay:.1f} rows ({q.detected}/{q.events} events, "
                f"{q.onsets} onsets)"
            )
        else:
            msg.append(
                f"{t.onsets} alert onsets in {t.steps:,} steps ({t.points:,} logged points): "
                f"{1e4 * t.onsets / max(t.steps, 1):.2f} per 10,000 steps, "
                f"{1e4 * t.onsets / max(t.points, 1):.2f} per 10,000 points"
            )
        if t.ap:
            msg.append(f"AP {np.nanmean(t.ap):.3f}")
        msg.append(f"[{t.seconds:.1f} s]")
        print(" ".join(msg))
    names = list(tallies)
    if len(names) == 2 and tallies[names[0]].quality.events:
        a, b = (tallies[n].quality.f1 for n in names)
        print(f"F1 ratio {names[0]} / {names[1]}: {a / b if b else math.inf:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=[*KINDS, "incidents", "all"], default="all")
    ap.add_argument("--z", type=float, default=3.0, help="baseline threshold (deviations)")
    ap.add_argument("--z-window", type=int, default=100, help="baseline window (rows)")
    ap.add_argument("--tolerance", type=int, default=None, help="rows after an event's end")
    args = ap.parse_args()
    detectors = {
        "steplens": steplens,
        "z-score": lambda s: rolling_z(s, args.z_window, args.z),
    }
    kinds = list(KINDS) if args.corpus == "all" else [args.corpus]
    for kind in kinds:
        tol = (
            args.tolerance if args.tolerance is not None else (RESOLVE_ROWS if kind == "smd" else 2)
        )
        run(kind, detectors, tol)


if __name__ == "__main__":
    main()
