"""Data quality (duplicates in a step vs repeats over time, language-model batches), the
bounded sketches behind them, GPU hardware errors, and the evidence keepers (samples, layers,
stacks)."""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np

from steplens.schema import make_record
from steplens.stream_jobs.engine.core import Run
from steplens.stream_jobs.engine.signals import (
    data_quality,
    gpu_errors,
    layers,
    lengths,
    samples,
    stacks,
)
from steplens.stream_jobs.engine.signals.sketches import Bloom, Distinct, keys


def md5(x: object) -> str:
    return hashlib.md5(str(x).encode()).hexdigest()[:16]


def rows(sigs):
    return [v for s in sigs for v in s.views()]


def batch(cfg, st, step, rank, ids, **more):
    data = {"n_samples": len(ids), "sample_hashes": [md5(i) for i in ids], **more}
    return {s.metric: s for s in rows(data_quality.update(st, cfg, data, step, rank)[1])}


def test_the_same_samples_on_two_ranks_in_a_step_are_a_sharding_bug_not_a_repeat():
    cfg, st = data_quality.DataConfig(), data_quality.DataState()
    got = []
    for step in range(30):
        for rank in range(4):
            shard = 0 if step >= 15 and rank == 1 else rank  # rank 1 reads rank 0's shard
            got.append(
                (
                    step,
                    batch(
                        cfg,
                        st,
                        step,
                        rank,
                        range(step * 400 + shard * 100, step * 400 + shard * 100 + 32),
                        epoch=0,
                    ),
                )
            )
    before = [m for s, m in got if s < 15]
    assert not [m for m in before for sig in m.values() if sig.severity]
    last = got[-1][1]
    assert last["duplicate_rate"].severity == "warning" and 0.2 < last["duplicate_rate"].value < 0.3
    assert last["repeat_rate"].severity is None  # a repeat is a sample seen at an earlier step


def test_repeats_within_an_epoch_warn_and_a_new_epoch_does_not():
    cfg, st = data_quality.DataConfig(), data_quality.DataState()
    corpus = 64 * 32
    for step in range(64):  # epoch 0: every sample once
        m = batch(cfg, st, step, 0, range(step * 32, step * 32 + 32), epoch=0)
        assert not [s for s in m.values() if s.severity]
    for step in range(64, 128):  # epoch 1: the same samples again, the record says so
        k = step - 64
        m = batch(cfg, st, step, 0, range(k * 32, k * 32 + 32), epoch=1)
        assert not [s for s in m.values() if s.severity], step
    detail = m["repeat_share"].detail
    assert detail["epoch"] == 1 and detail["samples"] == corpus
    assert abs(detail["distinct"] / corpus - 1) < 0.01  # the distinct count's own error
    # within epoch 2 the loader restarts at its start: samples of this epoch again
    for step in range(128, 148):
        k = step - 128 if step < 138 else step - 138
        m = batch(cfg, st, step, 0, range(k * 32, k * 32 + 32), epoch=2)
    assert m["repeat_rate"].severity == "warning" and 0.4 < m["repeat_rate"].value < 0.6
    # a rank still finishing epoch 1 is not counted as repeating epoch 2
    m = batch(cfg, st, 148, 1, range(5000, 5032), epoch=1)
    assert "repeat_rate" not in m and "duplicate_rate" in m


def test_without_an_epoch_repeats_are_reported_not_warned_about():
    cfg, st = data_quality.DataConfig(), data_quality.DataState()
    for step in range(80):
        k = step % 16
        m = batch(cfg, st, step, 0, range(k * 32, k * 32 + 32))
    assert m["repeat_rate"].value == 1.0 and m["repeat_rate"].severity is None
    assert m["repeat_share"].severity is None and m["repeat_share"].detail["epoch"] is None


def test_a_corpus_with_duplicates_far_apart_shows_in_the_epoch_share():
    """10 % of the samples are copies of samples long gone from the recent filter: the
    cumulative share (the distinct count) finds them."""
    cfg = data_quality.DataConfig()
    st = data_quality.DataState()
    rng = random.Random(3)
    for step in range(400):
        ids = [f"s{step * 64 + i}" for i in range(64)]
        for i in range(64):
            if step > 100 and rng.random() < 0.1:
                ids[i] = f"s{rng.randrange(0, 3000)}"  # a copy of an early sample
        m = batch(cfg, st, step, 0, ids, epoch=0)
    assert m["repeat_share"].severity == "warning" and 0.06 < m["repeat_share"].value < 0.1


def test_cross_rank_memory_is_bounded_and_keeps_finding_duplicates():
    cfg = data_quality.DataConfig(max_step_keys=512)
    st = data_quality.DataState()
    for step in range(6):
        for rank in range(16):  # 16 x 256 samples a step; rank 15 duplicates rank 0
            src = 0 if rank == 15 else rank
            m = batch(cfg, st, step, rank, [f"{step}-{src}-{i}" for i in range(256)])
    assert all(len(v) <= 512 for v in st.step_keys.values()) and st.keep_shift >= 3
    assert m["duplicate_rate"].severity == "warning"
    # the rate over the last 20 batch records: rank 15's are all duplicates, 1/16 of the rest
    assert 0.03 < m["duplicate_rate"].value < 0.12


def test_language_model_batches_report_their_supervised_share_and_never_warn():
    cfg, st = data_quality.DataConfig(), data_quality.DataState()
    for step in range(50):
        data = {"n_samples": 8, "supervised_share": 0.31, "label_counts": {"-100": 9000, "17": 2}}
        got = rows(data_quality.update(st, cfg, data, step, 0)[1])
        assert [(s.metric, s.value, s.severity) for s in got] == [("supervised_share", 0.31, None)]
    # class labels are judged, at most ``max_labels`` of them followed
    cfg = data_quality.DataConfig(max_labels=3)
    st = data_quality.DataState()
    data = {"n_samples": 8, "label_counts": {str(i): 50 for i in range(10)}}
    got = rows(data_quality.update(st, cfg, data, 1, 0)[1])
    assert len(st.labels) == 3 and st.labels_dropped == 350 and got[0].value == 1.0


def test_sketches_are_plain_arrays_and_accurate():
    ks = keys([md5(i) for i in range(100_000)])
    hll = Distinct()
    hll.add(ks)
    hll.add(ks[:50_000])
    assert abs(hll.count() / 100_000 - 1) < 0.03
    bloom = Bloom()
    fp = sum(
        int(bloom.seen_then_add(np.unique(ks[i : i + 500])).sum()) for i in range(0, 40_000, 500)
    )
    assert fp / 40_000 < 0.02  # distinct keys: every "seen" is a false positive
    assert bloom.seen_then_add(np.unique(ks[39_000:39_500])).all()
    assert isinstance(bloom.new, np.ndarray) and len(bloom.new) == 1 << 15
    # not hex: hashed; a short hex: spread by the mixer
    assert len(set(keys(["a", "b", "0f", "0e"]).tolist())) == 4


# ------------------------------------------------------------------------------ GPU errors
def gpu(**counters):
    return {"gpus": [{"index": 1, "uuid": "GPU-1", **counters}]}


def test_an_xid_or_an_uncorrectable_ecc_error_between_samples_is_critical():
    cfg, st = gpu_errors.GpuErrorConfig(), gpu_errors.GpuErrorState()
    seen = []
    for data in (
        gpu(xid_count=2, ecc_uncorrected=0, xid_last=31),  # the baseline: errors before us
        gpu(xid_count=2, ecc_uncorrected=0, xid_last=31),
        gpu(xid_count=3, ecc_uncorrected=0, xid_last=79),
        gpu(xid_count=3, ecc_uncorrected=1),
        gpu(xid_count=0, ecc_uncorrected=1),  # a reset: a new baseline
        gpu(xid_count=1, ecc_uncorrected=1, xid_last=48),
    ):
        seen.append(
            [
                (s.metric, s.value, s.severity, s.scope, s.detail)
                for s in rows(gpu_errors.hw(st, cfg, data, "n1", None, 0))
            ]
        )
    assert seen[0] == []
    assert seen[1] == [
        ("xid_count", 0.0, None, "gpu:n1/1", None),
        ("ecc_uncorrected", 0.0, None, "gpu:n1/1", None),
    ]
    assert seen[2][0] == (
        "xid_count", 1.0, "critical", "gpu:n1/1", {"total": 3.0, "xid_last": 79, "uuid": "GPU-1"}
    )  # fmt: skip
    assert seen[3][1][:3] == ("ecc_uncorrected", 1.0, "critical")
    assert [s[2] for s in seen[4]] == [None]
    assert seen[5][0][:3] == ("xid_count", 1.0, "critical")


# ------------------------------------------------------------------------------ evidence keepers
def test_samples_keep_the_last_steps_of_a_rank_bounded():
    cfg, st = samples.SamplesConfig(steps=4, max_samples=3), samples.SamplesState()
    for step in range(10):
        samples.keep(st, cfg, step, {"n_samples": 5, "sample_hashes": [md5(i) for i in range(5)],
                                     "sample_ids": [f"doc-{step}-{i}" for i in range(5)],
                                     "length_mean": 100.0, "max_len": 512,
                                     "length_edges": [0, 256, 512],
                                     "length_counts": [3, 2]})  # fmt: skip
    samples.keep(st, cfg, 9, {"n_samples": 2, "sample_ids": ["x"]})  # a second micro-batch
    assert [b["step"] for b in st.batches] == [6, 7, 8, 9]
    got = samples.names(st, cfg, "spike:loss", 9, {})["samples"]
    assert got["n_samples"] == 7 and len(got["hashes"]) == 3 and got["ids"][0] == "doc-9-0"
    assert got["length_mean"] == 100.0 and got["max_len"] == 512
    assert got["length_edges"] == [0, 256, 512] and got["length_counts"] == [3, 2]
    assert samples.names(st, cfg, "spike:loss", 3, {}) is None  # not kept any more
    assert samples.names(st, cfg, "straggler:step_time_s", 9, {}) is None


def test_layers_name_the_layers_that_moved_most():
    cfg, st = layers.LayersConfig(top=2), layers.LayersState()
    layers.keep(st, cfg, 10, {"layer_grad_norms": {"emb": 1.0, "h.0": 0.5, "h.1": 0.5}})
    layers.keep(st, cfg, 20, {"layer_grad_norms": {"emb": 1.1, "h.0": 40.0, "h.1": 0.01}})
    got = layers.names(st, cfg, "spike:grad_norm", 21, {})
    assert got == {
        "layers": [
            {"layer": "h.0", "before": 0.5, "now": 40.0, "ratio": 80.0},
            {"layer": "h.1", "before": 0.5, "now": 0.01, "ratio": 0.02},
        ],
        "layers_step": 20,
    }
    layers.keep(st, cfg, 30, {"layer_grad_norms": {"h.1": math.inf}})
    assert layers.names(st, cfg, "nonfinite:grad_norm", 30, {})["layers"][0]["layer"] == "h.1"
    assert layers.names(st, cfg, "training:param_norm", 30, {}) is None  # no parameter norms
    assert layers.names(st, cfg, "spike:grad_norm", 5000, {}) is None  # too old to say


def test_stacks_are_bounded_and_only_those_of_the_current_stall_are_named():
    cfg, st = stacks.StacksConfig(max_threads=2, max_chars=100), stacks.StacksState()
    threads = [{"name": f"t{i}", "id": i, "stack": "x" * 500 + f"frame{i}"} for i in range(5)]
    stacks.keep(st, cfg, None, {"stalled_s": 70.0, "last_step": 41, "threads": threads})
    got = stacks.names(st, cfg, "hang:progress", None, {"last_step": 41})["stacks"]
    assert [t["name"] for t in got["threads"]] == ["t0", "t1"] and got["threads_sent"] == 5
    assert all(
        len(t["stack"]) == 50 and t["stack"].endswith(t["name"].replace("t", "frame"))
        for t in got["threads"]
    )
    assert stacks.names(st, cfg, "hang:progress", None, {"last_step": 90}) is None


def test_length_histograms_are_summed_over_a_window_of_all_ranks():
    """One histogram per ``window`` batch records (both ranks), its counts the sum of theirs,
    its value the mean length; another max length closes the window early."""
    cfg, st = lengths.LengthConfig(window=4), lengths.LengthState()
    edges = [0, 128, 256, 512]

    def rec(step, rank, counts, mean, over=0, e=edges):
        data = {"n_samples": sum(counts), "length_edges": e, "length_counts": counts,
                "length_mean": mean, "over_length": over}  # fmt: skip
        return make_record("batch", data, run_id="r", rank=rank, step=step, time_ns=step + 1)

    out = []
    for i in range(4):
        for rank in range(2):
            got = lengths.on_record(st, cfg, rec(i, rank, [1, 2, 1], 200.0, over=1), Run())
            out += [v for s in got for v in s.views()]
    assert [(v.step, v.value) for v in out] == [(1, 200.0), (3, 200.0)]
    d = out[0].detail
    assert d["edges"] == edges and d["counts"] == [4, 8, 4] and d["samples"] == 16
    assert d["over_length_share"] == 4 / 16 and d["first_step"] == 0
    assert out[0].severity is None
    assert st.records == 0
    lengths.on_record(st, cfg, rec(4, 0, [2, 0, 0], 10.0), Run())
    got = lengths.on_record(st, cfg, rec(4, 1, [0, 4], 300.0, e=[0, 256, 1024]), Run())
    (v,) = [v for s in got for v in s.views()]
    assert v.detail["counts"] == [2, 0, 0] and v.value == 10.0
    assert st.edges == [0, 256, 1024] and st.counts == [0, 4] and st.records == 1
    # a malformed histogram is not counted
    bad = rec(5, 0, [1, 2], 1.0)  # two counts for three bins
    assert lengths.on_record(st, cfg, bad, Run()) == [] and st.records == 1
