"""The batch behind a step and per-layer norms, read across InfluxDB (recent) and S3 (older)."""

from __future__ import annotations

import time

import pytest
from influx_helpers import settings_from
from sinks_helpers import unique

from steplens.producer.pipeline.batch_stats import batch_payload
from steplens.schema import encode, make_record
from steplens.sinks import query_cli
from steplens.sinks.chunks import Chunker
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import Consumed
from steplens.sinks.query import Stores
from steplens.sinks.query_data import query_batch, query_layers
from steplens.sinks.s3 import S3Roller, ensure_bucket, make_s3_client
from steplens.sinks.settings import S3Settings

pytestmark = pytest.mark.stack
MIN = 60 * 10**9


def _write_cold(s: S3Settings, records) -> None:  # type: ignore[no-untyped-def]
    roller = S3Roller(make_s3_client(s), s)
    ensure_bucket(roller.client, s.bucket)
    buffer = Chunker(roller.marker, max_bytes=1 << 40)
    for i, rec in enumerate(records):
        buffer.add(Consumed("raw", 0, i, rec.key, encode(rec), rec))
    for chunk in buffer.due(everything=True):
        roller.write(chunk)


def _batch(run_id: str, step: int, t_ns: int, seed: int):  # type: ignore[no-untyped-def]
    rows = [[seed + i] * (3 + 5 * i) for i in range(4)]  # lengths 3, 8, 13, 18
    data, _ = batch_payload(rows, max_len=10, sample_ids=[f"doc-{seed + i}" for i in range(4)])
    data["epoch"] = 1
    rec = make_record("batch", data, run_id=run_id, rank=1, host="h1", step=step, time_ns=t_ns)
    return rec, data


def _step(run_id: str, step: int, t_ns: int):  # type: ignore[no-untyped-def]
    data = {
        "loss": 2.0,
        "layer_grad_norms": {"blocks.0": 0.1 * (step + 1), "head": 0.5},
        "layer_param_norms": {"blocks.0": 10.0 + step, "head": 20.0},
    }
    return make_record("step", data, run_id=run_id, rank=0, host="h0", step=step, time_ns=t_ns)


@pytest.fixture
def stored(stack_env):  # type: ignore[no-untyped-def]
    """Step 10's batch and steps 0-1 only in S3 (2 h old); step 20's and steps 2-3 only in
    InfluxDB."""
    influx = settings_from(stack_env)
    s3 = S3Settings(
        bucket=stack_env["STEPLENS_S3_BUCKET"],
        prefix=unique("qd"),
        endpoint_url=stack_env["STEPLENS_S3_ENDPOINT"],
    )
    run_id = unique("run")
    now = time.time_ns()
    old_batch, old_data = _batch(run_id, 10, now - 120 * MIN, seed=100)
    new_batch, new_data = _batch(run_id, 20, now - MIN, seed=200)
    old_steps = [_step(run_id, s, now - 120 * MIN + s * 10**6) for s in (0, 1)]
    new_steps = [_step(run_id, s, now - MIN + s * 10**6) for s in (2, 3)]
    _write_cold(s3, [old_batch, *old_steps])
    with make_client(influx) as client:
        result = InfluxSink(client, influx).export([new_batch, *new_steps])
    assert result.accepted == 3
    return run_id, Stores(influx, s3), old_data, new_data


def test_the_batch_of_a_step_from_either_store(stored, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    run_id, stores, old_data, new_data = stored
    for step, data, source in ((10, old_data, "s3"), (20, new_data, "influx")):
        b = query_batch(run_id, 1, step, stores=stores)
        assert b is not None and b.source == source and b.n_samples == 4
        assert b.hashes == data["sample_hashes"] and b.ids == data["sample_ids"]
        edges, counts = data["length_edges"], data["length_counts"]
        assert b.lengths == list(zip(edges, edges[1:], counts, strict=False))
        assert b.facts["length_max"] == 18 and b.facts["over_length"] == 2
        assert b.facts["epoch"] == 1
    assert query_batch(run_id, 1, 11, stores=stores) is None
    assert query_batch(run_id, 0, 10, stores=stores) is None
    monkeypatch.setenv("STEPLENS_INFLUX_URL", stores.influx.url)
    monkeypatch.setenv("STEPLENS_S3_PREFIX", stores.s3.prefix)
    assert query_cli.main(["--run", run_id, "--batch", "--rank", "1", "--step", "20"]) == 0
    out = capsys.readouterr().out
    assert "rank 1, step 20 (from influx): 4 samples" in out
    assert all(h in out for h in new_data["sample_hashes"]) and "doc-203" in out
    assert "[8,16) 2" in out


def test_layer_norms_from_either_store(stored) -> None:  # type: ignore[no-untyped-def]
    run_id, stores, _, _ = stored
    frame = query_layers(run_id, stores=stores)
    assert len(frame) == 8 and set(frame["layer"]) == {"blocks.0", "head"}
    blocks = frame[frame["layer"] == "blocks.0"].sort_values("step")
    assert list(blocks["step"]) == [0, 1, 2, 3]
    assert list(blocks["param_norm"]) == [10.0, 11.0, 12.0, 13.0]
    assert list(blocks["grad_norm"]) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert list(blocks["source"]) == ["s3", "s3", "influx", "influx"]
