"""Grafana dashboards: well-formed JSON, and every panel's Flux query answers on real data.

Grafana does not run here: each panel's query is executed against the real InfluxDB with the
Grafana variables substituted, after the quick demo has written a run.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

BOARD_DIR = Path(__file__).parents[2] / "deploy" / "grafana" / "dashboards"
PIPELINE = BOARD_DIR / "pipeline.json"  # Prometheus: the workers' and sinks' own metrics
DASHBOARDS = sorted(p for p in BOARD_DIR.glob("*.json") if p != PIPELINE)
DATASOURCE_UID = "steplens-influxdb"


def _panels() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            out.append((f"{path.stem}/{panel['title']}", panel))
    return out


def substitute(query: str, run_id: str, bucket: str) -> str:
    """What Grafana does before sending a panel's query (dashboard variables, time range)."""
    return (
        query.replace("${bucket}", bucket)
        .replace("${run_id}", run_id)
        .replace("v.timeRangeStart", "-6h")
        .replace("v.timeRangeStop", "now()")
        .replace("v.windowPeriod", "10s")
    )


def test_the_boards_are_there():
    assert {p.stem for p in DASHBOARDS} == {"training", "hardware", "alerts"}
    assert PIPELINE.exists()


def _exposed_metric_families() -> set[str]:
    """Names the worker (its own registry) and the sinks (the default one) register."""
    from prometheus_client import REGISTRY

    import steplens.sinks.metrics  # noqa: F401  (module-level metrics)
    from steplens.stream_jobs.metrics import WorkerMetrics

    worker = WorkerMetrics().registry
    return {family.name for reg in (REGISTRY, worker) for family in reg.collect()}


def test_pipeline_board_reads_metrics_the_processes_expose():
    pytest.importorskip("steplens.stream_jobs.metrics")
    board = json.loads(PIPELINE.read_text())
    exposed = _exposed_metric_families()
    used = set()
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "steplens-prometheus"
        for target in panel["targets"]:
            used |= set(re.findall(r"steplens_[a-z_]+", target["expr"]))
    assert used
    for name in used:
        family = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert family in exposed, f"{name}: no such metric in the worker or the sinks"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_provisionable(path):
    board = json.loads(path.read_text())
    assert board["uid"].startswith("steplens-")
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"bucket", "run_id"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == DATASOURCE_UID
        assert panel["targets"] and panel["steplensFields"]
        for target in panel["targets"]:
            assert '"${run_id}"' in target["query"] and "${bucket}" in target["query"]
            assert "v.timeRangeStart" in target["query"]


def _rows(client: Any, org: str, query: str) -> list[dict[str, Any]]:
    tables = client.query_api().query(query, org=org)
    return [rec.values for table in tables for rec in table.records]


def _write_gpu_sample(env: dict[str, str], run_id: str) -> None:
    """The demo trains on the CPU: add one host sample with a GPU, through the influx sink's
    own point conversion, so the GPU panels have a series to read."""
    from influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS

    from steplens.producer.schema import make_record
    from steplens.sinks.points import record_lines

    gpu = {
        "index": 0,
        "uuid": "GPU-e2e",
        "name": "test",
        "mem_used_bytes": 40 << 30,
        "mem_total_bytes": 80 << 30,
        "util_gpu": 97.0,
        "util_mem": 60.0,
        "power_w": 500.0,
        "temp_c": 61.0,
        "sm_clock_mhz": 1980.0,
    }
    rec = make_record(
        "hw",
        {
            "cpu_percent": 50.0,
            "mem_available_bytes": 1 << 30,
            "mem_total_bytes": 2 << 30,
            "gpus": [gpu],
            "gpu_status": "ok",
        },
        run_id=run_id,
        host="gpu-node",
        time_ns=time.time_ns(),
    )
    with InfluxDBClient(
        url=env["STEPLENS_INFLUX_URL"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        org=env["STEPLENS_INFLUX_ORG"],
    ) as client:
        client.write_api(write_options=SYNCHRONOUS).write(
            bucket=env["STEPLENS_INFLUX_BUCKET"], record=record_lines(rec)
        )


@pytest.fixture(scope="module")
def demo_in_influx(quick_demo):
    assert quick_demo.returncode == 0, quick_demo.output[-3000:]
    _write_gpu_sample(quick_demo.env, quick_demo.run_id)
    return quick_demo


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.parametrize(("name", "panel"), _panels(), ids=[n for n, _ in _panels()])
def test_panel_query_returns_the_plotted_fields(demo_in_influx, name, panel):
    from influxdb_client import InfluxDBClient

    env = demo_in_influx.env
    with InfluxDBClient(
        url=env["STEPLENS_INFLUX_URL"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        org=env["STEPLENS_INFLUX_ORG"],
        timeout=30_000,
    ) as client:
        rows = []
        for target in panel["targets"]:
            query = substitute(
                target["query"], demo_in_influx.run_id, env["STEPLENS_INFLUX_BUCKET"]
            )
            rows += _rows(client, env["STEPLENS_INFLUX_ORG"], query)
    assert rows, f"{name}: no rows"
    columns = set().union(*(r.keys() for r in rows))
    fields = {r.get("_field") for r in rows}
    for wanted in panel["steplensFields"]:
        assert wanted in columns or wanted in fields, f"{name}: {wanted} not returned"
    assert all(r.get("run_id", demo_in_influx.run_id) == demo_in_influx.run_id for r in rows)
