"""GPU memory judged from the allocator, over recorded sequences of ``hw`` GPU entries (one a
second, as the producer samples them); NVML's share, quiet where the allocator is reported."""

import math

from steplens.stream_jobs.engine.signals import gpu_memory as gm
from steplens.stream_jobs.engine.signals import thresholds

GIB = float(1 << 30)
TOTAL = 80 * GIB


def entry(alloc, reserved, peak=None, retries=0, ooms=0, used=None, limit=None):
    """One GPU entry: NVML's figures with the allocator's (``limit``: reserved + free)."""
    used = reserved + 0.6 * GIB if used is None else used
    return {
        "index": 0,
        "mem_used_bytes": used,
        "mem_total_bytes": TOTAL,
        gm.ALLOCATED: alloc,
        gm.RESERVED: reserved,
        gm.PEAK: alloc if peak is None else peak,
        gm.LIMIT: (reserved + (TOTAL - used)) if limit is None else limit,
        gm.RETRIES: retries,
        gm.OOMS: ooms,
    }


def run(entries, cfg=None, busy=True, steps_per_s=2.0):
    """Feed one entry a second; the breaches (metric, severity, detail) per sample."""
    st, cfg = gm.GpuMemoryState(), cfg or gm.GpuMemoryConfig()
    out = []
    for i, gpu in enumerate(entries):
        sigs = gm.hw(
            st, cfg, {"gpus": [gpu]}, "n1", int(i * 1e9), busy, int(i * steps_per_s), None, 0
        )
        out.append(
            [(s.metric, s.severity, s.detail) for g in sigs for s in g.views() if s.severity]
        )
    return st, out


def test_steady_run_at_95_percent_nvml_used_with_flat_allocated_memory_stays_quiet():
    """A healthy run: the cache holds freed blocks, NVML reads 95 % used for an hour, the
    allocated memory swings within each step around a flat level, the peak is flat."""
    seq = []
    for i in range(3600):
        alloc = 50 * GIB + 8 * GIB * ((i * 7) % 11) / 10  # the step's phase at the sample
        seq.append(entry(alloc, 75.4 * GIB, peak=58 * GIB, used=0.95 * TOTAL))
    _, got = run(seq)
    assert got == [[]] * len(seq)
    # NVML's share stays a signal, quiet for a GPU whose allocator is reported
    st, cfg = thresholds.ThresholdState(), thresholds.ThresholdConfig()
    for gpu in seq[:10]:
        nvml = [
            s
            for g in thresholds.hw(st, cfg, {"gpus": [gpu]}, "n1", None, 0, True)[1]
            for s in g.views()
        ]
        pct = next(s for s in nvml if s.metric == "gpu_mem_pct")
        assert pct.value == 95.0 and pct.severity is None


def test_nvml_used_alone_still_warns_once_sustained_for_a_gpu_without_allocator_reports():
    st, cfg = thresholds.ThresholdState(), thresholds.ThresholdConfig()
    gpu = {"index": 1, "mem_used_bytes": 0.95 * TOTAL, "mem_total_bytes": TOTAL}
    got = []
    for _ in range(4):
        sigs = thresholds.hw(st, cfg, {"gpus": [gpu]}, "n1", None, 0, False)[1]
        got.append([s.metric for g in sigs for s in g.views() if s.severity])
    assert got == [[], [], ["gpu_mem_pct"], ["gpu_mem_pct"]]


def test_allocated_memory_climbing_toward_the_limit_alerts_well_before_it():
    """A leak of 50 MiB a second from 40 GiB: the limit (75 GiB reachable) comes after about
    12 minutes. The warning comes once the trend has its 20 samples (5 s apart), at the first
    judged sample after them (every 30 s), and names the time left; critical under 5 minutes;
    both before the allocator reaches the limit."""
    seq, limit = [], 75 * GIB
    for i in range(900):
        alloc = min(limit, 40 * GIB + i * 50 * 2**20)
        seq.append(entry(alloc, min(limit, alloc + 2 * GIB), limit=limit))
    _, got = run(seq)
    first = {}
    for i, g in enumerate(got):
        for metric, sev, detail in g:
            first.setdefault((metric, sev), (i, detail))
    warn_at, detail = first[("alloc_growth", "warning")]
    crit_at, _ = first[("alloc_growth", "critical")]
    reach = (limit - 40 * GIB) / (50 * 2**20)  # seconds to the limit: 716.8
    assert warn_at <= 100 + 30 and crit_at < reach - 250
    assert math.isclose(detail["eta_s"], reach - warn_at, rel_tol=0.05)
    assert math.isclose(detail["eta_steps"], 2.0 * detail["eta_s"], rel_tol=0.05)
    assert {m for m, _ in first} == {"alloc_growth"}


def test_slow_leak_alerts_only_once_the_limit_is_within_half_an_hour():
    """1 GiB every 10 minutes from 40 GiB to a 75 GiB limit: about 5.8 hours to go at the
    start; the warning comes when less than 30 minutes are left."""
    seq, limit = [], 75 * GIB
    rate = GIB / 600
    for i in range(6 * 3600):
        alloc = min(limit, 40 * GIB + i * rate)
        seq.append(entry(alloc, alloc + GIB, limit=limit))
    _, got = run(seq)
    warn = next(i for i, g in enumerate(got) if any(m == "alloc_growth" for m, _, _ in g))
    left = (limit - (40 * GIB + warn * rate)) / rate
    assert 1500 <= left <= 1800


def test_a_one_time_rise_of_the_peak_is_no_trend():
    """A longer batch raises the peak once (and a second time): no climb in every quarter."""
    seq = []
    for i in range(1200):
        peak = 60 * GIB + (3 * GIB if i > 400 else 0) + (2 * GIB if i > 800 else 0)
        seq.append(entry(50 * GIB, 70 * GIB, peak=peak, limit=76 * GIB))
    _, got = run(seq)
    assert got == [[]] * len(seq)


def test_memory_rising_while_the_model_loads_is_not_judged():
    """Before the run steps (loading weights) the allocated memory climbs fast: not a leak."""
    seq = [entry(i * 0.5 * GIB, i * 0.5 * GIB + GIB, limit=76 * GIB) for i in range(120)]
    _, got = run(seq, busy=False)
    assert got == [[]] * len(seq)


def test_rising_retries_with_reserved_far_above_allocated_is_fragmentation():
    """The allocator retries at a few samples while a third of its reserved memory is free
    blocks: fragmentation (one retry alone is not enough)."""
    seq = []
    for i in range(120):
        retries = (i >= 30) + (i >= 50) + (i >= 70)
        seq.append(entry(48 * GIB, 76 * GIB, peak=60 * GIB, retries=retries, limit=77 * GIB))
    _, got = run(seq)
    hits = [(i, m) for i, g in enumerate(got) for m, _, _ in g]
    assert hits[0] == (70, "fragmentation")
    assert {m for _, m in hits} == {"fragmentation"}
    detail = next(d for g in got for m, _, d in g if m == "fragmentation")
    assert detail["retry_samples"] == 3 and detail["cache_share"] > 0.3


def test_retries_with_memory_full_of_allocations_say_the_memory_is_full():
    seq = [entry(74 * GIB, 76 * GIB, retries=i // 10, limit=77 * GIB) for i in range(60)]
    _, got = run(seq)
    metrics = {m for g in got for m, _, _ in g}
    assert metrics == {"alloc_retries"}


def sparse(retry_at, seconds, every_s=5):
    """What a rank sends: its allocator every ``every_s`` s, and at once when it retried; the
    breaches per record sent, with its time."""
    st, cfg, out, retries = gm.GpuMemoryState(), gm.GpuMemoryConfig(), [], 0
    for t in range(seconds):
        rose = t in retry_at
        retries += rose
        if t % every_s and not rose:
            continue
        gpu = entry(74 * GIB, 76 * GIB, retries=retries, limit=77 * GIB)
        sigs = gm.hw(st, cfg, {"gpus": [gpu]}, "n1", int(t * 1e9), True, 2 * t, None, 0)
        out.append((t, [s.metric for g in sigs for s in g.views() if s.severity]))
    return out


def test_retries_are_judged_over_a_minute_however_often_the_rank_reports():
    """A retry every 40 s is at most two a minute: quiet, whether the rank reports every second
    or every 5 s; three within a minute warn at the third, reported at once."""
    scattered = set(range(10, 600, 40))
    for every_s in (1, 5):
        assert all(not hits for _, hits in sparse(scattered, 600, every_s))
        got = sparse({100, 121, 142}, 300, every_s)
        first = next(t for t, hits in got if hits)
        assert first == 142
        assert all(hits == ["alloc_retries"] for t, hits in got if 142 <= t < 160)
        assert all(not hits for t, hits in got if t >= 160)


def test_an_out_of_memory_error_is_critical_and_the_first_report_is_a_baseline():
    seq = [entry(40 * GIB, 50 * GIB, ooms=2)] * 3 + [entry(40 * GIB, 50 * GIB, ooms=3)]
    _, got = run(seq)
    assert got[:3] == [[]] * 3
    assert [(m, s) for m, s, _ in got[3]] == [("ooms", "critical")]


def test_followed_gpus_are_bounded():
    st, cfg = gm.GpuMemoryState(), gm.GpuMemoryConfig(max_gpus=2)
    gpus = [dict(entry(GIB, 2 * GIB), index=i) for i in range(5)]
    gm.hw(st, cfg, {"gpus": gpus}, "n1", 0, True, 0, None, 0)
    assert len(st.counters) == 2 and st.overflow == 3


def _detect(gpu_at, seconds):
    """A run stepping twice a second, its hw record each second; the alerts it raised."""
    from steplens.schema import decode, encode, make_record
    from steplens.stream_jobs.engine.detector import RunDetector

    det = RunDetector("r")
    alerts = []
    for i in range(seconds):
        t = (i + 1) * 10**9
        for k in (0, 1):
            step = make_record(
                "step", {"loss": 2.0}, run_id="r", rank=0, step=2 * i + k, time_ns=t - k
            )
            alerts += det.process(decode(encode(step)))[1]
        hw = make_record("hw", {"gpus": [gpu_at(i)]}, run_id="r", rank=0, time_ns=t)
        alerts += det.process(decode(encode(hw)))[1]
    return [a for a in alerts if a.state == "firing"]


def _ints(gpu):
    return {k: int(v) if isinstance(v, float) else v for k, v in gpu.items()}


def test_through_the_detector_a_steady_full_gpu_is_quiet_and_a_leak_pages_with_its_eta():
    quiet = _detect(lambda i: _ints(entry(52 * GIB, 75.4 * GIB, used=0.95 * TOTAL)), 600)
    assert quiet == []
    limit = 75 * GIB

    def leak(i):
        alloc = min(limit, 40 * GIB + i * 50 * 2**20)
        return _ints(entry(alloc, min(limit, alloc + 2 * GIB), limit=limit))

    fired = _detect(leak, 300)
    assert fired and {m["rule"] for a in fired for m in a.evidence["members"]} == {
        "memory:alloc_growth"
    }
    first = fired[0]
    assert first.evidence["topic"] == "memory" and "climbs toward the limit" in first.hint
    member = first.evidence["members"][0]
    assert member["eta_min"] < 30 and member["eta_steps"] > 0


def test_nvml_stays_quiet_when_another_rank_reports_the_gpus_allocator():
    """Rank 1 sends its allocator's figures of GPU 1 in records of its own; local rank 0's
    NVML entries of GPU 1 then stay signals."""
    st, cfg = thresholds.ThresholdState(), thresholds.ThresholdConfig()
    own = {"index": 1, gm.ALLOCATED: 40 * GIB, gm.RESERVED: 75 * GIB}
    nvml = {"index": 1, "mem_used_bytes": 0.95 * TOTAL, "mem_total_bytes": TOTAL}
    sev = []
    for _ in range(5):
        for gpu in (own, nvml):
            sigs = thresholds.hw(st, cfg, {"gpus": [gpu]}, "n1", None, 0, True)[1]
            sev += [s.severity for g in sigs for s in g.views() if s.metric == "gpu_mem_pct"]
    assert sev == [None] * 5
