import math

import numpy as np

from steplens.stream_jobs.engine.core import Column
from steplens.stream_jobs.engine.signals import data_quality, evals, thresholds, training


def rows(got):
    """A record detector's signals (state and list, or list) as rows."""
    state, sigs = got if isinstance(got, tuple) else (None, got)
    out = [v for s in sigs for v in s.views()]
    return out if state is None else (state, out)


def one(st, cfg, metric, x, step):
    got = training.update(
        st, cfg, metric, Column(np.array([float(x)]), np.array([step]), np.array([0]), 0)
    )
    return st, [] if got is None else got.views()


def test_plateau_after_patience_and_perplexity_mismatch():
    st = evals.EvalState()
    cfg = evals.EvalConfig()
    sev = []
    for i, loss in enumerate([3.0, 2.5, 2.4, 2.41, 2.42, 2.40, 2.43, 2.41]):
        metrics = {"loss": loss, "perplexity": math.exp(loss), "accuracy": 0.5}
        st, sigs = rows(evals.update(st, cfg, "val", metrics, None, i))
        sev.append({(s.name, s.metric, s.severity) for s in sigs if s.severity})
    # five evaluations without improvement: a suggestion (info), of the loss only (the
    # accuracy stalled from the start, which the loss's plateau already says)
    assert sev[:7] == [set()] * 7 and sev[7] == {("plateau", "eval_loss", "info")}
    _, sigs = rows(evals.update(st, cfg, "val", {"loss": 2.0, "perplexity": 12.0}, None, 9))
    assert "perplexity" in {s.name for s in sigs if s.severity}


def test_widening_gap_and_unstable_metric():
    st = evals.EvalState()
    cfg = evals.EvalConfig()
    names = set()
    for i, (val, train) in enumerate([(2.0, 1.9), (2.1, 1.7), (2.2, 1.5), (2.3, 1.3)]):
        st, sigs = rows(evals.update(st, cfg, "val", {"loss": val}, train, i))
        names |= {s.name for s in sigs if s.severity}
    assert "generalization_gap" in names
    st = evals.EvalState()
    flagged = []
    for i, acc in enumerate([0.5, 0.8, 0.4, 0.85, 0.3]):
        st, sigs = rows(evals.update(st, cfg, "val", {"accuracy": acc}, None, i))
        flagged += [s.step for s in sigs if s.name == "eval_unstable" and s.severity]
    assert flagged == [4]


def test_duplicates_across_ranks_and_label_imbalance():
    st = data_quality.DataState()
    cfg = data_quality.DataConfig()
    rates = []
    for step in range(10):
        for rank in range(2):
            hashes = [f"{step}-{rank}-{i}" for i in range(32)]
            if step >= 5:  # rank 1 sees rank 0's samples
                hashes = [f"{step}-0-{i}" for i in range(32)]
            st, sigs = rows(
                data_quality.update(st, cfg, {"n_samples": 32, "sample_hashes": hashes}, step, rank)
            )
            rates += [(step, s.severity) for s in sigs if s.metric == "duplicate_rate"]
    assert all(sev is None for step, sev in rates if step < 5)
    assert rates[-1][1] == "warning"
    # the same samples again in a later epoch are not duplicates
    st3 = data_quality.DataState()
    for step in range(20):
        hashes = [f"s{(step % 4) * 32 + i}" for i in range(32)]
        st3, sigs = rows(
            data_quality.update(st3, cfg, {"n_samples": 32, "sample_hashes": hashes}, step, 0)
        )
        assert sigs[-1].severity is None
    st2 = data_quality.DataState()
    _, sigs = rows(
        data_quality.update(st2, cfg, {"n_samples": 500, "label_counts": {"a": 495, "b": 4}}, 1, 0)
    )
    assert [s.severity for s in sigs if s.metric == "label_imbalance"] == ["warning"]


def test_hw_thresholds_and_sustained_low_util():
    st = thresholds.ThresholdState()
    cfg = thresholds.ThresholdConfig()
    gib = 1 << 30
    seen = []
    for _ in range(4):
        data = {
            "gpus": [
                {
                    "index": 0,
                    "mem_used_bytes": 76 * gib,
                    "mem_total_bytes": 80 * gib,
                    "util_gpu": 20,
                }
            ],
            "disks": [{"device": "nvme0", "io_latency_ms": 3.0}],
            "mem_available_bytes": 1 * gib,
            "mem_total_bytes": 100 * gib,
        }
        st, sigs = rows(thresholds.hw(st, cfg, data, "n1", None, 0, True))
        seen.append(sorted(s.metric for s in sigs if s.severity))
    assert seen[0] == ["host_mem_available_pct"]  # GPU memory: test_gpu_memory.py
    assert "gpu_util" in seen[2] and "disk_io_latency_ms" not in seen[3]
    comm = rows(thresholds.comm(cfg, {"op": "all_reduce", "latency_ms": 80.0}, 3, 1))
    assert comm[0].severity == "warning" and comm[0].scope == "rank:1"


def test_update_share_below_five_percent_warns_once_it_persists_and_param_norm_instability():
    """``update_ratio`` is the share of elements updated by more than 1e-3 of their size: an
    Adam step moves most of them (0.6-0.9); a collapse (an lr decayed to nothing) moves almost
    none. Below 5 % for 3 values in a row warns; one low value does not."""
    st = training.TrainingState()
    cfg = training.TrainingConfig()
    flags = []
    for i in range(40):
        r = 0.02 if i == 10 else (0.75 if i < 30 else 0.01)
        st, sigs = one(st, cfg, "update_ratio", r, i)
        flags += [s.step for s in sigs if s.severity]
    assert flags == list(range(32, 40))
    assert sigs[0].expected == 0.05 and sigs[0].score > 0.8
    # not judged before the declared warmup ends (a warming lr moves few elements)
    st = training.TrainingState(schedule={"peak_lr": 1e-3, "warmup_steps": 100})
    got = [one(st, cfg, "update_ratio", 0.001, i)[1] for i in range(0, 200, 10)]
    assert [len(g) for g in got] == [0] * 10 + [1] * 10
    assert [bool(g[0].severity) for g in got[10:]] == [False] * 2 + [True] * 8
    st = training.TrainingState()
    flags = []
    for i in range(40):
        st, sigs = one(st, cfg, "param_norm", 100.0 if i < 25 else 100.0 * 1.5 ** (i - 24), i)
        flags += [s.step for s in sigs if s.severity]
    assert flags and 25 < flags[0] < 32
    # a norm growing steadily, 4x over the window (early training), is its trend: quiet
    st, flags = training.TrainingState(), []
    for i in range(60):
        st, sigs = one(st, cfg, "param_norm", 10.0 + 2.0 * i, i)
        flags += [s.step for s in sigs if s.severity]
    assert flags == []


def test_eval_interval_from_the_cadence_and_the_noise():
    """Results 500 steps apart that swing by 0.03 around 0.515: one result's noise is the
    spread of the changes over sqrt(2); four results average it below the 5 % change."""
    got = evals.eval_interval([0, 500, 1000, 1500, 2000], [0.50, 0.53, 0.50, 0.53, 0.50], 0.05)
    assert got is not None
    noise = math.sqrt(4 * 0.03**2 / 3) / math.sqrt(2)
    assert got.every == 500 and math.isclose(got.noise, noise, rel_tol=1e-9)
    assert math.isclose(got.change, 0.05 * 0.512, rel_tol=1e-9)
    assert got.factor == math.ceil((2 * noise / (0.05 * 0.512)) ** 2) == 4
    assert got.suggested == 125
    assert 2 * got.noise / math.sqrt(got.factor) <= got.change  # the mean tells the change
    assert "evaluate every 125 steps instead of every 500" in got.advice()
    # fewer than four results, or no step between them: nothing to say
    assert evals.eval_interval([0, 500, 1000], [0.5, 0.53, 0.5], 0.05) is None
    assert evals.eval_interval([7, 7, 7, 7], [0.5, 0.53, 0.5, 0.53], 0.05) is None


def test_eval_interval_reads_the_noise_of_a_drifting_metric():
    """Gaussian noise of known size on a metric that improves: the estimate recovers it
    (within sampling error), the drift is the change worth seeing, and the factor is capped."""
    rng = np.random.default_rng(3)
    steps = np.arange(0, 200 * 250, 250)
    values = 2.0 - 1e-5 * steps + rng.normal(0, 0.02, len(steps))
    got = evals.eval_interval(list(steps), list(values), 0.001, max_factor=64)
    assert got is not None and math.isclose(got.noise, 0.02, rel_tol=0.15)
    assert math.isclose(got.change, 250 * 1e-5, rel_tol=0.5)
    assert got.factor == 64 and got.suggested == 4  # (2 * 0.02 / 0.0025)^2 = 256: capped
    quiet = evals.eval_interval(list(steps), list(2.0 - 1e-4 * steps), 0.001)
    assert quiet is not None and quiet.factor == 2  # no noise: twice as often at least


def test_an_unstable_metric_says_how_often_to_evaluate():
    st, cfg = evals.EvalState(), evals.EvalConfig()
    found = []
    for i, acc in enumerate([0.5, 0.8, 0.4, 0.85, 0.3]):
        st, sigs = rows(evals.update(st, cfg, "val", {"accuracy": acc}, None, 1000 * i))
        found += [s.detail for s in sigs if s.name == "eval_unstable" and s.severity]
    (detail,) = found
    assert detail["eval_every"] == 1000 and detail["eval_every_suggested"] == round(1000 / 16)
    assert detail["advice"].startswith("evaluate every 62 steps instead of every 1000")


def _data_wait(steps, shares, sustained=False, streak=(0, -1, False)):
    """``thresholds.data_wait`` of one rank's rows at ``steps`` whose shares of a 1 s step
    are ``shares`` (one for all, or one each): its signals and the rank's streak after."""
    from steplens.stream_jobs.engine.signals.thresholds import ThresholdConfig, data_wait

    n = len(steps)
    return data_wait(
        ThresholdConfig(),
        np.broadcast_to(np.asarray(shares, dtype=float), (n,)).copy(),
        np.ones(n),
        np.array(steps, dtype=np.int64),
        np.arange(n, dtype=np.int64),
        0,
        sustained=sustained,
        streak=streak,
    )


def test_data_wait_warns_on_rows_in_a_row_and_windows_judge_the_steps_between():
    """Three rows over the share in a row warn; a window over it warns alone; once a rank
    sends windows, the steps it sends between them are in a row only when their steps are (a
    stall's steps, not a guard's outliers apart)."""

    def sev(steps, sustained=False, streak=(0, -1, False)):
        sigs, streak = _data_wait(steps, 0.6, sustained, streak)
        return [s.severity for s in sigs.views()], streak

    assert sev([10, 11, 12])[0] == ["info", "info", "warning"]
    assert sev([10, 20, 30])[0] == ["info", "info", "warning"]  # logged every 10 steps
    _, streak = sev([10, 11])
    assert sev([12], streak=streak)[0] == ["warning"]  # the streak goes on across batches
    got, streak = sev([99], sustained=True)
    assert got == ["warning"]
    assert sev([101, 103, 105], streak=streak)[0] == ["info", "info", "info"]
    assert sev([101, 102, 103], streak=streak)[0] == ["info", "info", "warning"]


def test_a_window_arriving_inside_a_stall_neither_breaks_nor_extends_its_streak():
    """A stall's first step is sent raw, then the window that ends at it (its mean share low:
    99 fast steps and one slow) arrives: the stall still warns at its third slow step, and a
    window over the share counts no step of the streak."""

    def sev(steps, share, sustained=False, streak=(0, -1, True)):
        sigs, streak = _data_wait(steps, share, sustained, streak)
        return [s.severity for s in sigs.views()], streak

    got, streak = sev([900], 0.9)
    assert got == ["info"]
    got, streak = sev([900], 0.05, sustained=True, streak=streak)  # the window 801-900
    assert got == [None]
    assert sev([901, 902], 0.9, streak=streak)[0] == ["info", "warning"]
    got, streak = sev([1000], 0.6, sustained=True)  # a window over the share warns alone
    assert got == ["warning"]
    assert sev([1001, 1002], 0.9, streak=streak)[0] == ["info", "info"]


def test_a_lone_slow_step_scores_below_a_stall_however_long_it_waited():
    """A row's data-wait score weighs its share by how much of a stall its streak makes: one
    step that waited its whole time (a pause of the process) scores below the third step of a
    stall that waits 80 % of each step; the stall's rows rise as it goes on."""

    def scores(shares):
        sigs, _ = _data_wait(range(100, 100 + len(shares)), shares)
        return [s.score for s in sigs.views()]

    lone = scores([0.1, 1.0, 0.1])[1]
    stall = scores([0.1, 0.8, 0.8, 0.8])
    assert stall[1] < stall[2] < stall[3]
    assert lone < stall[3]
