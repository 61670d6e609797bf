"""A node's hardware sample is sent on a cadence, and at once with news: an error counter, a
throttle reason, a level past its band; the next samples follow it, so checks that want a
breach sustained over 3 samples confirm it as at every sample."""

from __future__ import annotations

import random
from typing import Any

from steplens.producer.instruments.report_cadence import (
    FOLLOW,
    ReportCadence,
    has_slow_fields,
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
    cadence = ReportCadence(every_s, node_news, FOLLOW, has_slow_fields)
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
