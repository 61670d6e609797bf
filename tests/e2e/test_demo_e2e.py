"""The whole product on the real stack: training, telemetry, detection, storage, report."""

from __future__ import annotations

import re

import pytest
from demo_output import scorecard

from steplens.stack.demo_incidents import plan_incidents

pytestmark = [pytest.mark.stack, pytest.mark.slow]


def test_quick_demo_runs_to_the_end(quick_demo):
    assert quick_demo.returncode == 0, quick_demo.output[-4000:]
    steps = [int(s) for s in re.findall(r"\[demo\] step (\d+)/240", quick_demo.output)]
    assert steps and steps[-1] == 240  # the training printed its progress to the end


def test_every_incident_is_announced_when_it_starts(quick_demo):
    for inc in plan_incidents(240):
        assert f"INCIDENT {inc.kind} starts at step {inc.first_step}" in quick_demo.output


def test_steplens_catches_every_injected_incident(quick_demo):
    card = scorecard(quick_demo.output)
    assert set(card) == {i.kind for i in plan_incidents(240)}, quick_demo.output[-4000:]
    missed = [k for k, mark in card.items() if mark == "MISSED"]
    assert missed == [], quick_demo.output[-6000:]
    assert re.search(r"caught 5 of 5 incidents, \d+ false alarm", quick_demo.output)


def test_report_page_shows_every_figure_from_stored_data(quick_demo):
    from steplens.sinks.report_figures import FIGURES

    index = quick_demo.report_dir / "index.html"
    assert f"[demo] report: {index}" in quick_demo.output
    page = index.read_text()
    assert quick_demo.run_id in page
    for name in FIGURES:
        assert (quick_demo.report_dir / f"{name}.png").stat().st_size > 5_000
        assert f'src="{name}.png"' in page
    assert "hang:progress" in page  # the alert table comes from the stored alerts


def test_the_node_figures_read_the_stored_devices(quick_demo):
    """The host sampler's disks and interfaces, as the report reads them back from the
    stores (the demo's CPU ranks have no GPU). What the comm check needs at the README's
    defaults is read from run_meta's checks below: the board test writes probe points into
    this run."""
    from steplens.sinks.report_data import load_run

    data = load_run(quick_demo.run_id)
    assert {"host", "device", "read_mb_s", "write_mb_s", "io_latency_ms"} <= set(data.disks)
    assert {"host", "iface", "rx_mb_s", "tx_mb_s"} <= set(data.nets)


def test_the_readme_path_runs_at_the_defaults_and_says_its_checks(quick_demo):
    """The demo is the README's snippet at the producer's defaults: its ranks sent windows and
    one step in 100 raw (no full resolution), each said its checks in run_meta (communication
    latency on use: a watched DDP model's all-reduce, or the probe), and the data-quality checks
    ran from the batches timed() saw."""
    import json

    from steplens.sinks import query

    meta = query.query_records(quick_demo.run_id, "run_meta")
    assert meta is not None and set(meta["rank"]) == {0, 1}
    meta = meta[meta["config"].notna()]  # the board test adds a checks-only run_meta
    assert sorted(meta["rank"]) == [0, 1]

    def parsed(value):  # JSON text from InfluxDB, already parsed from S3
        return json.loads(value) if isinstance(value, str) else value

    for _, row in meta.iterrows():
        config = parsed(row["config"])
        assert config["sample_rate"] == 0.01 and config["full_resolution"] is False
        checks = {c["check"]: c for c in parsed(row["checks"])}
        comm = checks["inter-rank communication latency over 50 ms"]
        # torch.distributed is on: a DDP model's all-reduce is timed once watched (the demo
        # averages its gradients itself); the probe is the fallback it names
        assert comm["state"] == "on use" and "watch(ddp_model" in comm["needs"]
        assert "sl.probe_comm(every=100)" in comm["needs"]
    windows = query.query_records(quick_demo.run_id, "step_window")
    assert windows is not None and len(windows) >= 2
    batches = query.query_records(quick_demo.run_id, "batch")
    assert batches is not None and set(batches["rank"]) == {0, 1}
