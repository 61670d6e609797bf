"""A node's hardware sample, a rank's allocator figures and its health are sent on a cadence,
and at once with news: an error counter, a throttle reason, a level past its band; the next
samples follow it, so checks that want a breach sustained over 3 samples confirm it as at
every sample."""

from __future__ import annotations

import random
from typing import Any

from steplens.producer.instruments.report_cadence import (
    FOLLOW,
    ReportCadence,
    allocator_cadence,
    has_slow_fields,
    health_news,
    node_news,
)

HBM = 80 * 2**30


def node(rng: random.Random, **gpu0: Any) -> dict[str, Any]:
    """A healthy 2-GPU node's sample, with the jitter of a busy one; ``gpu0`` overrides."""
    gpus = []
    for i in range(2):
        g: dict[str, Any] = {
            "index": i,
            "temp_c": float(64 + rng.choice((-1, 0, 1))),
            "util_gpu": float(rng.choice((96, 98, 100))),
            "power_w": rng.uniform(560, 690),
            "sm_clock_mhz": 1980.0,
            "mem_used_bytes": int(0.88 * HBM + rng.uniform(0, 2e8)),
            "mem_total_bytes": HBM,
            "throttle_reasons": 0,
            "ecc_uncorrected": 0,
            "xid_count": 0,
        }
        if i == 0:
            g.update(gpu0)
        gpus.append(g)
    return {
        "mem_available_bytes": int(1.6e12 + rng.uniform(0, 1e10)),
        "mem_total_bytes": int(2e12),
        "nets": [{"iface": "ib0", "rx_mb_s": rng.uniform(20000, 24000), "tx_mb_s": 21000.0}],
        "disks": [{"device": "nvme0n1", "io_latency_ms": rng.uniform(0.1, 0.4)}],
        "gpus": gpus,
        "gpu_status": "ok",
    }


def sent_seconds(samples: dict[int, dict[str, Any]], every_s: float = 5.0) -> list[int]:
    cadence = ReportCadence(every_s, node_news, FOLLOW, kept=has_slow_fields)
    return [t for t in sorted(samples) if cadence.due(samples[t], float(t))]


def test_a_healthy_node_is_sent_every_five_seconds_whatever_its_jitter() -> None:
    rng = random.Random(1)
    samples = {t: node(rng) for t in range(60)}
    assert sent_seconds(samples) == list(range(0, 60, 5))
    assert sent_seconds(samples, every_s=0.0) == list(range(60))


def test_an_xid_goes_at_once_and_its_next_three_samples_follow() -> None:
    rng = random.Random(2)
    samples = {t: node(rng, xid_count=int(t >= 7), ecc_uncorrected=int(t >= 7)) for t in range(30)}
    # the heartbeat counts again from the last sample sent
    assert sent_seconds(samples) == [0, 5, 7, 8, 9, 10, 15, 20, 25]


def test_a_gpu_heating_up_is_sent_as_it_rises_and_while_it_throttles() -> None:
    rng = random.Random(3)
    temp, samples = 64.0, {}
    for t in range(40):
        temp += 0.25 * ((92.0 if t >= 10 else 64.0) - temp)
        hot = temp > 85
        samples[t] = node(
            rng,
            temp_c=float(round(temp)),
            throttle_reasons=64 if hot else 0,
            sm_clock_mhz=1290.0 if hot else 1980.0,
        )
    sent = sent_seconds(samples)
    first_hot = min(t for t, s in samples.items() if s["gpus"][0]["throttle_reasons"])
    assert first_hot in sent  # the throttle's first sample
    assert {10, 11, 12, 13} <= set(sent)  # the rise is news from its first degrees
    assert all(t in sent for t in range(first_hot, first_hot + FOLLOW + 1))


def test_a_level_past_its_band_is_news_and_jitter_within_it_is_not() -> None:
    rng = random.Random(4)
    base = node(rng)
    util_low = node(rng, util_gpu=40.0)
    assert node_news(base, util_low)
    assert not node_news(base, node(rng))
    # power and clocks swing with every step on a busy GPU: their minute means are judged
    assert not node_news(base, node(rng, power_w=300.0, sm_clock_mhz=1755.0))
    net_down = node(rng)
    net_down["nets"][0]["rx_mb_s"] = 1000.0
    assert node_news(base, net_down)
    leak = node(rng, mem_used_bytes=int(0.95 * HBM))
    assert node_news(base, leak)
    gone = node(rng)
    gone["gpus"] = gone["gpus"][:1]
    assert node_news(base, gone)
    lost = node(rng)
    lost["gpu_status"] = "NVML error"
    assert node_news(base, lost)


def test_a_sample_with_the_slow_fields_is_sent_and_not_followed() -> None:
    rng = random.Random(5)
    samples = {t: node(rng) for t in range(20)}
    for t in (3, 13):
        for g in samples[t]["gpus"]:
            g["energy_j"] = 1e6 + t
    assert sent_seconds(samples) == [0, 3, 8, 13, 18]


def test_every_node_sample_is_sent_while_the_steps_have_paused() -> None:
    """A hang is judged by the samples that keep coming: while the process's steps have
    paused every sample goes, then the cadence again."""
    from steplens.producer.instruments.hardware import HardwareSampler

    rng = random.Random(6)
    paused = {"now": False}
    sampler = HardwareSampler(lambda d: None, report_every_s=5.0, paused=lambda: paused["now"])
    sent = []
    for t in range(40):
        paused["now"] = 10 <= t < 25
        if sampler.due(node(rng), float(t)):
            sent.append(t)
    assert sent == [0, 5, *range(10, 25), 29, 34, 39]


def test_steps_have_paused_after_three_median_intervals_and_at_least_two_seconds() -> None:
    from steplens.producer.pipeline.stall import StallWatch

    watch = StallWatch(None)
    assert not watch.paused(10**12)  # before the first step: loading is no pause
    s = 10**9
    for k in range(20):
        watch.on_step(k, k * s)  # 1 s steps
    last = 19 * s
    assert not watch.paused(last + 2 * s)
    assert watch.paused(last + 3 * s + 1)
    fast = StallWatch(None)
    for k in range(20):
        fast.on_step(k, k * s // 100)  # 10 ms steps: the 2 s floor holds
    assert not fast.paused(19 * s // 100 + s)
    assert fast.paused(19 * s // 100 + 2 * s + 1)


def health(rng: random.Random, rss: float, **counts: Any) -> dict[str, Any]:
    """A rank's health reading on a 24 GiB host, with the jitter of a busy process."""
    total = 24 * 2**30
    return {
        "dropped": counts.get("dropped", {}),
        "errors": {},
        "sent": rng.randrange(10**6),  # every reading's own: never news
        "spooled": counts.get("spooled", 0),
        "queue_len": rng.randrange(50),
        "rss_bytes": int(rss + rng.uniform(0, 3e7)),
        "mem_available_bytes": int(0.5 * total + rng.uniform(0, 1e8)),
        "mem_total_bytes": total,
    }


def test_a_steady_ranks_health_goes_every_half_minute_and_a_leaks_as_it_grows() -> None:
    """Read every 5 s: a steady process's reading is sent every 30 s. One that keeps 40 MiB of
    every second (a leak) moves past its band (0.5 % of a 24 GiB host: 123 MiB) at every
    reading, and each goes; a leak of 8 MiB/s every few readings, which go with the readings
    that follow them: more than half of them."""
    for rate_mib, share in ((40, 1.0), (8, 0.5)):
        rng = random.Random(7)
        cadence = ReportCadence(30.0, health_news, FOLLOW)
        steady = [t for t in range(0, 600, 5) if cadence.due(health(rng, 4e9), float(t))]
        assert steady == list(range(0, 600, 30))
        leak = [
            t
            for t in range(600, 900, 5)
            if cadence.due(health(rng, 4e9 + (rate_mib << 20) * (t - 600)), float(t))
        ]
        assert len(leak) >= share * len(range(600, 900, 5))


def test_a_health_count_or_the_spool_is_news() -> None:
    rng = random.Random(8)
    cadence = ReportCadence(30.0, health_news, FOLLOW)
    readings = {t: health(rng, 4e9) for t in range(0, 120, 5)}
    readings[50] = health(rng, 4e9, dropped={"queue_full": 3})
    for t in range(55, 120, 5):
        readings[t] = health(rng, 4e9, dropped={"queue_full": 3})
    readings[100] = health(rng, 4e9, dropped={"queue_full": 3}, spooled=10)
    sent = [t for t in sorted(readings) if cadence.due(readings[t], float(t))]
    assert sent == [0, 30, 50, 55, 60, 65, 95, 100, 105, 110, 115]


def test_a_ranks_allocator_goes_as_its_high_water_mark_climbs_at_most_every_five_seconds() -> None:
    """Read every second, sent every 30 s: a healthy rank's high-water mark stays where its
    first steps left it (its allocated memory swings with each step); a leak's climbs by
    0.1 % of the limit in seconds, and goes every 5 s (as often as the stream jobs keep it);
    a retry goes at once."""
    limit = 77 * 10**9

    def alloc(peak: float, retries: int = 0, reserved: float = 68e9) -> dict[str, Any]:
        g = {"index": 0, "torch_reserved_bytes": int(reserved), "torch_peak_bytes": int(peak),
             "torch_allocated_bytes": int(0.6 * peak), "torch_alloc_retries": retries,
             "torch_ooms": 0, "torch_limit_bytes": limit}  # fmt: skip
        return {"gpus": [g]}

    cadence = allocator_cadence(30.0)
    healthy = [t for t in range(120) if cadence.due(alloc(66e9), float(t))]
    assert healthy == [0, 30, 60, 90]
    leaking = [t for t in range(120, 150) if cadence.due(alloc(66e9 + 3e7 * (t - 119)), float(t))]
    assert leaking == [120, 125, 130, 135, 140, 145]
    assert cadence.due(alloc(66e9 + 3e7 * 31, retries=1), 150.5)
    moved = allocator_cadence(30.0)
    assert moved.due(alloc(66e9), 0.0) and not moved.due(alloc(66e9, reserved=69e9), 6.0)
    grown = 68e9 + 0.02 * limit
    assert moved.due(alloc(66e9, reserved=grown), 7.0)
    assert not moved.due(alloc(65e9, reserved=grown), 13.0)  # a reset high-water mark
