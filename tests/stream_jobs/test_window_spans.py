"""A window is judged over its own span: one that covers an incident already paged and over
adds evidence to it and pages nothing (a plain-loop run at the producer's defaults)."""

from __future__ import annotations

from steplens.stream_jobs.engine.detector import RunDetector


def stalled(step: int) -> bool:
    return 1300 <= step < 1340


def step_entry(step: int) -> dict:
    slow = stalled(step)
    return {
        "step": step,
        "time_ns": step * 10**8,
        "loss": 3.0,
        "step_time_s": 1.0 if slow else 0.1,
        "data_time_s": 0.86 if slow else 0.005,
    }


def window(det: RunDetector, first: int, last: int) -> list:
    """The ``step_window`` of steps ``first..last``: its means (the data wait as the worker
    reads it, without its longest)."""
    es = [step_entry(s) for s in range(first, last + 1)]
    mean = {k: sum(e[k] for e in es) / len(es) for k in ("loss", "step_time_s")}
    waits = sorted(e["data_time_s"] for e in es)
    wait = sum(waits[:-1]) / (len(waits) - 1)
    cols = {k: [v] for k, v in mean.items()}
    t = [es[-1]["time_ns"]]
    sigs = det.process_columns(0, [last], t, cols, data_times=[wait], firsts=[first])
    return det.evaluate(sigs, 1, t)


def test_a_window_over_a_stall_that_paged_and_resolved_pages_nothing():
    """Windows of 100 steps; the stalled steps 1300-1339 and the guard's flags of the return
    (1340-1352) go raw: the stall pages and resolves. The window 1300-1399 then arrives with
    a mean data wait share of 0.79 (over 0.3): it joins the incident, it opens none."""
    det = RunDetector("r")
    reports = []
    for first in range(0, 1300, 100):
        reports += window(det, first, first + 99)
    assert reports == []
    for step in range(1300, 1353):
        reports += det.process_entries(0, [step_entry(step)], behind=0)[1]
    opened = [a for a in reports if a.state == "firing"]
    assert [a.rule for a in opened] == ["threshold:data_wait_share"]
    assert [a.state for a in reports][-1] == "resolved"
    after = window(det, 1300, 1399)
    assert after == []  # nothing pages again
    inc = next(iter(det.incidents.closed.values()))
    spans = [m.evidence.get("span_first") for m in inc.members.values()]
    assert 1300 in spans  # the window's evidence is the incident's
    for first in range(1400, 1600, 100):  # the healthy windows after it
        after += window(det, first, first + 99)
    assert after == []
    # a stall seen only in its window (no step sent raw) still pages
    det2 = RunDetector("r")
    for first in range(0, 1300, 100):
        window(det2, first, first + 99)
    got = window(det2, 1300, 1399)
    assert [(a.rule, a.state) for a in got] == [("threshold:data_wait_share", "firing")]


def rank_window(det: RunDetector, rank: int, first: int, last: int, slow: bool) -> list:
    """A window of ``rank`` for two ranks held together by their all-reduce: both take the
    stalled rank's time; only the stalled one waited for its data."""
    es = [step_entry(s) for s in range(first, last + 1)]
    step_time = sum(e["step_time_s"] for e in es) / len(es)
    waits = sorted(e["data_time_s"] if slow else 0.005 for e in es)
    wait = sum(waits[:-1]) / (len(waits) - 1)
    cols = {"loss": [3.0], "step_time_s": [step_time]}
    t = [es[-1]["time_ns"]]
    sigs = det.process_columns(rank, [last], t, cols, data_times=[wait], firsts=[first])
    return det.evaluate(sigs, 1, t)


def test_a_rank_whose_steps_wait_before_the_others_windows_pages_once_as_a_straggler():
    """Rank 1 of two waits for its data at steps 1300-1339 (sent raw: its outliers); rank 0,
    held at its all-reduce, sends only its windows. Rank 1's data wait is held for the
    others' records of its steps; the two ranks' windows 1300-1399 then show that it waited
    alone: one page, a straggler naming rank 1 and its data, from the stall's first steps."""
    det = RunDetector("r")
    reports = []
    for first in range(0, 1300, 100):
        for rank in (0, 1):
            reports += rank_window(det, rank, first, first + 99, slow=False)
    assert reports == []
    for step in range(1300, 1353):
        reports += det.process_entries(1, [step_entry(step)], behind=0)[1]
    assert reports == []  # held for rank 0's records of these steps
    reports += rank_window(det, 1, 1300, 1399, slow=True)
    reports += rank_window(det, 0, 1300, 1399, slow=False)
    opened = [a for a in reports if a.state == "firing"]
    assert [a.rule for a in opened] == ["straggler:data_wait_share"]
    assert 1300 <= opened[0].started_step <= 1305
    lead = [m for m in opened[0].evidence["members"] if m["rule"] == opened[0].rule]
    assert lead and lead[0]["rank"] == 1 and lead[0]["waits_on"] == "data"


def test_a_straggler_sent_raw_beside_its_windows_pages_once_naming_the_rank_that_waits():
    """Two ranks as the Hugging Face Trainer sends them: from step 1300 rank 1 waits for each
    batch (sent raw while its guard flags it), rank 0 waits for it at the all-reduce, so both
    take as long; each rank's window 1201-1300 arrives after its raw step 1300. A step's own
    time is never compared with a window's mean ending at it (that made rank 0 look 1.6x
    slower), and rank 1's window 1301-1400, released on rank 0's step, adds to the incident
    its span covers: one page, the straggler rank 1 waiting on data."""

    def raw(rank: int, step: int) -> list:
        entry = {**step_entry(step), "time_ns": step * 10**8 + rank}
        if rank == 0:  # it waits at the all-reduce, not for its data
            entry["data_time_s"] = 0.005
        return det.process_entries(rank, [entry], behind=0)[1]

    det = RunDetector("r")
    reports = []
    for first in range(1, 1201, 100):
        for rank in (0, 1):
            reports += rank_window(det, rank, first, first + 99, slow=False)
    assert reports == []
    reports += raw(1, 1300)
    reports += rank_window(det, 1, 1201, 1300, slow=False)
    reports += raw(0, 1300)
    reports += rank_window(det, 0, 1201, 1300, slow=False)
    for step in range(1301, 1340):
        reports += raw(1, step)
        if step < 1306:
            reports += raw(0, step)
    reports += rank_window(det, 1, 1301, 1400, slow=True)
    for step in range(1340, 1356):  # rank 1 is back: its return goes raw, as does rank 0's
        reports += raw(1, step)
        reports += raw(0, step)
    reports += rank_window(det, 0, 1301, 1400, slow=False)
    opened = [a for a in reports if a.state == "firing"]  # a page, then its news
    assert len({a.fingerprint for a in opened}) == 1
    assert opened[0].rule == "straggler:data_wait_share"
    for a in opened:
        members = [m for m in a.evidence["members"] if m["rule"].startswith("straggler")]
        assert members and all(m["rank"] == 1 for m in members)
    lead = [m for m in opened[0].evidence["members"] if m["rule"] == opened[0].rule]
    assert lead[0]["waits_on"] == "data"
