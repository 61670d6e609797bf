import math
import random

from steplens.stream_jobs.signals.spike import SpikeConfig, SpikeState, update


def run(values, cfg=None, metric="loss"):
    cfg = cfg or SpikeConfig()
    st = SpikeState()
    out = []
    for i, x in enumerate(values):
        st, sigs = update(st, cfg, metric, x, i)
        out.append(sigs[0])
    return out


def breaches(sigs):
    return [s.step for s in sigs if s.severity]


def test_tenfold_jump_is_critical_and_noise_is_quiet():
    rng = random.Random(1)
    values = [2.0 + rng.gauss(0, 0.05) for _ in range(200)]
    values[150] = 25.0
    sigs = run(values)
    assert breaches(sigs) == [150]
    assert sigs[150].severity == "critical"
    assert sigs[150].score > 0.9


def test_nonfinite_is_critical_at_once_even_in_warmup():
    sigs = run([1.0, 1.1, math.nan, 1.0, math.inf])
    assert [(s.step, s.name, s.severity) for s in sigs if s.severity] == [
        (2, "nonfinite", "critical"),
        (4, "nonfinite", "critical"),
    ]


def test_falling_trend_is_not_a_spike():
    rng = random.Random(2)
    values = [10.0 * math.exp(-i / 80) + rng.gauss(0, 0.02) for i in range(400)]
    assert breaches(run(values)) == []


def test_near_zero_baseline_uses_the_z_rule_not_the_ratio():
    rng = random.Random(3)
    values = [rng.gauss(0, 1e-6) for _ in range(200)]
    values[120] = 5e-5  # 50 sigma, but a ratio against ~0 means nothing
    sigs = run(values, SpikeConfig(direction="both", min_rel_change=0.0))
    assert 120 in breaches(sigs)
    assert all(s.detail is None for s in sigs)
    quiet = run(
        [rng.gauss(0, 1e-6) for _ in range(200)], SpikeConfig(direction="both", min_rel_change=0.0)
    )
    assert len(breaches(quiet)) <= 1


def test_scale_free_and_drift_tolerant_on_a_large_metric():
    rng = random.Random(4)
    values = [1e6 + 500 * i + rng.gauss(0, 2e3) for i in range(300)]  # rising throughput
    values[200] = values[199] * 0.6  # a 40 % drop
    sigs = run(values, SpikeConfig(direction="both"), "tokens_per_s")
    assert breaches(sigs) == [200]


def test_window_peak_is_probed_but_mean_is_learnt():
    cfg = SpikeConfig()
    st = SpikeState()
    for i in range(40):
        st, _ = update(st, cfg, "grad_norm", 1.0 + 0.01 * (i % 3), i)
    st, sigs = update(st, cfg, "grad_norm", 1.0, 40, peak=30.0)
    assert sigs[0].severity == "critical" and sigs[0].value == 30.0
    assert max(st.values) < 2.0


def test_median_matches_statistics_median_for_odd_and_even_lengths():
    import random
    import statistics

    from steplens.stream_jobs.signals.spike import _median

    rng = random.Random(4)
    for n in (1, 2, 5, 64, 65):
        values = [rng.gauss(0, 1) for _ in range(n)]
        assert _median(list(values)) == statistics.median(values)
