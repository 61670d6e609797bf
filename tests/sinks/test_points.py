"""Records to InfluxDB points: pure, no server."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sinks_helpers import step_batch, step_records

from steplens.schema import make_record
from steplens.sinks.points import (
    MAX_STRING_FIELD,
    UnwritableRecord,
    check_name,
    json_list,
    record_builders,
    record_lines,
    record_points,
)


def test_step_point_carries_tags_fields_and_the_records_time() -> None:
    rec = make_record(
        "step",
        {
            "loss": 2.5,
            "tokens": 4096,
            "clipped": True,
            "group_lrs": [0.1, 0.2],
            "scalars": {"aux": 0.5, "loss": 9.0},
        },
        run_id="r1",
        rank=3,
        host="n1",
        seq=7,
        step=42,
        time_ns=1_700_000_000_000_000_001,
    )
    (line,) = record_lines(rec)
    head, fields, ts = line.split(" ")
    assert head == "step,host=n1,rank=3,run_id=r1" and ts == "1700000000000000001"
    got = dict(f.split("=", 1) for f in fields.split(","))
    assert got == {
        "aux": "0.5",
        "clipped": "true",
        "loss": "2.5",
        "lr_group0": "0.1",
        "lr_group1": "0.2",
        "scalar_loss": "9",
        "seq": "7i",
        "step": "42i",
        "tokens": "4096i",
    }


def test_same_record_gives_the_same_line_so_rewrites_are_idempotent() -> None:
    rec = make_record("eval", {"split": "val", "loss": 1.0}, run_id="r", time_ns=5, step=1)
    assert record_lines(rec) == record_lines(rec)


def test_non_finite_values_become_string_fields() -> None:
    rec = make_record(
        "step", {"loss": float("nan"), "grad_norm": float("-inf")}, run_id="r", time_ns=1
    )
    (line,) = record_lines(rec)
    assert 'loss_nonfinite="NaN"' in line and 'grad_norm_nonfinite="-Infinity"' in line
    assert "loss=" not in line.replace("loss_nonfinite", "")


def test_hostile_names_are_escaped_not_split() -> None:
    rec = make_record("step", {"loss": 1.0}, run_id='a,b c="d"', host="x=y", time_ns=1)
    (line,) = record_lines(rec)
    assert line.startswith('step,host=x\\=y,rank=0,run_id=a\\,b\\ c\\="d" ')
    assert "\n" not in line


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\tb", "end\\", "a\\,b", "nul\x00"])
def test_names_line_protocol_would_alter_are_rejected(bad: str) -> None:
    with pytest.raises(UnwritableRecord):
        check_name(bad, "tag")
    rec = make_record("step", {"loss": 1.0}, run_id="r", host=bad, time_ns=1)
    with pytest.raises(UnwritableRecord):
        record_points(rec)


def test_string_fields_keep_newlines_quotes_and_backslashes() -> None:
    rec = make_record(
        "alert",
        {
            "rule": "r",
            "severity": "warning",
            "state": "firing",
            "scope": "run",
            "hint": 'a\n"b"\\c',
            "fingerprint": "f",
            "evidence": {"x": [1, 2]},
        },
        run_id="r",
        rank=-1,
        time_ns=1,
    )
    (line,) = record_lines(rec)
    assert 'hint="a\n\\"b\\"\\\\c"' in line and 'evidence="{\\"x\\": [1, 2]}"' in line


def test_hw_record_splits_into_host_gpu_disk_and_net_points() -> None:
    rec = make_record(
        "hw",
        {
            "cpu_percent": 50.0,
            "gpus": [{"index": 0, "power_w": 300, "name": "H200"}, {"index": 1, "power_w": 250.5}],
            "disks": [{"device": "nvme0", "read_mb_s": 1}],
            "nets": [{"iface": "ib0", "rx_mb_s": 2.0}],
        },
        run_id="r",
        host="n1",
        time_ns=9,
    )
    lines = record_lines(rec)
    assert [ln.split(",")[0] for ln in lines] == ["host", "gpu", "gpu", "disk", "net"]
    assert "gpu=0" in lines[1] and "power_w=300 " not in lines[1] and "power_w=300," in lines[1]
    assert 'name="H200"' in lines[1] and "gpu=1" in lines[2]


def test_every_kind_but_dead_letters_has_points() -> None:
    samples = {
        "step_window": {
            "step_first": 1,
            "step_last": 9,
            "count": 9,
            "metrics": {
                "loss": {
                    "count": 9,
                    "mean": 1.0,
                    "min": 0.5,
                    "max": 2.0,
                    "last": 1.0,
                    "nonfinite": 0,
                }
            },
        },
        "batch": {"n_samples": 8, "label_counts": {"cat": 3}},
        "comm": {"op": "all_reduce", "peer": 1, "latency_ms": 0.5},
        "health": {"sent": 10, "dropped": {"queue_full": 2}, "rss_bytes": 5 << 30},
        "signal": {"name": "spike", "metric": "loss", "value": 9.0, "score": 0.9},
        "run_meta": {"world_size": 8, "lr_schedule": {"kind": "cosine"}},
    }
    for kind, data in samples.items():
        lines = record_lines(make_record(kind, data, run_id="r", time_ns=1, step=1))
        assert lines and all(" seq=0i" in ln or ",seq=0i" in ln for ln in lines), kind
        if kind == "health":  # the rank's process memory, a series of its own
            assert any(f"rss_bytes={5 << 30}i" in ln for ln in lines)
    dl = make_record("dead_letter", {"reason": "x"}, run_id="r", time_ns=1)
    with pytest.raises(UnwritableRecord):
        record_points(dl)


def test_a_step_batch_gives_the_lines_of_its_steps() -> None:
    steps = [replace(r, seq=4) for r in step_records("r", 5, ranks=1, t0_ns=1_700_000_000 * 10**9)]
    lines = record_lines(step_batch(steps))
    assert lines == [line for r in steps for line in record_lines(r)]
    assert len(set(lines)) == 5


def test_signals_of_one_record_with_other_scopes_are_other_series() -> None:
    """The worker gives a signal the time of the record it judged: one hardware record's
    signals of two GPUs share it, and only the scope tells their points apart."""
    gpus = [
        make_record(
            "signal",
            {
                "name": "threshold",
                "metric": "gpu_mem_pct",
                "value": v,
                "score": 0.5,
                "detail": {"scope": f"gpu:n1/{k}"},
            },
            run_id="r",
            time_ns=5,
        )
        for k, v in enumerate((91.0, 40.0))
    ]
    heads = [record_lines(r)[0].split(" ")[0] for r in gpus]
    assert heads[0] != heads[1] and all("scope=gpu:n1/" in h for h in heads)
    run = make_record("signal", {"name": "spike", "metric": "loss", "value": 1.0}, run_id="r")
    assert "scope=run" in record_lines(run)[0].split(" ")[0]


def test_layer_norms_become_layer_points_counted_as_names() -> None:
    data = {
        "loss": 1.0,
        "layer_grad_norms": {"model.layers.0": 0.5, "lm_head": float("nan")},
        "layer_param_norms": {"model.layers.0": 12.0, "lm_head": 30.0, "model.embed": 8.0},
    }
    rec = make_record("step", data, run_id="r", rank=2, step=9, time_ns=5)
    builders = record_builders(rec)
    assert [b.measurement for b in builders] == ["step", "layer", "layer", "layer"]
    step, *layers = builders
    assert not any(k.startswith("layer") for k in step.fields)
    got = {b.tags["layer"]: b.fields for b in layers}
    assert got["model.layers.0"] == {"seq": 0, "step": 9, "grad_norm": 0.5, "param_norm": 12.0}
    assert got["lm_head"]["grad_norm_nonfinite"] == "NaN" and got["lm_head"]["param_norm"] == 30.0
    assert "grad_norm" not in got["model.embed"]
    assert all(b.name_tag == "layer" and b.tags["rank"] == "2" for b in layers)
    entries = [{"step": 9, "time_ns": 5, **data}]
    batch = make_record("step_batch", {"records": entries}, run_id="r", rank=2, step=9)
    assert [b.measurement for b in record_builders(batch)] == ["step", "layer", "layer", "layer"]


def test_batch_point_has_the_length_histogram_shares_and_samples() -> None:
    data = {
        "n_samples": 4,
        "length_edges": [0, 1, 2, 4, 8],
        "length_counts": [0, 1, 0, 3],
        "length_max": 7,
        "max_len": 5,
        "over_length": 2,
        "supervised_share": 0.75,
        "epoch": 3,
        "sample_hashes": ["a" * 16, "b" * 16],
        "sample_ids": ["doc-1", "doc-2"],
    }
    (b,) = record_builders(make_record("batch", data, run_id="r", step=4, time_ns=1))
    f = b.fields
    assert (f["len_lt_1"], f["len_lt_2"], f["len_lt_4"], f["len_lt_8"]) == (0, 1, 0, 3)
    assert f["over_length_share"] == 0.5 and f["supervised_share"] == 0.75 and f["epoch"] == 3
    assert json.loads(f["sample_hashes"]) == data["sample_hashes"]
    assert json.loads(f["sample_ids"]) == ["doc-1", "doc-2"]


def test_long_sample_lists_are_cut_to_whole_items() -> None:
    ids = [f"id-{i:06d}" for i in range(20_000)]
    text = json_list(ids)
    kept = json.loads(text)
    assert len(text) <= MAX_STRING_FIELD and kept == ids[: len(kept)] and len(kept) > 1000


def test_stacks_and_window_std() -> None:
    threads = [
        {"name": "MainThread", "id": 11, "stack": 'File "train.py", line 9, in all_reduce\n'},
        {"name": "loader", "id": 12, "stack": "x" * 70_000},
    ]
    rec = make_record(
        "stacks",
        {"stalled_s": 75.5, "last_step": 41, "threads": threads},
        run_id="r",
        rank=3,
        host="n1",
        step=41,
        time_ns=7,
    )
    (b,) = record_builders(rec)
    assert b.measurement == "stacks" and b.tags == {"run_id": "r", "rank": "3", "host": "n1"}
    f = b.fields
    assert (f["stalled_s"], f["last_step"], f["n_threads"]) == (75.5, 41, 2)
    assert "--- thread MainThread (11)" in f["text"] and "in all_reduce" in f["text"]
    assert len(f["text"]) == MAX_STRING_FIELD
    stats = {"count": 3, "mean": 1.0, "std": 0.25, "min": 0.5, "max": 1.5, "last": 1.0}
    window = {"step_first": 1, "step_last": 3, "count": 3, "metrics": {"loss": stats}}
    (w,) = record_builders(make_record("step_window", window, run_id="r", time_ns=1))
    assert w.fields["std"] == 0.25


def test_run_meta_writes_a_point_per_check() -> None:
    checks = [
        {"check": "loss volatility", "state": "on use", "needs": "log_step(step, loss=loss)"},
        {"check": "stragglers", "state": "off", "why": "one rank", "enable": "torchrun"},
        {"check": "", "state": "on"},  # nameless: left out
    ]
    rec = make_record("run_meta", {"world_size": 1, "checks": checks}, run_id="r", rank=0)
    meta, *points = record_builders(rec)
    assert meta.measurement == "run_meta" and json.loads(meta.fields["checks"]) == checks
    assert {p.measurement for p in points} == {"check"}
    got = {p.tags["check"]: (p.tags["rank"], p.fields) for p in points}
    assert set(got) == {"loss volatility", "stragglers"}
    rank, fields = got["stragglers"]
    assert rank == "0" and fields["on"] == 0 and fields["why"] == "one rank"
    assert fields["enable"] == "torchrun" and got["loss volatility"][1]["on"] == 1


ADVICE = {
    "action": "skip_samples",
    "fingerprint": "inc-1",
    "rule": "spike:loss",
    "reason": "loss spike",
    "onset_step": 250,
    "sample_ids": ["doc-1", "doc-2"],
}


def test_advice_acted_and_checkpoints_are_points() -> None:
    advice = make_record("advice", ADVICE, run_id="r", rank=-1, time_ns=5, step=250)
    [line] = record_lines(advice)
    assert line.startswith("advice,action=skip_samples,fingerprint=inc-1,run_id=r ")
    assert "rank=-1i" in line and "onset_step=250i" in line and "n_sample_ids=2i" in line
    assert 'sample_ids="[\\"doc-1\\", \\"doc-2\\"]"' in line
    rewind = {"action": "rewind", "fingerprint": "inc-2", "checkpoint": "/c/200"}
    rewind |= {"checkpoint_step": 200, "skip_batches": 250, "at_step": 290, "steps_lost": 90}
    rewind |= {"batches_skipped": 250, "evidence": "loss 2.3 vs trend 1.7"}
    [line] = record_lines(make_record("advice", rewind, run_id="r", rank=-1, time_ns=5))
    assert 'checkpoint="/c/200"' in line and "skip_batches=250i" in line
    assert "at_step=290i" in line and "steps_lost=90i" in line and "batches_skipped=250i" in line
    assert 'evidence="loss 2.3 vs trend 1.7"' in line
    acted = {"action": "rewind", "fingerprint": "inc-2", "outcome": "acted", "detail": "ok"}
    [line] = record_lines(make_record("acted", acted, run_id="r", rank=3, time_ns=6, step=260))
    assert line.startswith("acted,action=rewind,outcome=acted,rank=3,run_id=r ")
    assert 'fingerprint="inc-2"' in line and "step=260i" in line
    ckpt = make_record("checkpoint", {"path": "/c/200"}, run_id="r", rank=0, time_ns=7, step=200)
    [line] = record_lines(ckpt)
    assert line.startswith("checkpoint,rank=0,run_id=r ") and 'path="/c/200"' in line
    meta = {"world_size": 1, "remedies": ["rewind"]}
    [line] = record_lines(make_record("run_meta", meta, run_id="r", time_ns=8))
    assert 'remedies="[\\"rewind\\"]"' in line


def test_advice_is_described_with_its_step_cost_and_whether_it_was_held() -> None:
    from steplens.sinks.remedies import describe

    rewind = {"action": "rewind", "checkpoint": "/c/200", "checkpoint_step": 200}
    rewind |= {"skip_batches": 100, "at_step": 290, "steps_lost": 90, "batches_skipped": 190}
    text = describe(rewind)
    assert text.startswith("rewind to /c/200 (step 200), skip 100 batches at step 290")
    assert "90 steps lost, 190 batches skipped" in text and "a person decides" not in text
    held = describe({**rewind, "held": "budget"})
    assert "not sent (budget): a person decides" in held
    assert describe({"action": "skip_samples", "n_samples": 3}) == "skip 3 samples"
