"""The store's layout (``steplens.schema.store_layout``) is what the influx sink writes: the
measurement of each kind, the run, rank and host tags, the device lists of a hw record, the
fields of non-finite numbers; and its Flux builders quote what they are given."""

from __future__ import annotations

from typing import Any

import pytest

from steplens.schema import make_record
from steplens.schema import store_layout as layout
from steplens.schema.flux_literals import flux_string
from steplens.sinks.points import record_builders

# a record of every kind the sink stores, with the payload fields its kind requires
PAYLOADS: dict[str, dict[str, Any]] = {
    "step": {"loss": 2.0},
    "step_batch": {"records": [{"step": 1, "time_ns": 10, "loss": 2.0}]},
    "step_window": {
        "step_first": 1,
        "step_last": 100,
        "count": 100,
        "metrics": {"loss": {"mean": 2.0, "count": 100}},
    },
    "eval": {"split": "val", "loss": 1.0},
    "batch": {"n_samples": 8},
    "hw": {"cpu_percent": 5.0},
    "comm": {"op": "all_reduce", "latency_ms": 1.5},
    "health": {"sent": 3},
    "signal": {"name": "spike", "metric": "loss", "value": 1.0},
    "alert": {
        "rule": "loss_spike",
        "severity": "warning",
        "state": "firing",
        "scope": "run",
        "hint": "look",
        "fingerprint": "fp",
    },
    "run_meta": {"world_size": 8},
    "stacks": {"stalled_s": 30.0, "threads": [{"name": "main", "id": 1, "stack": "f()"}]},
    "advice": {"action": "skip_samples", "fingerprint": "fp"},
    "acted": {"action": "skip_samples", "fingerprint": "fp", "outcome": "acted"},
    "checkpoint": {"path": "/ckpt/100"},
}


def _record(kind: str, data: dict[str, Any]) -> Any:
    return make_record(kind, data, run_id="r1", rank=3, host="n1", seq=1, step=5, time_ns=10)


def test_every_kind_the_sink_stores_has_its_measurement_in_the_layout() -> None:
    assert set(PAYLOADS) == set(layout.MEASUREMENT)


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_a_kinds_main_point_is_written_where_the_layout_says(kind: str) -> None:
    main, *others = record_builders(_record(kind, PAYLOADS[kind]))
    assert main.measurement == layout.MEASUREMENT[kind]
    assert main.tags[layout.RUN] == "r1"
    assert layout.SEQ in main.fields
    assert {b.measurement for b in others} <= layout.MEASUREMENTS


def test_the_rank_and_host_tags_are_the_layouts() -> None:
    (step,) = record_builders(_record("step", {"loss": 1.0}))
    assert step.tags[layout.RANK] == "3" and step.tags[layout.HOST] == "n1"


def test_a_hw_records_device_lists_are_written_as_the_layout_names_them() -> None:
    data = {
        "gpus": [{"index": 0, "util_gpu": 90.0}],
        "disks": [{"device": "nvme0", "read_mb_s": 5.0}],
        "nets": [{"iface": "ib0", "rx_mb_s": 7.0}],
    }
    _host, *devices = record_builders(_record("hw", data))
    written = {b.measurement: b for b in devices}
    for name, (measurement, tag, key) in layout.DEVICE_LISTS.items():
        point = written[measurement]
        assert point.tags[tag] == str(data[name][0][key])
        assert key not in point.fields or key == tag


def test_a_step_layers_and_a_run_metas_checks_have_measurements_of_their_own() -> None:
    step = _record("step", {"loss": 1.0, "layer_grad_norms": {"l0": 0.5}})
    meta = _record("run_meta", {"world_size": 1, "checks": [{"check": "c", "state": "on"}]})
    assert [b.measurement for b in record_builders(step)] == ["step", layout.LAYER]
    assert [b.measurement for b in record_builders(meta)] == ["run_meta", layout.CHECK]


def test_a_non_finite_number_goes_to_the_field_the_layout_names() -> None:
    (step,) = record_builders(_record("step", {"loss": float("inf")}))
    assert step.fields[layout.nonfinite("loss")] == "Infinity" and "loss" not in step.fields


def test_rolled_fields_are_named_by_aggregate_and_only_kept_aggregates_exist() -> None:
    assert [layout.rolled("loss", a) for a in layout.AGGREGATES] == [
        "loss_mean",
        "loss_min",
        "loss_max",
        "loss_last",
    ]
    with pytest.raises(ValueError, match="median"):
        layout.rolled("loss", "median")


def test_conditions_quote_their_values_and_index_odd_tag_names() -> None:
    assert layout.tag_in("rank", ["1", "2"]) == 'r.rank == "1" or r.rank == "2"'
    assert layout.tag_in("a tag", ['x"y']) == 'r["a tag"] == "x\\"y"'
    assert layout.field_in(["a", "b"]) == 'r._field == "a" or r._field == "b"'
    got = layout.of_run("step", flux_string("r${x}"))
    assert got == 'r._measurement == "step" and r.run_id == "r\\${x}"'


def test_a_read_and_a_mark_are_whole_flux_queries() -> None:
    got = layout.read("hot", "0", "1", "true")
    assert (
        got == 'from(bucket: "hot")\n  |> range(start: 0, stop: 1)\n  |> filter(fn: (r) => true)\n'
    )
    mark = layout.last_mark("rollups", layout.LEASE, layout.LEASE_FIELD, 210)
    assert "range(start: -210s, stop: 1m)" in mark and mark.rstrip().endswith("|> last()")
    assert 'r._measurement == "rollup_lease" and r._field == "owner"' in mark


def test_the_rollups_fold_summary_fields_the_sink_writes() -> None:
    """Every field ``FOLDS`` names is one the influx sink writes for its measurement, with
    kept aggregates among ``AGGREGATES``: a renamed window or signal field fails here, not as
    a field silently rolled up four ways again."""
    stats = {"count": 3, "mean": 1.0, "std": 0.25, "min": 0.5, "max": 1.5, "last": 1.0}
    window = {"step_first": 1, "step_last": 3, "count": 3, "duration_s": 3.0, "metrics": {}}
    window["metrics"] = {"loss": {**stats, "nonfinite": 0}}
    band = {"expected": 1.0, "lower": 0.0, "upper": 2.0, "score": 0.5}
    signal = {"name": "arima", "metric": "loss", "value": 1.0, **band}
    written = {
        b.measurement: set(b.fields)
        for kind, data in (("step_window", window), ("signal", signal))
        for b in record_builders(make_record(kind, data, run_id="r", step=3, time_ns=1))
    }
    for measurement, folds in layout.FOLDS.items():
        assert set(folds) <= written[measurement], measurement
        assert all(kept and set(kept) <= set(layout.AGGREGATES) for kept in folds.values())
    assert layout.folds("step_window", "max") == ("max",)
    assert layout.folds("step", "loss") == layout.AGGREGATES
