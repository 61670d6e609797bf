"""A run wider than its ``series_ranks``: ranks past it keep no series of their own, yet a
run-wide loss spike pages (the followed ranks see it), a non-finite loss on any rank pages,
and a straggler past it is still found against the other ranks."""

from __future__ import annotations

import math
import random

from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals.dynamic_baseline import split_key
from steplens.stream_jobs.engine.signals.registry import DetectorConfig

RANKS = 8


def members_firing(alerts: list) -> list[tuple[str, int | None]]:
    """The members, as (rule, rank), of the incidents that fired."""
    return [
        (m["rule"], m.get("rank"))
        for a in alerts
        if a.state == "firing"
        for m in a.evidence["members"]
    ]


def run(series_ranks: int, loss_at=lambda rank, step, base: base, slow_rank: int = -1) -> tuple:
    """``RANKS`` ranks sending every step (one record each), 1 s steps; returns the detector
    and its incidents' members that fired, as (rule, rank)."""
    rng = random.Random(3)
    det = RunDetector("r", DetectorConfig(series_ranks=series_ranks))
    fired = []
    for step in range(240):
        for rank in range(RANKS):
            base = 3.0 * math.exp(-step / 400) + rng.gauss(0, 0.01)
            slow = rank == slow_rank and step >= 180
            entry = {
                "step": step,
                "time_ns": (step + 1) * 10**9 + rank,
                "loss": loss_at(rank, step, base),
                "grad_norm": 1.0 + rng.gauss(0, 0.02),
                "step_time_s": (1.8 if slow else 1.0) + rng.gauss(0, 0.01),
            }
            _, alerts = det.process_entries(rank, [entry], behind=0)
            fired += members_firing(alerts)
    return det, fired


def rules(fired: list) -> set[str]:
    return {rule for rule, _ in fired}


def test_ranks_past_the_cap_keep_no_series_and_are_counted():
    det, fired = run(series_ranks=2)
    assert fired == []  # a healthy run pages nothing either way
    assert all(det.series[r] for r in (0, 1))
    assert not any(det.series[r] for r in range(2, RANKS))
    # the 7-day baselines of step time and tokens/s: the followed ranks' only
    scopes = {split_key(k)[0] for k in det.run_states["baseline"].series}
    assert scopes == {"rank:0", "rank:1"}
    assert det.run.unfollowed == 240 * (RANKS - 2)
    assert run(series_ranks=RANKS)[0].run.unfollowed == 0


def test_a_run_wide_loss_spike_pages_from_the_followed_ranks():
    def spike(rank: int, step: int, base: float) -> float:
        return base * 4 if step == 200 else base

    _, capped = run(series_ranks=2, loss_at=spike)
    _, full = run(series_ranks=RANKS, loss_at=spike)
    assert "spike:loss" in rules(full)
    assert "spike:loss" in rules(capped)


def test_a_non_finite_loss_past_the_cap_pages_on_its_rank():
    def nan_on_7(rank: int, step: int, base: float) -> float:
        return math.nan if rank == 7 and step == 150 else base

    _, fired = run(series_ranks=2, loss_at=nan_on_7)
    assert ("nonfinite:loss", 7) in fired


def test_a_straggler_past_the_cap_is_found_against_the_other_ranks():
    _, fired = run(series_ranks=2, slow_rank=6)
    assert ("straggler:step_time_s", 6) in fired


def test_a_non_finite_grad_norm_past_the_cap_pages_on_its_rank():
    """Only the loss of a rank past the cap is read for the run; its other metrics are still
    checked for a non-finite value, one step's and a window's peak."""
    det = RunDetector("r", DetectorConfig(series_ranks=2))
    fired = []
    for step in range(60):
        for rank in range(RANKS):
            entry = {
                "step": step,
                "time_ns": (step + 1) * 10**9 + rank,
                "loss": 3.0,
                "grad_norm": math.inf if (rank, step) == (5, 40) else 1.0,
                "step_time_s": 1.0,
            }
            _, alerts = det.process_entries(rank, [entry], behind=0)
            fired += members_firing(alerts)
    assert ("nonfinite:grad_norm", 5) in fired
    assert not [f for f in fired if f[1] != 5]
