"""A wide run's ranks keep their periodic records apart (``Identity.phase``): their windows end
at different steps and their heartbeats come at different times, where a small run's come
together as before."""

from __future__ import annotations

import itertools
from collections import Counter

import steplens.producer as sl
from steplens.producer.identity import PHASE_RANKS, Identity
from steplens.producer.instruments.ddp_comm import comm_offset, timed
from steplens.producer.instruments.report_cadence import FOLLOW, ReportCadence, health_news
from steplens.producer.pipeline.window import Window


def phases(world: int, ranks: range) -> Counter[float]:
    return Counter(Identity("r", r, r % 8, world, "h").phase for r in ranks)


def test_a_wide_runs_ranks_and_nodes_spread_evenly_a_small_runs_stay_together() -> None:
    assert set(phases(2 * PHASE_RANKS - 1, range(2 * PHASE_RANKS - 1))) == {0.0}
    wide = phases(16384, range(16384))
    assert len(wide) == 16
    assert all(0.0 <= p < 1.0 for p in wide)
    assert min(wide.values()) >= 0.95 * 1024 and max(wide.values()) <= 1.05 * 1024
    nodes = phases(16384, range(0, 16384, 8))  # the ranks that send the nodes' samples
    assert len(nodes) == 16 and min(nodes.values()) >= 0.9 * 128
    assert len(phases(1024, range(1024))) == 1024 // PHASE_RANKS


def test_a_first_window_is_its_share_of_the_others() -> None:
    w = Window(first_share=0.25)
    ends = []
    for step in range(40):
        w.add_step(step, {"loss": 1.0}, now_ns=step)
        if w.due(step, max_steps=10, max_s=1e9):
            data = w.emit(step)
            assert data is not None
            ends.append((data["step_first"], data["step_last"]))
    assert ends == [(0, 2), (3, 12), (13, 22), (23, 32)]
    timed = Window(first_share=0.5)
    timed.add_step(0, {"x": 1.0}, now_ns=0)
    assert not timed.due(int(0.4e9), max_steps=1000, max_s=1.0)
    assert timed.due(int(0.5e9), max_steps=1000, max_s=1.0)


def test_a_phase_brings_the_first_heartbeat_forward_then_keeps_the_period() -> None:
    reading = {"dropped": {}, "rss_bytes": 1 << 30, "mem_total_bytes": 1 << 34}
    for phase, first in ((0.0, 30), (0.5, 15), (0.75, 10)):
        cadence = ReportCadence(30.0, health_news, FOLLOW, phase=phase)
        sent = [t for t in range(0, 200, 5) if cadence.due(dict(reading), float(t))]
        assert sent[:2] == [0, first]
        assert all(b - a == 30 for a, b in itertools.pairwise(sent[1:]))


def test_a_wide_runs_ranks_end_their_windows_at_different_steps_and_keep_every_step() -> None:
    """Sixteen ranks of a 4,096-rank run through the Monitor at its defaults but for
    ``window_steps``: their first windows end at steps as far apart as their phases, every
    later one is a whole window, and every step is in one window."""
    firsts, lasts = set(), set()
    for rank in range(16):
        tx = sl.MemoryTransport()
        m = sl.Monitor("wide", transport=tx, rank=rank, world_size=4096, hw_interval_s=0,
                       window_steps=16)  # fmt: skip
        for step in range(64):
            m.log_step(step, loss=2.0)
        m.shutdown()
        windows = [r.data for r in tx.records("step_window")]
        covered = [s for w in windows for s in range(w["step_first"], w["step_last"] + 1)]
        assert covered == list(range(64))
        assert all(w["count"] == 16 for w in windows[1:-1])
        firsts.add(windows[0]["step_last"])
        lasts.add(windows[1]["step_last"] - windows[0]["step_last"])
    assert len(firsts) >= 8  # 16 phases, 16 steps a window
    assert lasts == {16}


def test_a_wide_runs_ranks_time_their_all_reduce_at_different_steps_once_a_period() -> None:
    every, world = 100, 16384
    ids = [Identity("r", r, r % 8, world, "h") for r in range(world)]
    per_step = Counter(
        s for i in ids for s in range(1, every + 1) if timed(s, every, comm_offset(every, i.phase))
    )
    assert sum(per_step.values()) == world  # each rank once in a period
    assert len(per_step) == 16 and max(per_step.values()) <= 1.05 * world / 16
    small = [Identity("r", r, r, 8, "h") for r in range(8)]
    assert {
        s for i in small for s in range(1, 301) if timed(s, every, comm_offset(every, i.phase))
    } == {100, 200, 300}
