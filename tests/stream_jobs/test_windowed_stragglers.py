"""A windowed run's straggler, found from the steps its guard sends at once: 32 ranks, 1 s
steps, windows of 10 steps (ending at the same step on every rank, or in 8 phases as a wide
run's); from step 100 some ranks take longer, and each sends its first five slow steps raw
(what the producer's guard does with a new level) beside its windows."""

from __future__ import annotations

import random

import pytest

from steplens.stream_jobs.engine.detector import RunDetector

RANKS = 32
NS = 10**9


def window(det: RunDetector, rank: int, last: int, step_time: float) -> list:
    cols = {"loss": [2.0], "step_time_s": [step_time]}
    t = [last * NS]
    sigs = det.process_columns(rank, [last], t, cols, firsts=[last - 9])
    return det.evaluate(sigs, 1, t)


def raw(det: RunDetector, rank: int, step: int, step_time: float) -> list:
    entry = {"step": step, "time_ns": step * NS + rank, "loss": 2.0, "step_time_s": step_time}
    return det.process_entries(rank, [entry], behind=0)[1]


def run(
    slow: dict[int, float], raw_steps: int = 5, lasting: bool = True, phases: int = 1
) -> list[tuple[int, object]]:
    """Each rank's windows to step 199; the ``slow`` ranks (rank -> factor) from step 100,
    their first ``raw_steps`` slow steps sent raw (``lasting``: slow to the end, else only
    those steps). ``phases``: rank ``r``'s windows end ``r % phases`` steps after the first
    phase's (a wide run's ranks, ``Identity.phase``), at the slow ranks' first slow steps
    too. Returns (the time of the record that set it off, in steps) and each page."""
    rng = random.Random(3)
    det = RunDetector("r")
    pages: list[tuple[int, object]] = []

    def keep(step: int, got: list) -> None:
        pages.extend((step, a) for a in got if a.state == "firing")

    def base() -> float:
        return 1.0 + abs(rng.gauss(0, 0.02))

    for step in range(200):
        for rank, factor in slow.items():
            if 100 <= step < 100 + raw_steps:
                keep(step, raw(det, rank, step, base() * factor))
        for rank in range(RANKS):
            if step % 10 == (9 + rank % phases) % 10:
                slowed = min(10, step - 99) if lasting and step >= 100 else 0
                factor = 1.0 + (slow.get(rank, 1.0) - 1.0) * slowed / 10
                keep(step, window(det, rank, step, base() * factor))
    return pages


@pytest.mark.parametrize("phases", [1, 8])
def test_a_rank_turned_slow_is_a_straggler_on_its_third_slow_step(phases):
    pages = run({5: 1.8}, phases=phases)
    assert len(pages) == 1
    at, page = pages[0]
    assert page.rule == "straggler:step_time_s"
    lead = [m for m in page.evidence["members"] if m["rule"] == page.rule]
    assert lead[0]["rank"] == 5
    assert at <= 102  # its third slow step, as it came (its first judged alone by then)


@pytest.mark.parametrize("phases", [1, 8])
def test_the_whole_run_slowing_is_no_straggler(phases):
    assert run(dict.fromkeys(range(RANKS), 1.8), phases=phases) == []


@pytest.mark.parametrize("phases", [1, 8])
def test_a_node_of_eight_slowing_pages_its_ranks_on_their_third_slow_step(phases):
    pages = run(dict.fromkeys(range(8, 16), 2.2), phases=phases)
    assert pages and all(p.rule == "straggler:step_time_s" for _, p in pages)
    assert pages[0][0] <= 102
    members = {m["rank"] for _, p in pages for m in p.evidence["members"]}
    assert members <= set(range(8, 16))


@pytest.mark.parametrize("phases", [1, 8])
def test_a_few_slow_steps_are_no_straggler(phases):
    assert run({3: 2.5}, raw_steps=1, lasting=False, phases=phases) == []
    assert run({3: 2.5}, raw_steps=2, lasting=False, phases=phases) == []


def test_a_rank_slow_one_step_before_the_whole_run_is_no_straggler():
    """Rank 0 slows at step 100, every rank from step 101 (each sends its first five slow
    steps raw): rank 0 was alone only at its first slow step."""
    rng = random.Random(5)
    det = RunDetector("r")
    pages = []
    for last in range(9, 100, 10):
        for rank in range(RANKS):
            pages += window(det, rank, last, 1.0 + abs(rng.gauss(0, 0.02)))
    for step in range(100, 130):
        for rank in range(RANKS):
            first = 100 if rank == 0 else 101
            if first <= step < first + 5:
                pages += raw(det, rank, step, 1.8 + abs(rng.gauss(0, 0.02)))
        if step % 10 == 9:
            for rank in range(RANKS):
                pages += window(det, rank, step, 1.8 + abs(rng.gauss(0, 0.02)))
    assert [a for a in pages if a.state == "firing"] == []
