"""Window aggregates, deterministic sampling and the spike guard (pure math)."""

from __future__ import annotations

import math
import random

import pytest

from steplens.producer.pipeline.window import Guard, MetricStats, Window, is_sampled, sample_period


def test_sample_period_and_determinism() -> None:
    assert sample_period(1.0) == 1
    assert sample_period(0.01) == 100
    assert sample_period(0.0) == 0
    assert [s for s in range(300) if is_sampled(s, 100)] == [0, 100, 200]
    assert not any(is_sampled(s, 0) for s in range(10))


def test_metric_stats_counts_nonfinite_apart() -> None:
    st = MetricStats()
    for x in (1.0, 5.0, math.nan, 3.0, math.inf):
        st.add(x)
    s = st.summary()
    assert (s["count"], s["mean"], s["min"], s["max"], s["nonfinite"]) == (3, 3.0, 1.0, 5.0, 2)
    assert s["last"] == math.inf


def test_window_std_is_the_population_std_of_its_finite_values() -> None:
    """Volatility over real steps: the window says how its values spread, not only where."""
    rng = random.Random(3)
    values = [1e6 + rng.gauss(0, 0.5) for _ in range(500)]  # a large mean: no cancellation
    w = Window()
    for step, x in enumerate([*values[:250], math.nan, *values[250:]]):
        w.add_step(step, {"loss": x}, now_ns=step)
    data = w.emit(1000)
    assert data is not None
    loss = data["metrics"]["loss"]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((x - mean) ** 2 for x in values) / len(values))
    assert loss["count"] == 500 and loss["nonfinite"] == 1
    assert loss["mean"] == pytest.approx(mean, rel=1e-12)
    assert loss["std"] == pytest.approx(std, rel=1e-9)
    single = MetricStats()
    single.add(4.0)
    assert single.summary()["std"] == 0.0
    assert math.isnan(MetricStats().summary()["std"])


def test_window_keeps_a_single_spike_and_resets() -> None:
    w = Window()
    for step in range(100):
        w.add_step(step, {"loss": 1000.0 if step == 37 else 2.0}, now_ns=step)
    assert w.due(100, max_steps=100, max_s=1e9)
    data = w.emit(200)
    assert data is not None
    loss = data["metrics"]["loss"]
    assert loss["max"] == 1000.0 and loss["min"] == 2.0 and loss["count"] == 100
    assert (data["step_first"], data["step_last"], data["count"]) == (0, 99, 100)
    assert w.emit(300) is None


def test_window_due_by_time() -> None:
    w = Window()
    w.add_step(1, {"x": 1.0}, now_ns=0)
    assert not w.due(int(0.5e9), max_steps=1000, max_s=1.0)
    assert w.due(int(1.5e9), max_steps=1000, max_s=1.0)


def test_guard_flags_spikes_and_nonfinite_but_not_noise() -> None:
    g = Guard(sigma=6.0, warmup=20)
    flagged = [g.check("loss", 2.0 + 0.01 * math.sin(i)) for i in range(200)]
    assert not any(flagged)
    assert g.check("loss", 20.0)
    assert g.check("loss", 20.0)  # a short run of spikes keeps being flagged
    assert g.check("loss", math.nan)
    assert not g.check("loss", 2.0)


def test_guard_on_a_flat_near_zero_series() -> None:
    g = Guard()
    assert not any(g.check("x", 0.0) for _ in range(50))
    assert g.check("x", 1.0)


def _flags(g: Guard, name: str, xs: list[float]) -> list[int]:
    return [i for i, x in enumerate(xs) if g.check(name, x)]


def test_guard_accepts_a_lasting_new_level() -> None:
    """An lr step decay, a new batch size, slower steps: a few flags, then the new baseline."""
    rng = random.Random(3)
    lr = [1e-3] * 1000 + [1e-4] * 9000
    step_time = [0.1 * (1 + rng.gauss(0, 0.01)) for _ in range(3000)]
    step_time += [0.2 * (1 + rng.gauss(0, 0.01)) for _ in range(7000)]
    tokens = [4096.0] * 5000 + [8192.0] * 5000
    g = Guard()
    assert _flags(g, "lr", lr) == list(range(1000, 1005))
    assert 3000 in _flags(g, "step_time_s", step_time)
    assert len(_flags(Guard(), "step_time_s", step_time)) <= 5
    assert _flags(g, "tokens", tokens) == list(range(5000, 5005))
    assert g.check("lr", 1e-2)  # and spikes on the new level are flagged again


def test_guard_on_jittery_millisecond_step_times() -> None:
    """1 ms steps, one in ten preempted for 0.5-5 ms: at most about 1 % of steps go raw."""
    rng = random.Random(5)
    times = [
        0.001 + (rng.uniform(0.0005, 0.005) if rng.random() < 0.1 else rng.gauss(0, 3e-5))
        for _ in range(10_000)
    ]
    assert len(_flags(Guard(), "step_time_s", times)) <= 10 + 10_000 // 100 + 1
    assert (
        len(_flags(Guard(), "lognormal", [0.001 * rng.lognormvariate(0, 0.3) for _ in times])) < 50
    )


def test_guard_caps_the_flags_of_a_metric() -> None:
    g = Guard(burst=10, refill_every=100)
    xs = [1.0] * 100 + [math.nan] * 5000  # a metric gone NaN for good
    flagged = _flags(g, "x", xs)
    assert flagged[:10] == list(range(100, 110))  # the first ones at once
    assert len(flagged) <= 10 + len(xs) // 100 + 1
    assert g.suppressed == 5000 - len(flagged)
