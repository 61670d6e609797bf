import math
import random

import numpy as np
from judged import breaches, judged

from steplens.stream_jobs.engine.core import Column, score_of
from steplens.stream_jobs.engine.signals import spike
from steplens.stream_jobs.engine.signals.spike import SpikeConfig, SpikeState


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
    assert repr(whole.views()) == repr(out)  # nan == nan as text
    return out


def test_tenfold_jump_is_critical_and_noise_is_quiet():
    rng = random.Random(1)
    values = [2.0 + rng.gauss(0, 0.05) for _ in range(200)]
    values[150] = 25.0
    sigs = judged(values, "loss", "spike")
    assert breaches(sigs) == [150]
    assert sigs[150].severity == "critical"
    assert sigs[150].score > 0.9


def test_nonfinite_is_critical_at_once_even_in_warmup():
    from steplens.stream_jobs.engine.core import flatten
    from steplens.stream_jobs.engine.detector import RunDetector

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
    assert breaches(judged(values, "loss", "spike")) == []


def test_near_zero_baseline_scores_by_the_z_rule_not_the_ratio():
    """10 noise scales above a baseline near 0 scores by its z-score (as a ratio to the
    baseline, far above 10x, it would mean nothing). Such a series' rare excursions alert by
    rarity alone."""
    rng = random.Random(3)
    cfg = SpikeConfig(direction="both")
    values = [rng.gauss(0, 1e-6) for _ in range(3000)]
    probe = run(values, cfg)[2900]  # the baseline and the noise scale before step 2900
    scale = (probe.upper - probe.expected) / cfg.z
    values[2900] = probe.expected + 10 * scale
    sigs = run(values, cfg)
    assert abs(values[2900] / probe.expected) > 10
    assert math.isclose(sigs[2900].score, score_of(10 / cfg.z))
    assert 2900 in breaches(judged(values, "q", "spike", generic=True))
    quiet = [rng.gauss(0, 1e-6) for _ in range(3000)]
    assert len(breaches(judged(quiet, "q", "spike", generic=True))) <= 1


def test_scale_free_and_drift_tolerant_on_a_large_metric():
    rng = random.Random(4)
    values = [1e6 + 500 * i + rng.gauss(0, 2e3) for i in range(3000)]  # rising throughput
    values[2900] = values[2899] * 0.6  # a 40 % drop
    assert breaches(judged(values, "throughput", "spike", generic=True)) == [2900]


def test_window_peak_is_probed_but_mean_is_learnt():
    from steplens.stream_jobs.engine.core import flatten
    from steplens.stream_jobs.engine.detector import RunDetector

    det = RunDetector("r")
    for i in range(40):
        det.process_columns(-1, [i], [i], {"grad_norm": [1.0 + 0.01 * (i % 3)]})
    got = det.process_columns(-1, [40], [40], {"grad_norm": [1.0]}, peaks={"grad_norm": 30.0})
    sig = next(s for s in flatten(got) if s.name == "spike")
    assert sig.severity == "critical" and sig.value == 30.0
    assert max(det.series[-1]["grad_spike"]["grad_norm"].values) < 2.0


def test_median_matches_statistics_median_for_odd_and_even_lengths():
    import random
    import statistics

    from reference.spike_ref import _median

    rng = random.Random(4)
    for n in (1, 2, 5, 64, 65):
        values = [rng.gauss(0, 1) for _ in range(n)]
        assert _median(list(values)) == statistics.median(values)


def test_a_quantized_series_one_step_is_no_spike_a_jump_is():
    """Values on a grid of 0.01 that repeat more often than they move (an ASD-like server
    metric): the differences' MAD is 0, so the noise scale used to fall to its relative floor
    and a single 0.01 step looked like a spike. Their mean absolute deviation sees the steps:
    one step stays inside the band, a jump of half the range does not."""
    rng = np.random.default_rng(5)
    moves = rng.choice([-0.01, 0.0, 0.0, 0.0, 0.01], 300)
    values = list(np.round(0.49 + np.clip(np.cumsum(moves), -0.03, 0.03), 2))
    cfg = SpikeConfig(direction="both")
    last = values[-1]
    base = run(values, cfg, "col0")
    step = run([*values, last + 0.01], cfg, "col0")[-1]
    jump = run([*values, last + 0.5], cfg, "col0")[-1]
    assert np.mean(np.diff(values) == 0) > 0.5 and base
    assert step.score < 0.5, step.score
    assert jump.score > 0.9, jump.score


def test_a_window_peak_is_expected_where_the_largest_of_its_steps_lands():
    """Healthy windows of 100 noisy steps: their peaks sit about 2.5 spreads above the mean and
    are expected there, so none warns; a window with one corrupted step (+60 %) does."""
    from steplens.stream_jobs.engine.core import flatten
    from steplens.stream_jobs.engine.detector import RunDetector

    rng = np.random.default_rng(3)
    det = RunDetector("r")
    sigs = []
    for w in range(60):
        steps = 2.0 + rng.normal(0, 0.14, 100)  # 7 % noise a step
        if w == 50:
            steps[40] = 3.2
        got = det.process_columns(
            -1,
            [w * 100 + 99],
            [w],
            {"loss": [float(steps.mean())]},
            peaks={"loss": float(steps.max())},
            firsts=[w * 100],
            spreads={"loss": (float(steps.std()), 100)},
        )
        sigs += [s for s in flatten(got) if s.name == "spike"]
    healthy = [s for s in sigs[SpikeConfig().warmup :] if s.step != 5099]
    # the expected peak: about 2.5 spreads of a step above the baseline, as drawn
    assert all(0.25 < s.expected - 2.0 < 0.45 for s in healthy)
    assert not [s for s in healthy if s.severity in ("warning", "critical")]
    bad = next(s for s in sigs if s.step == 5099)
    assert bad.severity == "warning" and (bad.value - bad.expected) / bad.expected > 0.3


def test_peak_lifts_leave_the_peak_out_of_the_spread():
    rng = np.random.default_rng(4)
    steps = rng.normal(1.0, 0.1, 50)
    steps[7] = 5.0
    col = Column(
        np.array([steps.mean()]),
        np.array([49]),
        np.array([0]),
        spreads=np.array([steps.std()]),
        counts=np.array([50]),
    )
    lift = spike.peak_lifts(col, np.array([5.0]))[0]
    others = np.delete(steps, 7)
    assert math.isclose(lift, spike.expected_max(50) * others.std(ddof=1), rel_tol=1e-9)
    assert math.isclose(spike.expected_max(100), 2.5, abs_tol=0.02)  # tables: 2.5076
