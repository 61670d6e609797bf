"""Window aggregates, deterministic sampling and the spike guard (pure math)."""

from __future__ import annotations

import math

from steplens.producer.window import Guard, MetricStats, Window, is_sampled, sample_period


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
    assert g.check("loss", 20.0)  # a run of spikes keeps being flagged
    assert g.check("loss", math.nan)
    assert not g.check("loss", 2.0)


def test_guard_on_a_flat_near_zero_series() -> None:
    g = Guard()
    assert not any(g.check("x", 0.0) for _ in range(50))
    assert g.check("x", 1.0)
