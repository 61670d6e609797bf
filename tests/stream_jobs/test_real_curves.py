"""Real training curves replayed through the detectors with their default settings, as
``steplens detect`` runs them (the bench's data: ``bench/data/quality``): healthy runs stay
within the false-alarm budget, and the spikes and incidents in real logs are caught."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

from event_scoring import onsets_of, score
from steplens.stream_jobs.offline.cli import score_rows

DATA = Path(__file__).parents[2] / "bench" / "data" / "quality"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())


def replay(entry: dict) -> tuple[list[int], list[int]]:
    """The file's steps and the rows where an incident opens."""
    path = DATA / entry["path"]
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], [r for r in rows[1:] if r]
    results, _ = score_rows(rows, header, None, io.StringIO())
    return [int(r[0]) for r in rows], onsets_of([bool(r[1]) for r in results])


def files(kind: str) -> list[dict]:
    return [e for e in MANIFEST["files"] if e["kind"] == kind]


def test_healthy_runs_raise_at_most_one_incident_per_5000_steps():
    onsets, steps = 0, 0
    for entry in files("healthy"):
        at, opened = replay(entry)
        onsets += len(opened)
        steps += at[-1] - at[0] + 1
    assert steps > 200_000
    assert onsets <= steps / 5000, (onsets, steps)


def test_loss_spikes_in_a_real_run_are_caught_in_the_row_they_happen():
    """Megatron-LM's Mixtral release test (H100): 5 loss spikes plain in the log; each caught
    within 2 logged rows, and nothing else raised."""
    (entry,) = [e for e in files("incident_log_evident") if "h100" in e["path"]]
    at, opened = replay(entry)
    row = {s: i for i, s in enumerate(at)}
    events = [(row[o["step"]], row[o["step"]]) for o in entry["onsets"]]
    q = score(events, opened, tolerance=2, before=2)
    assert (q.events, q.detected) == (5, 5) and q.precision == 1.0


def test_documented_incidents_are_caught_within_two_rows():
    """The BigScience chronicles' spikes and the nanoGPT NaN, from log excerpts of a few rows
    (the detectors see no history before them): all but two. Not caught: a divergence whose
    record has no loss value at all, and a 4 % throughput drop after three rows of history."""
    caught, events = 0, 0
    for entry in files("incident_documented"):
        at, opened = replay(entry)
        row = {s: i for i, s in enumerate(at)}
        evs = [(row[o["step"]], row[o["step"]]) for o in entry["onsets"] if o["step"] in row]
        q = score(evs, opened, tolerance=2, before=2)
        caught += q.detected
        events += len(entry["onsets"])
        assert q.precision == 1.0 or not opened
    assert (caught, events) == (9, 11)
