"""Live values against the 7-day baseline's bands: minute means judged once their minute
closes, persistence before a warning, throughput's bad side, the series cap, and a run's
detector end to end (in-run bands fitted inline, an alert in the hardware topic, none on a
healthy run, the bands kept across a checkpoint)."""

from __future__ import annotations

import numpy as np

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.incidents import topic_of
from steplens.stream_jobs.engine.signals import dynamic_baseline as db
from steplens.stream_jobs.engine.signals.seasonal_baseline import MINUTE_NS, Band

T0 = 28_333_333 * MINUTE_NS


def _band(start_ns: int, n: int, mid: float, half: float, baseline: str = "7d") -> Band:
    e = np.full(n, mid)
    return Band(start_ns, e, e - half, e + half, baseline, (1, 0, 0), True, 10080)


def _hw(t_ns: int, util: float, rank: int = 0) -> object:
    gpus = [{"index": 0, "util_gpu": util, "temp_c": 60.0, "mem_used_bytes": 10**9}]
    nets = [{"iface": "ib0", "rx_mb_s": 100.0, "tx_mb_s": 50.0}]
    return make_record("hw", {"gpus": gpus, "nets": nets}, run_id="r", rank=rank, time_ns=t_ns)


def test_a_minute_outside_its_band_for_persist_minutes_warns() -> None:
    cfg, st = db.DynamicConfig(persist=3), db.DynamicState()
    scope, key = "gpu:h/0", db.key_of("gpu:h/0", "gpu_util")
    # no band: minute means are kept (two values a minute: their mean), nothing is judged
    for m in range(3):
        for v in (89.0, 91.0):
            assert db.observe(st, cfg, scope, "gpu_util", v, T0 + m * MINUTE_NS, 0, None) is None
    assert st.series[key].values.tolist() == [90.0, 90.0] and st.series[key].times[0] == T0
    db.apply(st, {key: _band(T0, 60, 90.0, 5.0)})
    out = []
    for m, v in enumerate([91, 40, 40, 40, 40, 90, 90], start=3):
        sig = db.observe(st, cfg, scope, "gpu_util", float(v), T0 + m * MINUTE_NS, 0, None)
        out.append(sig.view(0) if sig is not None else None)
    # each signal judges the minute before (the one the new value closed)
    assert [s.value for s in out] == [90.0, 91, 40, 40, 40, 40, 90]
    assert [s.severity for s in out] == [None, None, None, None, "warning", "warning", None]
    assert out[2].detail["baseline"] == "7d" and out[2].expected == 90.0
    assert out[2].lower == 85.0 and out[2].score > 0.5 and out[1].score < 0.5
    # a value of a closed minute is late: not learnt
    assert db.observe(st, cfg, scope, "gpu_util", 1.0, T0, 0, None) is None and st.late == 1


def test_throughput_warns_on_its_bad_side_only() -> None:
    cfg, st = db.DynamicConfig(persist=1), db.DynamicState()
    judged: dict[str, list] = {}
    for metric in ("tokens_per_s", "step_time_s"):
        db.observe(st, cfg, "rank:0", metric, 100.0, T0, 0, 1)
        db.apply(st, {db.key_of("rank:0", metric): _band(T0, 10, 100.0, 10.0, "in-run")})
        for m, v in enumerate([200.0, 10.0, 100.0], start=1):
            sig = db.observe(st, cfg, "rank:0", metric, v, T0 + m * MINUTE_NS, 0, m)
            assert sig is not None
            judged.setdefault(metric, []).append(sig.view(0))
    tokens, steps = judged["tokens_per_s"], judged["step_time_s"]
    assert [s.value for s in tokens] == [100.0, 200.0, 10.0]
    assert [s.severity for s in tokens] == [None, None, "warning"]  # fewer tokens
    assert [s.severity for s in steps] == [None, "warning", None]  # slower steps
    assert tokens[1].score < 0.5 and tokens[1].detail["baseline"] == "in-run"


def test_series_are_capped_with_a_count() -> None:
    cfg, st = db.DynamicConfig(max_series=2), db.DynamicState()
    for i in range(5):
        db.observe(st, cfg, f"gpu:h/{i}", "gpu_util", 1.0, T0, 0, None)
    assert len(st.series) == 2 and st.overflow == 3


def _run(det: RunDetector, minutes: int, util, start: int = 0, stepping: bool = True) -> list:
    """hw samples every 10 s (and, ``stepping``, a step record with each)."""
    alerts = []
    for m in range(start, start + minutes):
        for s in range(0, 60, 10):
            t = T0 + m * MINUTE_NS + s * 10**9
            if stepping:
                data = {"loss": 2.0, "step_time_s": 0.5 + 0.01 * (s % 3), "tokens_per_s": 8e3}
                step = m * 6 + s // 10
                alerts += det.process(make_record("step", data, run_id="r", step=step, time_ns=t))[
                    1
                ]
            alerts += det.process(_hw(t, float(util(m, s))))[1]
    return alerts


def _baseline_rules(alerts: list) -> set[str]:
    return {a.rule for a in alerts if a.state == "firing" and a.rule.startswith("baseline")}


def test_a_run_gets_in_run_bands_and_alerts_on_a_gpu_that_drops_not_on_healthy_ones() -> None:
    rng = np.random.default_rng(2)
    noise = rng.normal(scale=1.0, size=(400, 60))

    def healthy(m: int, s: int) -> float:
        return 92.0 + noise[m, s]

    def dropped(m: int, s: int) -> float:
        return 35.0 + noise[m, s]

    busy = RunDetector("r", baselines_inline=True)
    idle = RunDetector("r", baselines_inline=True)
    for det in (busy, idle):
        assert _baseline_rules(_run(det, 120, healthy)) == set()
    dyn = busy.run_states["baseline"]
    tail = dyn.series[db.key_of("gpu:localhost/0", "gpu_util")]
    assert tail.band is not None and tail.band.baseline == "in-run"
    assert dyn.series[db.key_of("rank:0", "tokens_per_s")].band is not None
    assert db.key_of("net:localhost/ib0", "net_mb_s") in dyn.series
    # a checkpoint leaves the bands and minutes out (the stores have them): a small head
    head, ranks = busy.dump(busy.take_touched())
    back = RunDetector.load(head, lambda r, _slot: ranks.get(r))
    assert back is not None and back.run_states["baseline"].series == {}
    assert len(head) < 20_000
    # the GPU drops while the run steps: a hardware alert; while it does not (an evaluation,
    # a stall: the hang detector's case): none of the baseline's
    rules = _baseline_rules(_run(busy, 15, dropped, start=120))
    assert rules == {"baseline:gpu_util"} and topic_of("baseline:gpu_util") == "hardware"
    assert _baseline_rules(_run(idle, 15, dropped, start=120, stepping=False)) == set()
    assert topic_of("baseline:tokens_per_s") == "throughput"


def test_a_batch_of_steps_judges_as_its_steps_one_by_one() -> None:
    cfg = db.DynamicConfig(persist=1)
    rng = np.random.default_rng(0)
    n = 1000
    times = T0 + np.sort(rng.integers(0, 10 * MINUTE_NS, n))
    xs = rng.normal(100, 8, n)
    xs[::17] = np.nan
    steps = np.arange(n)
    one, many = db.DynamicState(), db.DynamicState()
    for st in (one, many):
        db.observe(st, cfg, "rank:0", "tokens_per_s", 100.0, T0 - MINUTE_NS, 0, 0)
        db.apply(st, {db.key_of("rank:0", "tokens_per_s"): _band(T0, 20, 100.0, 8.0)})
    a = [
        s
        for i in range(n)
        for s in db.on_steps(
            one, cfg, 0, steps[i : i + 1], times[i : i + 1], {"tokens_per_s": xs[i : i + 1]}
        )
    ]
    b = [
        s
        for k in range(0, n, 100)
        for s in db.on_steps(
            many, cfg, 0, steps[k : k + 100], times[k : k + 100], {"tokens_per_s": xs[k : k + 100]}
        )
    ]
    assert len(a) == len(b) == 9  # ten minutes: nine closed
    assert np.allclose([s.value[0] for s in a], [s.value[0] for s in b])
    assert [s.severity[0] for s in a] == [s.severity[0] for s in b]


def test_a_minute_must_also_move_ten_percent_to_count() -> None:
    cfg = db.DynamicConfig()
    # a quiet week's narrow band (90 +- 1): 92 is outside it but 2 % off, 80 is 11 % off
    assert not db.outside(cfg, "gpu_util", 92.0, 90.0, 89.0, 91.0)
    assert db.outside(cfg, "gpu_util", 80.0, 90.0, 89.0, 91.0)
    assert not db.outside(cfg, "tokens_per_s", 200.0, 90.0, 89.0, 91.0)  # more tokens: fine
    assert not db.outside(cfg, "gpu_util", 90.5, 90.0, 89.0, 91.0)
