"""Grafana dashboards: the files are what ``deploy/grafana/boards`` describes, Prometheus finds
every replica, and every panel's Flux query answers on real data for short and long ranges.

Grafana does not run here: each query goes to the real InfluxDB after the substitutions Grafana
makes (dashboard variables, then its Flux macros), once the quick demo has written a run.
The demo trains on the CPU of one host, so it writes no GPU statistics, no XID event, no
producer loss and no incident; nor BLEU, ROUGE or F1, a language-model batch, a stalled rank's
stacks or an lr event: for those panels the test writes a few points of the measurements
themselves, built by the producer's own GPU sampler (on a stand-in for NVML), host-rate
functions, batch statistics and stack dump, and stored through the influx sink's point
conversion. For the long
ranges, the run's points are copied three days back into a scratch bucket and rolled up from
there by the sinks' ``run_rollup``, so the rollup path has data to return.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
BOARD_DIR = ROOT / "deploy" / "grafana" / "dashboards"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PIPELINE = BOARD_DIR / "pipeline.json"  # Prometheus: the workers' and sinks' own metrics
DASHBOARDS = sorted(p for p in BOARD_DIR.glob("*.json") if p != PIPELINE)
DATASOURCE_UID = "steplens-influxdb"
SHIFT = timedelta(days=3)  # where the rolled-up copy of the run lies
WINDOWED = {"timeseries", "status-history", "state-timeline"}


def _boards_package() -> Any:
    sys.path.insert(0, str(ROOT / "deploy" / "grafana"))
    try:
        import boards
    finally:
        sys.path.pop(0)
    return boards


def _targets(board: dict[str, Any]) -> list[tuple[str, dict[str, Any], list[str]]]:
    """(name, panel, queries) of every panel and of the annotation."""
    out = [(p["title"], p, [t["query"] for t in p["targets"]]) for p in board["panels"]]
    for a in board["annotations"]["list"]:
        out.append((f"annotation {a['name']}", {"type": "annotation"}, [a["target"]["query"]]))
    return out


def _all_targets() -> list[tuple[str, dict[str, Any], dict[str, Any], list[str]]]:
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for name, panel, queries in _targets(board):
            out.append((f"{path.stem}/{name}", board, panel, queries))
    return out


@dataclass(frozen=True)
class Range:
    """A dashboard time range as Grafana sends it: absolute times and the panel's interval."""

    name: str
    start: datetime
    stop: datetime
    window_s: int


def go_duration(seconds: int) -> str:
    """Go's ``time.Duration.String()``, which Grafana puts in for ``v.windowPeriod``."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    return f"{m}m{s}s" if m else f"{s}s"


def flux_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def grafana_query(query: str, board: dict[str, Any], run_id: str, span: Range) -> str:
    """Dashboard variables (``${name}``), then the Flux macros of Grafana's InfluxDB data
    source (pkg/tsdb/influxdb/flux/macros.go: any ``word.timeRangeStart`` and the like)."""
    values = {v["name"]: v.get("query", "") for v in board["templating"]["list"]}
    values["run_id"] = run_id
    for name, value in values.items():
        query = query.replace("${" + name + "}", value)
    macros = {
        "timeRangeStart": flux_time(span.start),
        "timeRangeStop": flux_time(span.stop),
        "windowPeriod": go_duration(span.window_s),
    }
    return re.sub(r"([a-zA-Z]+)\.([a-zA-Z]+)", lambda m: macros.get(m.group(2), m.group(0)), query)


# --------------------------------------------------------------------------- files


def test_the_boards_are_there():
    assert {p.stem for p in DASHBOARDS} == {"training", "hardware", "alerts"}
    assert PIPELINE.exists()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_the_files_are_what_the_description_writes(path):
    """Edit ``deploy/grafana/boards`` and run ``cd deploy/grafana && python -m boards``."""
    boards = _boards_package()
    assert path.read_text() == boards.render(boards.BOARDS[path.stem])


def test_a_panel_reads_only_what_the_store_holds():
    """Measurements and rollup aggregates come from the store's layout: a board that names
    another fails when it is written."""
    flux = _boards_package().flux
    with pytest.raises(ValueError, match="no measurement 'gpus'"):
        flux.Read("gpus", ("util_gpu",))
    with pytest.raises(ValueError, match="no 'p99'"):
        flux.per_interval(flux.Read("gpu", ("util_gpu",)), "p99")


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_provisionable(path):
    board = json.loads(path.read_text())
    assert board["uid"].startswith("steplens-")
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"bucket", "rollup_bucket", "hot_window", "run_id"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for name, panel, queries in _targets(board):
        if panel["type"] != "annotation":
            assert panel["datasource"]["uid"] == DATASOURCE_UID, name
            assert panel["steplensFields"], name
        for query in queries:
            assert '"${run_id}"' in query and "${bucket}" in query, name
            assert "v.timeRangeStart" in query, name
            # Grafana rewrites any word.timeRangeStart, word.bucket, ...: only v. may use them
            used = re.findall(
                r"([a-zA-Z]+)\.(timeRangeStart|timeRangeStop|windowPeriod|bucket|"
                r"defaultBucket|organization)\b",
                query,
            )
            assert {prefix for prefix, _ in used} <= {"v"}, name


def _exposed_metric_families() -> set[str]:
    """Names the worker (its own registry) and the sinks (the default one) register."""
    from prometheus_client import REGISTRY

    import steplens.sinks.metrics  # noqa: F401  (module-level metrics)
    from steplens.stream_jobs.worker.metrics import WorkerMetrics

    worker = WorkerMetrics().registry
    return {family.name for reg in (REGISTRY, worker) for family in reg.collect()}


def test_pipeline_board_reads_metrics_the_processes_expose():
    pytest.importorskip("steplens.stream_jobs.worker.metrics")
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


def test_prometheus_finds_every_replica_and_the_nodes():
    """Compose services by DNS (one A record per replica of ``--scale``), the producers' node
    endpoint (port 9467 on local rank 0) by DNS or by files, none of them a fixed target."""
    yaml = pytest.importorskip("yaml")
    jobs = {j["job_name"]: j for j in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    services = {
        "steplens-worker": ("worker", 9464),
        "steplens-sink-influx": ("sink-influx", 9465),
        "steplens-sink-s3": ("sink-s3", 9466),
    }
    for job, (service, port) in services.items():
        assert "static_configs" not in jobs[job]
        assert jobs[job]["dns_sd_configs"] == [
            {"names": [service], "type": "A", "port": port, "refresh_interval": "15s"}
        ]
    node = jobs["steplens-node"]
    assert "static_configs" not in node
    assert {d["port"] for d in node["dns_sd_configs"]} == {9467}
    assert all(d["type"] == "A" for d in node["dns_sd_configs"])
    assert node["file_sd_configs"][0]["files"]


# --------------------------------------------------------------------------- data


class StandInNvml:
    """NVML's API as ``GpuSampler`` calls it, for one GPU at work (one XID event waiting)."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_VOLATILE_ECC = 0, 1, 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.events = [79]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlEventSetFree(self, events: str) -> None: ...
    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, events: str) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return "GPU-e2e"

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.events:
            raise TimeoutError("no event")  # NVML raises its timeout error
        return SimpleNamespace(device=0, eventData=self.events.pop())

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=100 << 30, total=141 << 30)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=97, memory=61)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 650_000  # mW

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 71

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return 1755

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return 0x4 | 0x20  # SW power cap, SW thermal

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        return 2 if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        return 12_000_000 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 3_000_000  # KB/s

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return 9_000_000_000  # mJ


def _hardware_records(run_id: str, now_ns: int) -> list[Any]:
    """Three ``hw`` samples of a GPU node, as the producer's samplers make them."""
    from steplens.producer.instruments.gpu_stats import GpuSampler
    from steplens.producer.instruments.host_stats import DiskCounters, disk_rates, net_rates
    from steplens.schema import make_record

    sampler = GpuSampler(StandInNvml())
    assert sampler.start() == "ok"
    disks = disk_rates(
        {"nvme0n1": DiskCounters(10, 800, 40, 20, 1600, 90)},
        {"nvme0n1": DiskCounters(210, 80_800, 640, 420, 161_600, 4_890)},
        1.0,
    )
    nets = net_rates({"ib0": (0, 0)}, {"ib0": (2_000_000_000, 1_500_000_000)}, 1.0)
    records = []
    for i in range(3):
        data = {
            "cpu_percent": 50.0,
            "mem_available_bytes": 1 << 30,
            "mem_total_bytes": 2 << 30,
            "gpus": sampler.sample(slow=True),
            "gpu_status": sampler.status,
            "disks": disks,
            "nets": nets,
        }
        t = now_ns - (3 - i) * 1_000_000_000
        records.append(make_record("hw", data, run_id=run_id, host="gpu-node-e2e", time_ns=t))
    assert {"xid_last", "throttle_reasons", "pcie_tx_mb_s", "energy_j"} <= set(data["gpus"][0])
    return records


def _health_and_incident_records(run_id: str, now_ns: int) -> list[Any]:
    """A producer that dropped and failed (the demo's never does), an alert record of the
    shape incidents will have (scope "incident", the member alerts in its evidence), the
    advice given for it and a rank's answer."""
    from steplens.schema import make_record

    health = {
        "sent": 1000,
        "spooled": 40,
        "spool_bytes": 8192,
        "replayed": 40,
        "queue_len": 3,
        "dropped": {"queue_full": 7},
        "errors": {"hw": 1},
    }
    members = [
        {"rule": "spike:loss", "scope": "run", "fingerprint": "e2e-member-1"},
        {"rule": "spike:grad_norm", "scope": "run", "fingerprint": "e2e-member-2"},
    ]
    incident = {
        "rule": "incident:loss_grad",
        "severity": "critical",
        "state": "firing",
        "scope": "incident",
        "hint": "loss and gradient norm spiked together",
        "summary": "2 alerts in one incident",
        "fingerprint": "e2e-incident-1",
        "started_step": 96,
        "evidence": {"members": members},
    }
    advice = {"action": "rewind", "fingerprint": "e2e-incident-1", "reason": "a spike"}
    advice |= {"checkpoint": "/ck/50", "checkpoint_step": 50, "skip_batches": 246}
    acted = {"action": "rewind", "fingerprint": "e2e-incident-1", "outcome": "acted"}
    acted["detail"] = "reloaded /ck/50"
    return [
        make_record("health", health, run_id=run_id, rank=0, host="gpu-node-e2e", time_ns=now_ns),
        make_record("alert", incident, run_id=run_id, rank=-1, step=97, time_ns=now_ns),
        make_record("advice", advice, run_id=run_id, rank=-1, step=97, time_ns=now_ns),
        make_record("acted", acted, run_id=run_id, rank=0, step=98, time_ns=now_ns + 1000),
    ]


def _training_records(run_id: str, now_ns: int) -> list[Any]:
    """What the quick demo does not log: BLEU, ROUGE and F1, a language-model batch (its
    supervised share), a classifier's batch (its label counts), a stalled rank's stacks, the
    worker's lr event, a communication probe (off at the README's defaults), a loss ARIMA band
    (240 steps in windows are too few for a fit), the loss-volatility, gap and data-rate
    signals (quiet ones are thinned out) and a rank's checks; built by the producer's own
    batch statistics and stack dump."""
    import numpy as np

    from steplens.producer.pipeline.batch_stats import batch_payload
    from steplens.producer.pipeline.stall import thread_stacks
    from steplens.schema import make_record

    ids = np.arange(80).reshape(4, 20) % 50 + 1
    labels = ids.copy()
    labels[:, :5] = -100
    mask = np.ones_like(ids)
    mask[0, 12:] = 0  # lengths 12, 20, 20, 20: bins len_lt_16 and len_lt_32
    batch, _ = batch_payload(ids, mask, labels, max_len=16, sample_ids=["a", "b", "c", "d"])
    evaluation = {"split": "val", "accuracy": 0.61, "f1": 0.55, "bleu": 23.4, "rouge": 0.48}
    event = {
        "name": "lr_event",
        "metric": "lr",
        "value": 1e-4,
        "detail": {"text": "warm-up ended at step 10; declared warmup_steps 10"},
    }
    stacks = {"stalled_s": 75.0, "last_step": 96, "threads": thread_stacks()}
    comm = {"op": "all_reduce", "latency_ms": 3.5, "bytes": 4096, "backend": "gloo"}
    band = {"name": "arima", "metric": "loss", "value": 2.4, "score": 0.1}
    band |= {"expected": 2.35, "lower": 2.1, "upper": 2.6}
    bounds = {"score": 0.2, "expected": 100.0, "lower": 90.0, "upper": 110.0}
    # the 7-day baselines' minute signals (the quick demo is younger than their first fit)
    baselines = [
        {"name": "baseline", "metric": m, "value": 101.0, **bounds, "detail": {"scope": scope}}
        for m, scope in (
            ("tokens_per_s", "rank:0"),
            ("gpu_util", "gpu:n0/0"),
            ("gpu_temp_c", "gpu:n0/0"),
            ("net_mb_s", "net:n0/ib0"),
        )
    ]
    common = {"run_id": run_id, "time_ns": now_ns, "step": 96}
    classified = {"n_samples": 34, "label_counts": {"cat": 32, "dog": 2}}
    judged = [
        ("volatility", "loss", 0.12),
        ("generalization_gap", "eval_loss", 0.3),
        ("data", "duplicate_rate", 0.5),
        ("data", "repeat_rate", 0.1),
        ("data", "repeat_share", 0.05),
    ]
    signals = [
        make_record("signal", {"name": n, "metric": m, "value": v, "score": 0.6}, rank=1, **common)
        for n, m, v in judged
    ]
    checks = [
        {"check": "loss volatility", "state": "on use", "needs": "log_step(step, loss=loss)"},
        {"check": "stragglers", "state": "off", "why": "one rank", "enable": "torchrun"},
    ]
    meta = {"world_size": 2, "checks": checks}
    return [
        make_record("batch", batch, rank=0, **common),
        make_record("batch", classified, rank=1, **common),
        make_record("run_meta", meta, rank=0, **common),
        *signals,
        make_record("eval", evaluation, rank=0, **common),
        make_record("signal", event, rank=-1, **common),
        make_record("stacks", stacks, rank=1, host="n1", **common),
        *(make_record("comm", comm, rank=r, **common) for r in (0, 1)),
        *(make_record("signal", band, rank=r, **common) for r in (0, 1)),
        *(make_record("signal", b, rank=0, **common) for b in baselines),
    ]


def _client(env: dict[str, str]) -> Any:
    from influxdb_client import InfluxDBClient

    return InfluxDBClient(
        url=env["STEPLENS_INFLUX_URL"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        org=env["STEPLENS_INFLUX_ORG"],
        timeout=60_000,
    )


def _roll_up_a_shifted_copy(client: Any, env: dict[str, str], run_id: str) -> None:
    """The run's hot points, ``SHIFT`` earlier, rolled up into the rollup bucket by the sinks'
    own rollup query (through a scratch bucket, which is deleted)."""
    from steplens.schema.flux_literals import flux_string
    from steplens.sinks.rollup import run_rollup
    from steplens.sinks.settings import InfluxSettings

    org = env["STEPLENS_INFLUX_ORG"]
    buckets = client.buckets_api()
    scratch = buckets.create_bucket(bucket_name=f"e2e-shift-{uuid.uuid4().hex[:8]}", org=org)
    try:
        client.query_api().query(
            f"from(bucket: {flux_string(env['STEPLENS_INFLUX_BUCKET'])})\n"
            "  |> range(start: -1h)\n"
            f"  |> filter(fn: (r) => r.run_id == {flux_string(run_id)})\n"
            f"  |> timeShift(duration: -{SHIFT.days}d)\n"
            f"  |> to(bucket: {flux_string(scratch.name)}, org: {flux_string(org)})",
            org=org,
        )
        now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
        settings = InfluxSettings(
            url=env["STEPLENS_INFLUX_URL"],
            org=org,
            token=env["STEPLENS_INFLUX_TOKEN"],
            bucket=scratch.name,
            rollup_bucket=env["STEPLENS_INFLUX_ROLLUP_BUCKET"],
        )
        start = now - SHIFT - timedelta(hours=1)
        run_rollup(client, settings, start, now - SHIFT + timedelta(minutes=1), run_id)
    finally:
        buckets.delete_bucket(scratch)


@pytest.fixture(scope="module")
def board_data(quick_demo) -> Iterator[Any]:
    """The demo's run plus the points it cannot produce, and its copy in the rollups."""
    from influxdb_client.client.write_api import SYNCHRONOUS

    from steplens.sinks.points import record_lines

    assert quick_demo.returncode == 0, quick_demo.output[-3000:]
    env, run_id = quick_demo.env, quick_demo.run_id
    now_ns = time.time_ns()
    records = [
        *_hardware_records(run_id, now_ns),
        *_health_and_incident_records(run_id, now_ns),
        *_training_records(run_id, now_ns),
    ]
    with _client(env) as client:
        lines = [line for rec in records for line in record_lines(rec)]
        client.write_api(write_options=SYNCHRONOUS).write(
            bucket=env["STEPLENS_INFLUX_BUCKET"], record=lines
        )
        _roll_up_a_shifted_copy(client, env, run_id)
        yield SimpleNamespace(env=env, run_id=run_id, written=datetime.now(timezone.utc))
        client.delete_api().delete(
            datetime.now(timezone.utc) - SHIFT - timedelta(days=1),
            datetime.now(timezone.utc) - SHIFT + timedelta(days=1),
            f'run_id="{run_id}"',
            bucket=env["STEPLENS_INFLUX_ROLLUP_BUCKET"],
            org=env["STEPLENS_INFLUX_ORG"],
        )


def _ranges(written: datetime) -> dict[str, Range]:
    """What Grafana sends for the last 15 minutes, the last 30 days, and 30 to 1 days ago
    (intervals for panels about 900 px wide, as Grafana rounds them)."""
    now = datetime.now(timezone.utc)
    return {
        "short": Range("short", written - timedelta(minutes=15), now, 1),
        "long": Range("long", now - timedelta(days=30), now, 1800),
        "old": Range("old", now - timedelta(days=30), now - timedelta(days=1), 1800),
    }


def _tables(env: dict[str, str], queries: list[str]) -> list[list[dict[str, Any]]]:
    with _client(env) as client:
        return [
            [rec.values for rec in table.records]
            for query in queries
            for table in client.query_api().query(query, org=env["STEPLENS_INFLUX_ORG"])
        ]


def _check_windows(name: str, tables: list[list[dict[str, Any]]], span: Range) -> None:
    """At most one row per window and series: what a 30-day panel draws stays bounded."""
    limit = math.ceil((span.stop - span.start).total_seconds() / span.window_s) + 1
    for rows in tables:
        assert len(rows) <= limit, f"{name}: {len(rows)} rows in one series"
        times = [r["_time"] for r in rows if "_time" in r]
        assert len(times) == len(set(times)), f"{name}: two rows in one window"
        for t in times:
            on_edge = t.timestamp() % span.window_s == 0 or t == span.stop
            assert on_edge, f"{name}: {t} is not the end of a {span.window_s} s window"


CASES = [
    pytest.param(board, panel, queries, span, id=f"{span}-{name}")
    for name, board, panel, queries in _all_targets()
    for span in ("short", "long", "old")
]


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.parametrize(("board", "panel", "queries", "span_name"), CASES)
def test_panel_query_returns_the_plotted_fields(board_data, board, panel, queries, span_name):
    """Before ``cut`` only what the rollups keep: a panel of text alone has nothing there."""
    span = _ranges(board_data.written)[span_name]
    name = f"{board['uid']}/{panel.get('title', 'annotation')} ({span_name})"
    run_id = board_data.run_id
    tables = _tables(board_data.env, [grafana_query(q, board, run_id, span) for q in queries])
    rows = [r for rows in tables for r in rows]
    hot_only = set(panel.get("steplensHotOnly", ())) if span_name == "old" else set()
    wanted = set(panel.get("steplensFields", ())) - hot_only
    if hot_only and not wanted:
        assert not rows, f"{name}: text from before the hot window?"
        return
    assert rows, f"{name}: no rows"
    assert all(r.get("run_id", run_id) == run_id for r in rows)
    columns = set().union(*(r.keys() for r in rows))
    fields = {r.get("_field") for r in rows}
    for field in wanted:
        assert field in columns or field in fields, f"{name}: {field} not returned"
    if panel["type"] in WINDOWED:
        _check_windows(name, tables, span)
        if span_name != "short":
            older = [r for r in rows if r["_time"] < span.stop - timedelta(days=1)]
            assert older, f"{name}: nothing from the rollups"


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_run_picker_lists_the_run(board_data, path):
    board = json.loads(path.read_text())
    (picker,) = [v for v in board["templating"]["list"] if v["name"] == "run_id"]
    span = _ranges(board_data.written)["long"]
    query = grafana_query(picker["query"], board, board_data.run_id, span)
    values = {r["_value"] for rows in _tables(board_data.env, [query]) for r in rows}
    assert board_data.run_id in values


@pytest.mark.stack
@pytest.mark.slow
def test_alert_counts_include_the_rollups(board_data):
    """A count over 30 days adds the rolled-up copy to the hot records."""
    board = json.loads((BOARD_DIR / "alerts.json").read_text())
    (panel,) = [p for p in board["panels"] if p["title"] == "Firing vs resolved"]
    spans = _ranges(board_data.written)
    counts = {}
    for span_name in ("short", "long"):
        query = grafana_query(
            panel["targets"][0]["query"], board, board_data.run_id, spans[span_name]
        )
        rows = [r for rows in _tables(board_data.env, [query]) for r in rows]
        counts[span_name] = {r["state"]: r["_value"] for r in rows}
    for state, hot in counts["short"].items():
        assert counts["long"][state] > hot, (state, counts)
