import math
import random

import numpy as np

from steplens.stream_jobs.core import Column, score_of
from steplens.stream_jobs.signals import spike
from steplens.stream_jobs.signals.spike import SpikeConfig, SpikeState


def update(st, cfg, metric, x, step, rank=-1, peak=None):
    """One value (a step record's, or a window's mean with its ``peak``)."""
    col = Column(
        np.array([x]),
        np.array([step]),
        np.array([0]),
        rank,
        probes=None if peak is None else np.array([peak]),
    )
    return st, spike.update(st, cfg, metric, col).views()


def run(values, cfg=None, metric="loss"):
    """The signals of ``values`` one at a time; one column of them all gives the same."""
    cfg = cfg or SpikeConfig()
    st = SpikeState()
    out = []
    for i, x in enumerate(values):
        st, sigs = update(st, cfg, metric, x, i)
        out.append(sigs[0])
    steps = np.arange(len(values))
    whole = spike.update(SpikeState(), cfg, metric, Column(np.array(values), steps, steps))
    assert whole.views() == out
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
    from steplens.stream_jobs.core import flatten
    from steplens.stream_jobs.detector import RunDetector

    det = RunDetector("r")
    got = det.process_columns(0, range(5), [0] * 5, {"loss": [1.0, 1.1, math.nan, 1.0, math.inf]})
    sigs = flatten(got)
    assert [(s.step, s.name, s.severity) for s in sigs if s.severity] == [
        (2, "nonfinite", "critical"),
        (4, "nonfinite", "critical"),
    ]
    assert len(det.series[0]["spike"]["loss"].values) == 3  # nothing non-finite learnt


def test_falling_trend_is_not_a_spike():
    rng = random.Random(2)
    values = [10.0 * math.exp(-i / 80) + rng.gauss(0, 0.02) for i in range(400)]
    assert breaches(run(values)) == []


def test_near_zero_baseline_uses_the_z_rule_not_the_ratio():
    """10 noise scales above a baseline near 0 is a warning by the z rule; as a ratio to the
    baseline (far above 10 x) it would be critical, but a ratio against ~0 means nothing."""
    rng = random.Random(3)
    cfg = SpikeConfig(direction="both", min_rel_change=0.0)
    values = [rng.gauss(0, 1e-6) for _ in range(200)]
    probe = run(values, cfg)[120]  # the baseline and the noise scale before step 120
    scale = (probe.upper - probe.expected) / cfg.z
    values[120] = probe.expected + 10 * scale
    sigs = run(values, cfg)
    assert abs(values[120] / probe.expected) > cfg.ratio
    assert 120 in breaches(sigs)
    assert sigs[120].severity == "warning"
    assert math.isclose(sigs[120].score, score_of(10 / cfg.z))
    quiet = run([rng.gauss(0, 1e-6) for _ in range(200)], cfg)
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

    from reference.spike_ref import _median

    rng = random.Random(4)
    for n in (1, 2, 5, 64, 65):
        values = [rng.gauss(0, 1) for _ in range(n)]
        assert _median(list(values)) == statistics.median(values)
