"""Parquet rows and object keys: pure, no server."""

from __future__ import annotations

import json
import math

import pyarrow.dataset as ds

from steplens.schema import decode, encode, make_record, unbatch
from steplens.sinks.cold import (
    GroupKey,
    group_of,
    hour_from_key,
    object_key,
    read_parquet,
    record_row,
    rows_to_parquet,
)

T = 1_700_000_000_123_456_789  # 2023-11-14T22:13:20Z


def test_key_is_hive_style_and_derived_from_the_offset_range() -> None:
    g = GroupKey("step", "run/1 x", "2023-11-14T22")
    key = object_key("cold", g, "steplens.raw", 3, first=100, last=250)
    assert (
        key
        == "cold/kind=step/run_id=run%2F1%20x/hour=2023-11-14T22/steplens.raw-p3-o100-250.parquet"
    )
    assert object_key("cold", g, "steplens.raw", 3, first=100, last=250) == key
    assert hour_from_key(key) == "2023-11-14T22"


def test_group_is_kind_run_and_utc_hour() -> None:
    rec = make_record("step", {"loss": 1.0}, run_id="r", time_ns=T)
    assert group_of(rec) == GroupKey("step", "r", "2023-11-14T22")


def test_rows_keep_types_nan_maps_and_the_exact_payload() -> None:
    recs = [
        make_record(
            "step",
            {"loss": float("nan"), "scalars": {"a": 1.0}, "group_lrs": [0.1]},
            run_id="r",
            time_ns=T,
            step=1,
        ),
        make_record(
            "step",
            {"loss": 2.0, "scalars": {"b": 2.0}, "clipped": False},
            run_id="r",
            time_ns=T + 1,
            step=2,
            seq=1,
        ),
    ]
    rows = [record_row(r, "raw", 0, i, encode(r)) for i, r in enumerate(recs)]
    table = read_parquet(rows_to_parquet("step", rows))
    got = table.to_pylist()
    assert math.isnan(got[0]["loss"]) and got[1]["loss"] == 2.0
    assert got[0]["scalars.a"] == 1.0 and got[0]["scalars.b"] is None and got[1]["scalars.b"] == 2.0
    assert got[0]["group_lrs"] == "[0.1]" and got[1]["clipped"] is False
    assert [r["payload"] for r in got] == [encode(r) for r in recs]
    assert decode(got[1]["payload"]) == recs[1]
    assert str(table.schema.field("time").type) == "timestamp[ns, tz=UTC]"
    assert table.schema.field("step").type == table.schema.field("time_ns").type


def test_written_layout_reads_back_with_hive_partitioning(tmp_path) -> None:
    rec = make_record(
        "eval", {"split": "val", "loss": 1.5, "extra": {"acc@1": 0.5}}, run_id="a b/c", time_ns=T
    )
    key = object_key("", group_of(rec), "raw", 0, first=0, last=0)
    path = tmp_path / key
    path.parent.mkdir(parents=True)
    path.write_bytes(rows_to_parquet("eval", [record_row(rec, "raw", 0, 0, encode(rec))]))
    dataset = ds.dataset(
        tmp_path,
        format="parquet",
        partitioning=ds.partitioning(flavor="hive"),
        exclude_invalid_files=True,
    )
    table = dataset.to_table(columns=["loss", "extra.acc@1", "hour"])
    assert table.to_pylist() == [{"loss": 1.5, "extra.acc@1": 0.5, "hour": "2023-11-14T22"}]


def test_step_payloads_decode_to_the_steps_of_the_batch() -> None:
    """A batch's step rows carry each step record's own bytes: encoding the unbatched steps."""
    entries = [
        {"step": 1, "time_ns": T, "loss": "NaN", "lr": 1, "scalars": {"z": "-Infinity"}},
        {"step": 2, "time_ns": T + 1, "loss": 0.5, "grad_norm": None, "group_lrs": [1e-4]},
    ]
    wire = {"v": 1, "kind": "step_batch", "run_id": "r", "rank": 3, "local_rank": 1}
    wire |= {"host": "h", "pid": 9, "seq": 4, "time_ns": T + 1, "step": 2}
    raw = encode({**wire, "data": {"records": entries}})
    batch = decode(raw)
    steps = unbatch(batch)
    payloads = [encode(s) for s in steps]
    assert repr([decode(p) for p in payloads]) == repr(steps)  # repr: NaN equals NaN
    assert [decode(p).step for p in payloads] == [1, 2]
    assert b"null" not in payloads[1] and b'"kind":"step"' in payloads[0]
    assert math.isnan(decode(payloads[0]).data["loss"])


def test_advice_acted_and_checkpoint_rows_keep_their_fields() -> None:
    recs = {
        "advice": make_record(
            "advice",
            {"action": "skip_samples", "fingerprint": "f", "sample_ids": ["a", "b"]},
            run_id="r",
            rank=-1,
            time_ns=T,
            step=9,
        ),
        "acted": make_record(
            "acted",
            {"action": "skip_samples", "fingerprint": "f", "outcome": "acted"},
            run_id="r",
            time_ns=T,
            step=10,
        ),
        "checkpoint": make_record("checkpoint", {"path": "/c/8"}, run_id="r", time_ns=T, step=8),
    }
    for kind, rec in recs.items():
        table = read_parquet(rows_to_parquet(kind, [record_row(rec, "t", 0, 1, encode(rec))]))
        [got] = table.to_pylist()
        assert decode(got["payload"]) == rec, kind
    table = read_parquet(rows_to_parquet("advice", [record_row(recs["advice"], "t", 0, 1, b"")]))
    row = table.to_pylist()[0]
    assert row["action"] == "skip_samples" and json.loads(row["sample_ids"]) == ["a", "b"]


def test_list_and_map_fields_are_the_wire_s_json_text() -> None:
    """A field that is neither a number nor a map of numbers is stored as the JSON text the
    wire holds for it: non-finite floats by name, large floats in Python's spelling, text as
    it is, nulls kept."""
    gpus = [{"index": 0, "temp_c": float("nan"), "name": "Ä100"}, {"index": 1, "x": None}]
    lrs = [0.1, float("inf"), 1e16, -float("inf"), 1.234e22]
    rec = make_record("step", {"loss": 1.0, "group_lrs": lrs}, run_id="r", time_ns=T, step=1)
    row = record_row(rec, "raw", 0, 0, encode(rec))
    assert row["group_lrs"] == '[0.1,"Infinity",1e+16,"-Infinity",1.234e+22]'
    hw = make_record("hw", {"gpus": gpus}, run_id="r", time_ns=T)
    text = record_row(hw, "raw", 0, 1, encode(hw))["gpus"]
    assert json.loads(text) == [
        {"index": 0, "temp_c": "NaN", "name": "Ä100"},
        {"index": 1, "x": None},
    ]
    assert text in encode(hw).decode()  # the very text of the wire
