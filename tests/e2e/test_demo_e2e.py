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
    """The host sampler's disks and interfaces and the ranks' communication probes, as the
    report reads them back from the stores (the demo's CPU ranks have no GPU)."""
    from steplens.sinks.report_data import load_run

    data = load_run(quick_demo.run_id)
    assert {"host", "device", "read_mb_s", "write_mb_s", "io_latency_ms"} <= set(data.disks)
    assert {"host", "iface", "rx_mb_s", "tx_mb_s"} <= set(data.nets)
    assert {"rank", "op", "latency_ms", "time_ns"} <= set(data.comm)
    assert set(data.comm["rank"]) == {0, 1}
