import math
import random

import numpy as np
from judged import breaches, judged

from steplens.stream_jobs.engine.core import Column
from steplens.stream_jobs.engine.signals import volatility
from steplens.stream_jobs.engine.signals.volatility import VolatilityConfig, VolatilityState


def run(values, cfg=None):
    cfg = cfg or VolatilityConfig()
    steps = np.arange(len(values))
    col = Column(np.array(values, dtype=float), steps, steps)
    return volatility.update(VolatilityState(), cfg, "loss", col).views()


def test_noisy_loss_warns_and_smooth_decay_does_not():
    """The design's anchor: relative noise over 10 % warns while the run's own noise is not
    known, and a smooth decay never does."""
    rng = random.Random(0)
    smooth = [5.0 - 0.01 * i + rng.gauss(0, 0.05) for i in range(200)]
    assert not breaches(judged(smooth, "loss", "volatility"))
    noisy = [3.0 + rng.gauss(0, 0.6) for _ in range(200)]
    sigs = judged(noisy, "loss", "volatility")
    warned = [s for s in sigs if s.severity]
    assert warned and all(s.severity == "warning" for s in warned)
    over = [s.step for s in sigs if s.value > 0.1]
    assert {s.step for s in warned} <= set(over) and warned[0].step == over[0]
    assert 0.1 < sigs[-1].value < 0.4  # about 0.6 / 3


def test_no_verdict_before_the_window_is_full():
    sigs = run([1.0, 5.0, 1.0, 5.0] * 10, VolatilityConfig(window=50))
    assert all(s.severity is None and math.isnan(s.score) for s in sigs)


def test_a_run_that_always_wanders_is_not_paged_and_one_that_turns_unstable_is():
    """Noise of 9 % a step from the start, for 3,000 steps: windows read over 10 % now and
    then, never rare for this run; the same run whose noise then triples warns."""
    rng = random.Random(5)
    steady = [2.0 * (1 + rng.gauss(0, 0.09)) for _ in range(3000)]
    sigs = judged(steady, "loss", "volatility")
    assert any(s.value > 0.1 for s in sigs[500:])  # the line is crossed
    assert not [s for s in sigs[500:] if s.severity]
    unstable = steady + [2.0 * (1 + rng.gauss(0, 0.3)) for _ in range(200)]
    assert [s for s in judged(unstable, "loss", "volatility")[3000:] if s.severity]


def test_steps_sent_between_windows_are_held_by_the_windows():
    """A windowed series: each window is judged on its own spread; a raw step sent between
    them (a guard's outlier, 40 % up) is no noise of its own: no volatility signal, no alert."""
    st, cfg = VolatilityState(), VolatilityConfig()
    for w in range(3):
        col = Column(
            np.array([2.0]),
            np.array([w * 100 + 99]),
            np.array([0]),
            firsts=np.array([w * 100]),
            spreads=np.array([0.1]),
            counts=np.array([100]),
        )
        got = volatility.update(st, cfg, "loss", col).views()
        assert len(got) == 1 and got[0].value < 0.1
    raw = Column(np.array([2.8]), np.array([350]), np.array([0]))
    assert volatility.update(st, cfg, "loss", raw).views() == []
