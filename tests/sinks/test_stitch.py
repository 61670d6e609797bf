"""Stitching the hot and cold frames: pure pandas, no server."""

from __future__ import annotations

import pandas as pd

from steplens.sinks.query import _metric_names, _ns, stitch


def frame(times, ranks, values) -> pd.DataFrame:
    return pd.DataFrame(
        {"time_ns": times, "rank": ranks, "host": ["h"] * len(times), "value": values}
    )


def test_points_in_both_stores_appear_once_and_hot_wins() -> None:
    cold = frame([1, 2, 3, 3], [0, 0, 0, 1], [1.0, 2.0, 3.0, 30.0])
    hot = frame([3, 4], [0, 0], [3.0, 4.0])
    out = stitch(hot, cold, ["rank", "host"])
    assert list(zip(out["time_ns"], out["rank"], out["source"], strict=True)) == [
        (1, 0, "s3"),
        (2, 0, "s3"),
        (3, 0, "influx"),
        (3, 1, "s3"),
        (4, 0, "influx"),
    ]
    assert str(out["time"].dt.tz) == "UTC"


def test_empty_sides() -> None:
    assert stitch(pd.DataFrame(), pd.DataFrame(), ["rank"]).empty
    assert list(stitch(pd.DataFrame(), frame([1], [0], [1.0]), ["rank"])["source"]) == ["s3"]


def test_metric_names_map_scalars_and_reserved_names() -> None:
    assert _metric_names("step", "loss") == ("loss", "loss")
    assert _metric_names("step", "aux") == ("aux", "scalars.aux")
    assert _metric_names("eval", "exact_match") == ("exact_match", "extra.exact_match")
    assert _metric_names("comm", "latency_ms") == ("latency_ms", "latency_ms")


def test_time_arguments() -> None:
    assert _ns(5) == 5
    assert _ns("2023-11-14T22:13:20Z") == 1_700_000_000 * 10**9
    assert abs(_ns("-1h") - (pd.Timestamp.now(tz="UTC").value - 3600 * 10**9)) < 10**9
