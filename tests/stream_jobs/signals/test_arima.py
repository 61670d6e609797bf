import itertools
import math
import random

import numpy as np
from judged import breaches, judged

from steplens.stream_jobs.engine.core import Column
from steplens.stream_jobs.engine.signals import arima


def update(st, cfg, metric, x, step):
    """One value (a step record's); a fit it asks for is left to the caller."""
    col = Column(np.array([x], dtype=float), np.array([step]), np.array([0]))
    return st, arima.update(st, cfg, metric, col).views()


def feed(values, cfg, state=None, fit=True):
    st = state or arima.ArimaState()
    out = []
    for i, x in enumerate(values):
        st, sigs = update(st, cfg, "step_time_s", x, i)
        out += sigs
        if st.wants_fit and fit:
            arima.apply_fit(st, cfg, arima.fit(arima.fit_input(st, cfg), cfg.order, cfg.method))
    return st, out


def test_fit_recovers_an_ar_coefficient():
    rng = np.random.default_rng(0)
    x = np.zeros(600)
    for t in range(1, 600):
        x[t] = 0.7 * x[t - 1] + rng.normal()
    p = arima.fit(x, (1, 0, 0), "statespace")
    assert p is not None and abs(p.ar[0] - 0.7) < 0.1 and abs(p.sigma - 1.0) < 0.15


def test_sustained_shift_warns_after_consecutive_points_and_outlier_is_not_learnt():
    """A step time that moves to a new level warns once it lasted the policy's ``persist``
    values; one outlier is scored (rare), never alerted, and not learnt."""
    rng = random.Random(1)
    cfg = arima.ArimaConfig()
    values = [0.1 + rng.gauss(0, 0.002) for _ in range(600)]
    values[500] = 0.2  # one outlier: scored, not alerted
    values += [0.3 + rng.gauss(0, 0.002) for _ in range(20)]  # a new regime
    sigs = judged(values, "step_time_s", "arima")
    by_step = {s.step: s for s in sigs}
    assert by_step[500].score > 0.999 and by_step[500].severity is None
    assert by_step[501].score < 0.99  # the outlier did not move the forecast
    warned = breaches(sigs)
    assert warned and warned[0] == 600 + cfg.policy.persist - 1
    assert not [s for s in warned if s < 600]


def test_fits_are_requested_rarely_and_history_is_bounded():
    cfg = arima.ArimaConfig(first_fit=64, refit_every=500, fit_window=128)
    st = arima.ArimaState()
    fits = 0
    for i in range(3000):
        st, _ = update(st, cfg, "loss", math.sin(i / 10) + 0.01 * (i % 7), i)
        if st.wants_fit:
            fits += 1
            arima.apply_fit(st, cfg, arima.ArimaParams(ar=[0.0], ma=[0.0], const=0.0, sigma=1.0))
    assert 5 <= fits <= 9
    assert len(st.history) == 128


def test_state_without_fit_has_no_score():
    _, sigs = feed([1.0, 2.0, 3.0], arima.ArimaConfig(), fit=False)
    assert all(math.isnan(s.score) for s in sigs)


def test_a_skipped_first_fit_is_asked_again_soon():
    """A busy fit pool answers None; the series must not wait for the 4x refit schedule."""
    cfg = arima.ArimaConfig(first_fit=64, retry_after=16)
    state = arima.ArimaState()
    requested = []
    for i in range(200):
        state, _ = update(state, cfg, "loss", 2.0 + 0.01 * math.sin(i), i)
        if state.wants_fit:
            requested.append(state.seen)
            params = (
                None
                if len(requested) == 1
                else arima.fit(arima.fit_input(state, cfg), cfg.order, cfg.method)
            )
            arima.apply_fit(state, cfg, params)
    assert requested[:2] == [64, 80]
    assert state.params is not None


def test_a_series_whose_fits_keep_failing_backs_off():
    cfg = arima.ArimaConfig(first_fit=64, refit_every=500, retry_after=16)
    st = arima.ArimaState()
    requested = []
    for i in range(3000):
        st, _ = update(st, cfg, "loss", math.sin(i / 10), i)
        if st.wants_fit:
            requested.append(st.seen)
            arima.apply_fit(st, cfg, None)
    gaps = [b - a for a, b in itertools.pairwise(requested)]
    assert gaps[:4] == [16, 32, 64, 128]
    assert len(requested) <= 14


def test_fitted_state_keeps_only_what_the_recursion_reads_and_is_stored_as_plain_data():
    from steplens.stream_jobs.engine.detector import CODEC

    cfg = arima.ArimaConfig()
    st, _ = feed([math.sin(i / 5) for i in range(300)], cfg)
    assert st.params is not None
    assert len(st.diffs) == len(st.errors) == 1
    assert len(st.history) == cfg.fit_window
    back = CODEC.unpack(CODEC.pack(st))
    for i in range(300, 320):  # the restored state scores as the original
        _, a = update(st, cfg, "x", math.sin(i / 5), i)
        _, b = update(back, cfg, "x", math.sin(i / 5), i)
        assert a == b
