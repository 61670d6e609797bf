"""query_series / query_records / replay over the real InfluxDB and S3 server."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from influx_helpers import settings_from
from sinks_helpers import read_all, step_records, unique

from steplens.schema import decode, encode, make_record
from steplens.sinks import query_cli
from steplens.sinks.chunks import Chunker
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import Consumed
from steplens.sinks.query import StoreRefused, Stores, query_records, query_series
from steplens.sinks.replay import replay
from steplens.sinks.s3 import S3Roller, ensure_bucket, make_s3_client
from steplens.sinks.settings import S3Settings

pytestmark = pytest.mark.stack
MIN = 60 * 10**9


def write_cold(s: S3Settings, records, partition: int = 0, first: int = 0) -> None:
    roller = S3Roller(make_s3_client(s), s)
    ensure_bucket(roller.client, s.bucket)
    buffer = Chunker(roller.marker, max_bytes=1 << 40)
    for i, rec in enumerate(records):
        buffer.add(Consumed("raw", partition, first + i, rec.key, encode(rec), rec))
    for chunk in buffer.due(everything=True):
        roller.write(chunk)


@pytest.fixture
def seamed_run(stack_env):
    """100 records only in S3 (2 h old), 100 in both (10 min old), 100 only in InfluxDB."""
    influx = settings_from(stack_env)
    s3 = S3Settings(
        bucket=stack_env["STEPLENS_S3_BUCKET"],
        prefix=unique("q"),
        endpoint_url=stack_env["STEPLENS_S3_ENDPOINT"],
    )
    run_id = unique("run")
    now = time.time_ns()
    old = step_records(run_id, 100, ranks=2, t0_ns=now - 120 * MIN)
    mid = step_records(run_id, 100, ranks=2, t0_ns=now - 10 * MIN)
    new = step_records(run_id, 100, ranks=2, t0_ns=now - MIN)
    mid = [replace(r, seq=r.seq + 1000, step=r.step + 1000) for r in mid]
    new = [replace(r, seq=r.seq + 2000, step=r.step + 2000) for r in new]
    write_cold(s3, old + mid)
    with make_client(influx) as client:
        result = InfluxSink(client, influx).export(old + mid + new)
    assert (result.skipped, result.accepted) == (100, 200)
    return run_id, Stores(influx, s3), old + mid + new


def test_series_is_stitched_once_across_the_seam(seamed_run) -> None:
    run_id, stores, recs = seamed_run
    frame = query_series(run_id, "loss", stores=stores)
    assert len(frame) == 300
    assert list(frame["time_ns"]) == sorted(r.time_ns for r in recs)
    assert list(frame["value"]) == [r.data["loss"] for r in sorted(recs, key=lambda r: r.time_ns)]
    assert frame["source"].value_counts().to_dict() == {"influx": 200, "s3": 100}
    assert frame["time"].dt.tz is not None
    only1 = query_series(run_id, "loss", rank=1, stores=stores)
    assert len(only1) == 150 and set(only1["rank"]) == {1}
    t_mid = recs[100].time_ns
    window = query_series(run_id, "loss", since=t_mid, until=recs[199].time_ns, stores=stores)
    assert len(window) == 100 and set(window["source"]) == {"influx"}
    older = query_series(run_id, "z", until=recs[99].time_ns, stores=stores)
    assert list(older["value"]) == [float(i) for i in range(100)]


def test_influx_down_still_answers_from_s3(seamed_run) -> None:
    run_id, stores, _ = seamed_run
    broken = replace(stores.influx, url="http://127.0.0.1:1", timeout_ms=500)
    frame = query_series(run_id, "loss", stores=Stores(broken, stores.s3))
    assert len(frame) == 200 and set(frame["source"]) == {"s3"}


def test_a_refused_token_fails_the_query_instead_of_falling_back(
    seamed_run, monkeypatch, capsys
) -> None:
    """InfluxDB answers 401 to a wrong token: the answer from S3 alone would lack the recent
    points without a word, so the query fails with the reason, and the command exits non-zero."""
    run_id, stores, _ = seamed_run
    wrong = replace(stores.influx, token="not-the-token")
    with pytest.raises(StoreRefused, match=r"HTTP 401.*STEPLENS_INFLUX_TOKEN"):
        query_series(run_id, "loss", stores=Stores(wrong, stores.s3))
    for k, v in {
        "STEPLENS_INFLUX_URL": stores.influx.url,
        "STEPLENS_INFLUX_TOKEN": "not-the-token",
        "STEPLENS_S3_PREFIX": stores.s3.prefix,
    }.items():
        monkeypatch.setenv(k, v)
    assert query_cli.main(["--run", run_id, "--metric", "loss"]) == 2
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "STEPLENS_INFLUX_TOKEN" in err
    assert stores.influx.token not in err


def test_refused_s3_keys_fail_the_query(seamed_run) -> None:
    run_id, stores, _ = seamed_run
    wrong = replace(stores.s3, access_key_id="nobody", secret_access_key="wrong-secret")
    with pytest.raises(StoreRefused, match=r"S3 at .* answered HTTP 403"):
        query_series(run_id, "loss", stores=Stores(stores.influx, wrong))


def test_records_and_cli(seamed_run, tmp_path, monkeypatch) -> None:
    run_id, stores, _ = seamed_run
    frame = query_records(run_id, "step", stores=stores)
    assert len(frame) == 300
    assert frame["scalars.z"].notna().all()
    for k, v in {
        "STEPLENS_INFLUX_URL": stores.influx.url,
        "STEPLENS_S3_PREFIX": stores.s3.prefix,
    }.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "loss.csv"
    assert (
        query_cli.main(["--run", run_id, "--metric", "loss", "--rank", "0", "--csv", str(out)]) == 0
    )
    lines = out.read_text().splitlines()
    assert lines[0].startswith("time,time_ns,step,rank,value,source") and len(lines) == 151


def test_replay_restreams_cold_records_byte_for_byte(seamed_run, stack_env) -> None:
    run_id, stores, recs = seamed_run
    topic = unique("replay")
    n = replay(stores.s3, run_id, topic, bootstrap=stack_env["STEPLENS_KAFKA_BOOTSTRAP"])
    assert n == 200
    got = [decode(m) for m in read_all(stack_env["STEPLENS_KAFKA_BOOTSTRAP"], topic, 200)]
    assert sorted(got, key=lambda r: r.time_ns) == sorted(recs[:200], key=lambda r: r.time_ns)


def test_hw_records_come_back_with_their_device_lists_from_both_stores(stack_env) -> None:
    influx = settings_from(stack_env)
    s3 = S3Settings(
        bucket=stack_env["STEPLENS_S3_BUCKET"],
        prefix=unique("hw"),
        endpoint_url=stack_env["STEPLENS_S3_ENDPOINT"],
    )
    run_id = unique("run")
    now = time.time_ns()
    gpus = [{"index": 0, "util_gpu": 50.0, "name": "H200"}, {"index": 1, "util_gpu": 75.0}]
    recs = [
        make_record("hw", {"cpu_percent": 10.0, "gpus": gpus}, run_id=run_id, host="n1", time_ns=t)
        for t in (now - 120 * MIN, now - MIN)
    ]
    write_cold(s3, recs[:1])
    with make_client(influx) as client:
        InfluxSink(client, influx).export(recs)
    frame = query_records(run_id, "hw", stores=Stores(influx, s3))
    assert list(frame["source"]) == ["s3", "influx"]
    for got in frame["gpus"]:
        assert sorted(g["index"] for g in got) == [0, 1]
        assert {g["index"]: g["util_gpu"] for g in got} == {0: 50.0, 1: 75.0}
