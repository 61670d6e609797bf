"""The live view's curves, parameters and incident table, from records (pure: no MLflow)."""

from __future__ import annotations

import itertools

import pytest

from steplens.schema import make_record
from steplens.sinks.mlflow_board import MAX_NOTE_LEN, MAX_ROWS, Board
from steplens.sinks.mlflow_curves import MAX_BATCH_ENTRIES, MAX_PARAMS, key, params, points

T0 = 1_700_000_000_000_000_000


def _by_key(found):
    out: dict[str, list[tuple[int, float]]] = {}
    for k, v, _ts, step in found:
        out.setdefault(k, []).append((step, v))
    return out


def test_rank_0s_steps_draw_the_training_curves_and_other_ranks_none():
    data = {"loss": 2.5, "lr": 3e-4, "grad_norm": 1.2, "tokens_per_s": 900.0, "mfu": 0.31}
    data |= {"step_time_s": 0.5, "clipped": True, "scalars": {"aux loss": 0.1}}
    rec = make_record("step", data, run_id="r", step=7, time_ns=T0)
    got = _by_key(points(rec))
    assert got == {
        "train/loss": [(7, 2.5)],
        "train/lr": [(7, 3e-4)],
        "train/grad_norm": [(7, 1.2)],
        "train/step_time_s": [(7, 0.5)],
        "train/tokens_per_s": [(7, 900.0)],
        "train/mfu": [(7, 0.31)],
        "train/aux loss": [(7, 0.1)],
    }
    assert all(ts == T0 // 1_000_000 for _, _, ts, _ in points(rec))
    other = make_record("step", data, run_id="r", rank=1, step=7)
    assert points(other) == []


def test_a_nan_loss_is_no_point():
    rec = make_record("step", {"loss": float("nan"), "lr": 0.1}, run_id="r", step=1)
    assert _by_key(points(rec)) == {"train/lr": [(1, 0.1)]}


def test_a_long_step_batch_is_spread_evenly_and_keeps_its_last_step():
    n = 1000
    entries = [{"step": s, "time_ns": T0 + s, "loss": float(s)} for s in range(n)]
    entries = entries[: min(n, 4096)]
    rec = make_record("step_batch", {"records": entries}, run_id="r", step=n - 1)
    steps = [step for _, _, _, step in points(rec)]
    assert len(steps) == MAX_BATCH_ENTRIES and steps[-1] == n - 1
    gaps = {b - a for a, b in itertools.pairwise(steps)}
    assert gaps <= {3, 4}  # 1000 / 256 = 3.9
    short = make_record("step_batch", {"records": entries[:10]}, run_id="r", step=9)
    assert [s for _, _, _, s in points(short)] == list(range(10))


def test_a_window_draws_its_means_and_the_maxima_that_show_spikes():
    agg = {"count": 100, "mean": 2.0, "min": 1.0, "max": 9.0, "last": 2.0, "nonfinite": 0}
    data = {"step_first": 100, "step_last": 199, "count": 100}
    data["metrics"] = {"loss": agg, "mfu": {**agg, "mean": 0.4}}
    rec = make_record("step_window", data, run_id="r", step=199)
    assert _by_key(points(rec)) == {
        "window/loss": [(199, 2.0)],
        "window/loss_max": [(199, 9.0)],
        "window/mfu": [(199, 0.4)],
    }


def test_hardware_is_drawn_per_host_and_gpu_at_the_runs_last_step():
    gpus = [
        {"index": 0, "util_gpu": 97.0, "temp_c": 71, "mem_used_bytes": 40_000_000_000},
        {"index": 1, "util_gpu": 12.0, "power_w": 300.5},
    ]
    data = {"mem_total_bytes": 64_000_000_000, "mem_available_bytes": 16_000_000_000}
    rec = make_record(
        "hw", {**data, "cpu_percent": 35.0, "gpus": gpus}, run_id="r", rank=3, host="node#1"
    )
    got = _by_key(points(rec, step=420))
    assert got == {
        "hw/node_1/mem_used_gb": [(420, pytest.approx(48.0))],
        "hw/node_1/cpu_percent": [(420, 35.0)],
        "hw/node_1/gpu0/util": [(420, 97.0)],
        "hw/node_1/gpu0/temp_c": [(420, 71.0)],
        "hw/node_1/gpu0/mem_used_gb": [(420, pytest.approx(40.0))],
        "hw/node_1/gpu1/util": [(420, 12.0)],
        "hw/node_1/gpu1/power_w": [(420, 300.5)],
    }


def test_data_quality_from_batches_and_the_stream_jobs_signals():
    batch = make_record("batch", {"n_samples": 8, "over_length": 2}, run_id="r", step=5, time_ns=T0)
    assert _by_key(points(batch)) == {"data/batch_over_length_share": [(5, 0.25)]}
    dup = make_record(
        "signal",
        {"name": "data", "metric": "duplicate_rate", "value": 0.5, "score": 0.9},
        run_id="r",
        rank=-1,
        step=6,
    )
    assert _by_key(points(dup)) == {"data/duplicate_rate": [(6, 0.5)]}
    spike = make_record(
        "signal", {"name": "spike", "metric": "loss", "value": 3.0}, run_id="r", rank=-1, step=6
    )
    assert points(spike) == []


def test_run_meta_of_rank_0_gives_the_params():
    meta = {
        "world_size": 16,
        "hosts": ["a", "b"],
        "model": {"n_params": 124_000_000, "seq_len": 1024},
        "lr_schedule": {"kind": "cosine", "peak_lr": 3e-4, "warmup_steps": 100},
        "remedies": ["rewind", "lower_lr"],
        "checks": [{"check": "comm latency", "state": "off"}],
        "peak_flops": 9.9e14,
    }
    got = params(make_record("run_meta", meta, run_id="r"))
    assert got == {
        "world_size": "16",
        "peak_flops": "990000000000000.0",
        "remedies": "rewind, lower_lr",
        "hosts": "2: a, b",
        "model.n_params": "124000000",
        "model.seq_len": "1024",
        "lr_schedule.kind": "cosine",
        "lr_schedule.peak_lr": "0.0003",
        "lr_schedule.warmup_steps": "100",
        "check.comm latency": "off",
    }
    assert params(make_record("run_meta", meta, run_id="r", rank=1)) == {}
    wide = {"world_size": 1, "config": {f"k{i}": "v" * 900 for i in range(300)}}
    many = params(make_record("run_meta", wide, run_id="r"))
    assert len(many) == MAX_PARAMS and all(len(v) <= 500 for v in many.values())


def test_keys_become_valid_for_mlflow():
    assert key("hw/n1.example/gpu0/util") == "hw/n1.example/gpu0/util"
    assert key("train/a|b..c") == "train/a_b_.c"
    assert len(key("x" * 400)) == 250


def test_the_board_lists_the_newest_incident_first_and_stays_within_a_tag():
    board = Board()
    board.update("a", "warning firing run step 10: loss spike", "")
    board.update("b", "critical firing run step 20: hang", "rewind to /ck (step 0)\nlower lr")
    board.update("a", "warning resolved run step 30: loss spike", None)
    text = board.markdown()
    assert text.startswith("**steplens: 2 incidents, 1 open**")
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows[0] == "| critical firing run step 20: hang | rewind to /ck (step 0); lower lr |"
    assert rows[1] == "| warning resolved run step 30: loss spike | - |"
    again = Board.from_tags(
        {
            "steplens.alert.a": "warning resolved run step 30: loss spike",
            "steplens.alert.b": "critical firing run step 20: hang",
            "steplens.advice.b": "rewind to /ck (step 0)\nlower lr",
            "other": "x",
        }
    )
    assert sorted(again.rows.items()) == sorted(board.rows.items())
    for i in range(MAX_ROWS + 30):
        board.update(f"n{i}", f"info firing run step {i}: " + "x" * 300, "")
    assert len(board.rows) == MAX_ROWS and board.earlier == 32
    big = board.markdown()
    assert len(big) <= MAX_NOTE_LEN
    assert f"steplens: {MAX_ROWS + 32} incidents" in big and "earlier incidents not shown" in big
