"""A rank's process memory against its host, from its health records (one every 5 s, as the
producer sends them at its defaults): a leak pages with the time left; a flat process on a
host whose other processes come and go stays quiet."""

from steplens.schema import decode, encode, make_record
from steplens.stream_jobs.engine.core import Run
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals import host_memory as hm

GIB = 1 << 30
MIB = 1 << 20
TOTAL = 24 * GIB


def health(rank: int, rss: int, avail: int, t_ns: int):
    data = {"sent": 1, "rss_bytes": rss, "mem_available_bytes": avail, "mem_total_bytes": TOTAL}
    return make_record("health", data, run_id="r", rank=rank, time_ns=t_ns)


def detect(memory_at, seconds: int, every_s: int = 5) -> list:
    """A run stepping twice a second, rank 0's health record every ``every_s``;
    ``memory_at(t)`` its (rss, available) bytes at ``t`` s. The incidents opened."""
    det = RunDetector("r")
    alerts = []
    for t in range(seconds):
        t_ns = (t + 1) * 10**9
        for k in (0, 1):
            step = make_record(
                "step", {"loss": 2.0}, run_id="r", rank=0, step=2 * t + k, time_ns=t_ns - k
            )
            alerts += det.process(decode(encode(step)))[1]
        if t % every_s == 0:
            rss, avail = memory_at(t)
            alerts += det.process(decode(encode(health(0, rss, avail, t_ns))))[1]
    return [a for a in alerts if a.state == "firing"]


def test_a_process_leaking_host_memory_pages_with_the_time_left():
    """40 MiB/s from 4 GiB with 12 GiB available: the host's floor (5 %) is ~4.6 minutes
    away: a page within the first two minutes, critical once under 5 minutes."""
    fired = detect(lambda t: (4 * GIB + 40 * MIB * t, 12 * GIB - 40 * MIB * t), 150)
    assert fired, "the leak never paged"
    first = fired[0]
    assert first.rule == "memory:rss_growth" and first.evidence["topic"] == "memory"
    assert "process memory climbs" in first.hint
    member = first.evidence["members"][0]
    assert member["rank"] == 0 and 0 < member["eta_min"] < 30 and member["eta_steps"] > 0
    assert first.time_ns <= 120 * 10**9


def test_a_flat_process_on_a_host_whose_other_processes_come_and_go_is_quiet():
    """Its own memory flat (with noise); the host's available memory swings by gigabytes as
    other processes start and stop."""

    def memory(t: int) -> tuple[int, int]:
        rss = 6 * GIB + (t * 7919 % 13) * MIB
        return rss, (4 + 6 * ((t // 60) % 2)) * GIB

    assert detect(memory, 1200) == []


def test_a_slow_climb_that_leaves_hours_is_quiet():
    """1 MiB/s with 12 GiB available: hours before the floor, nothing to act on yet."""
    assert detect(lambda t: (4 * GIB + MIB * t, 12 * GIB - MIB * t), 900) == []


def test_memory_growing_while_the_run_does_not_step_is_not_judged():
    """A model loading, no step yet: its memory climbs, nothing is judged."""
    st, cfg, run = hm.HostMemoryState(), hm.HostMemoryConfig(), Run()
    for t in range(0, 300, 5):
        rec = health(0, 4 * GIB + 200 * MIB * t, 12 * GIB - 200 * MIB * t, t * 10**9)
        assert [s for s in hm.on_record(st, cfg, rec, run) if s.breach().any()] == []


def test_followed_ranks_are_bounded_and_the_rest_counted():
    st, cfg, run = hm.HostMemoryState(), hm.HostMemoryConfig(max_ranks=2), Run()
    for rank in range(5):
        hm.on_record(st, cfg, health(rank, GIB, 10 * GIB, 10**9), run)
    assert sorted(st.marks) == [0, 1] and st.overflow == 3


def test_a_health_record_without_memory_is_not_judged():
    st, cfg, run = hm.HostMemoryState(), hm.HostMemoryConfig(), Run()
    rec = make_record("health", {"sent": 3}, run_id="r", rank=0, time_ns=10**9)
    assert hm.on_record(st, cfg, rec, run) == [] and st.marks == {}
