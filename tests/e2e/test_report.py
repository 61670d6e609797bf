"""The report's figures and page, from DataFrames shaped like the query layer's."""

from __future__ import annotations

import stat
import tempfile
import uuid

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from report_data import SCHEDULE, synthetic_run

from steplens.sinks.report_data import RunData
from steplens.sinks.report_figures import FIGURES, declared_lr
from steplens.sinks.report_page import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_writes_every_figure_and_one_page(tmp_path):
    index = write_report(synthetic_run(), tmp_path)
    page = index.read_text()
    for name in FIGURES:
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
        assert png.stat().st_size > 5_000  # something was drawn
        assert f'src="{name}.png"' in page
    assert "check the learning rate" in page  # the alert table carries the hints
    assert "rank 1 is slow" in page


def test_report_survives_a_run_without_signals_alerts_or_hardware(tmp_path):
    full = synthetic_run(n_steps=50)
    bare = RunData("bare", full.steps)
    index = write_report(bare, tmp_path)
    assert "No incidents." in index.read_text()
    assert all((tmp_path / f"{n}.png").exists() for n in FIGURES)


def test_declared_schedule_kinds():
    steps = np.arange(0, 400)
    cos = declared_lr(SCHEDULE, steps)
    assert cos[19] == pytest.approx(3e-3) and cos[300] == pytest.approx(3e-4)
    assert np.all(np.diff(cos[20:300]) <= 0)
    lin = declared_lr({**SCHEDULE, "kind": "linear"}, steps)
    assert lin[160] == pytest.approx((3e-3 + 3e-4) / 2)
    step = declared_lr(
        {"kind": "step", "peak_lr": 1.0, "milestones": [100, 200], "gamma": 0.5}, steps
    )
    assert (step[99], step[100], step[250]) == (1.0, 0.5, 0.25)
    const = declared_lr({"kind": "constant", "peak_lr": 0.1}, steps)
    assert np.all(const == 0.1)


def test_report_is_readable_by_its_owner_only(tmp_path):
    out = tmp_path / "report"
    out.mkdir(mode=0o755)
    (out / "index.html").write_text("an older page")  # rewritten, and made private too
    (out / "index.html").chmod(0o644)
    write_report(synthetic_run(n_steps=30), out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
    assert modes == dict.fromkeys([*(f"{n}.png" for n in FIGURES), "index.html"], 0o600)


def _producer_records(run_id: str) -> list:
    """What a real Monitor sends for a short run: watched steps (lr from the scheduler, clipping,
    per-layer norms), batches and evaluations scored from texts; the worker's lr event, its
    advice to rewind and two ranks' answers."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("sacrebleu")
    from steplens.producer.delivery.transport import MemoryTransport
    from steplens.producer.monitor import Monitor
    from steplens.schema import make_record

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.1)
    tx = MemoryTransport()
    with tempfile.TemporaryDirectory() as spool:
        m = Monitor(run_id, transport=tx, hw_interval_s=0, spool_dir=spool, sample_rate=0.0)
        m.watch(model, opt, sched, every=1, max_grad_norm=1.0)
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        for step in range(12):
            loss = torch.nn.functional.mse_loss(model(x), y) * (100 if step % 3 == 0 else 0.01)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            m.log_step(step, loss=loss)
            long = 40 if step >= 6 else 5
            rows = [list(range(1, 1 + long + i)) for i in range(4)]
            m.log_batch(step, rows, max_len=32, sample_ids=[f"s{step}-{i}" for i in range(4)])
        refs = ["the cat sat on the mat", "a dog barked"]
        m.log_eval(5, accuracy=0.5, f1=0.4, predictions=["the cat sat", "a dog"], references=refs)
        m.log_eval(11, accuracy=0.7, f1=0.6, predictions=refs, references=refs)
        m.shutdown()
    event = make_record(
        "signal",
        {
            "name": "lr_event",
            "metric": "lr",
            "value": 0.01,
            "detail": {"text": "lr decayed at step 6; declared milestone 6"},
        },
        run_id=run_id,
        rank=-1,
        step=6,
        time_ns=tx.records("step")[6].time_ns,
    )
    at = tx.records("step")[7].time_ns
    rewind = {"action": "rewind", "fingerprint": "inc-7", "checkpoint": "/ck/3"}
    rewind |= {"checkpoint_step": 3, "skip_batches": 204}
    advice = make_record("advice", rewind, run_id=run_id, rank=-1, step=7, time_ns=at)
    answers = [
        make_record(
            "acted",
            {"action": "rewind", "fingerprint": "inc-7", "outcome": outcome, "detail": detail},
            run_id=run_id,
            rank=rank,
            step=8,
            time_ns=at + 1000 + rank,
        )
        for rank, outcome, detail in ((0, "acted", "reloaded /ck/3"), (1, "failed", "no file"))
    ]
    return [*tx.records(), event, advice, *answers]


@pytest.mark.stack
def test_figures_are_drawn_from_the_stored_run(stack_env, monkeypatch):
    """A producer's records through the influx sink into InfluxDB, read back by load_run: the
    report's new figures show exactly what was stored."""
    from steplens.sinks.influx import InfluxSink, make_client
    from steplens.sinks.report_data import load_run
    from steplens.sinks.report_figures import FIGURES
    from steplens.sinks.settings import InfluxSettings

    run_id = f"report-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("STEPLENS_S3_PREFIX", f"report-{uuid.uuid4().hex[:8]}")  # nothing cold
    records = _producer_records(run_id)
    influx = InfluxSettings.from_env()
    assert influx is not None
    with make_client(influx) as client:
        result = InfluxSink(client, influx).export(records)
    assert result.accepted == len(records) and not result.rejected
    data = load_run(run_id)

    steps = data.steps.sort_values("step")
    assert list(steps["lr"]) == pytest.approx([0.1] * 6 + [0.01] * 6)  # no lr= given: watch's
    assert list(steps["clipped"]) == [float(s % 3 == 0) for s in range(12)]
    assert list(data.lr_events["text"]) == ["lr decayed at step 6; declared milestone 6"]
    lr_fig = FIGURES["lr"][1](data)
    assert "lr decayed at step 6" in " ".join(t.get_text() for t in lr_fig.axes[0].texts)

    clip_fig = FIGURES["clipping"][1](data)
    rate = clip_fig.axes[0].get_lines()[0]  # rank 0, one step per window here
    assert list(rate.get_ydata()) == [100.0 * (s % 3 == 0) for s in range(12)]

    evals = data.evals.sort_values("step")
    assert list(evals["accuracy"]) == [0.5, 0.7] and evals["bleu"].iloc[1] == pytest.approx(100)
    ev_fig = FIGURES["eval"][1](data)
    drawn = {ln.get_label(): list(ln.get_ydata()) for ax in ev_fig.axes for ln in ax.get_lines()}
    assert drawn["val f1"] == [0.4, 0.6] and drawn["val bleu"] == list(evals["bleu"])
    assert drawn["val rouge"][1] == pytest.approx(1.0)

    batches = data.batches.sort_values("step")
    assert list(batches["over_length_share"]) == [0.0] * 6 + [1.0] * 6
    assert batches["lengths"].iloc[0] == [(0, 1, 0), (1, 2, 0), (2, 4, 0), (4, 8, 3), (8, 16, 1)]
    len_fig = FIGURES["lengths"][1](data)
    grid = len_fig.axes[0].images[0].get_array()
    assert grid.sum() == pytest.approx(len(grid[0]))  # each window's shares sum to 1

    layers = set(data.layers["layer"])
    assert layers == {"0", "2"} and len(data.layers) == 24
    lay_fig = FIGURES["layers"][1](data)
    assert {ln.get_label() for ln in lay_fig.axes[0].get_lines()} == {"0", "2"}

    from steplens.sinks.report_incidents import remedies_of

    (given,) = remedies_of(data.advice, data.acted)["inc-7"]
    assert given["line"] == (
        "rewind to /ck/3 (step 3), skip 204 batches, to every rank at step 7 -> "
        "acted: rank 0 (reloaded /ck/3); failed: rank 1 (no file)"
    )


def _labels(ax) -> list[str]:
    return [str(line.get_label()) for line in ax.get_lines()]


def test_node_figures_show_every_hardware_statistic():
    """Each statistic the producer collects has a line; memory bandwidth says its source per
    GPU; the alert lines of disk latency and communication latency are drawn."""
    import matplotlib.pyplot as plt

    from steplens.sinks.report_node import fig_gpu_node, fig_io

    data = synthetic_run()
    gpu_fig = fig_gpu_node(data)
    power, pcie, bandwidth, errors, throttle = gpu_fig.axes[:5]
    temp = gpu_fig.axes[5]  # the twin axis of power
    assert set(_labels(power)) == {"n1/0 power W", "n1/1 power W"}
    assert set(_labels(temp)) == {"n1/0 temp °C", "n1/1 temp °C"}
    assert {"n1/0 tx", "n1/0 rx", "n1/1 tx", "n1/1 rx"} <= set(_labels(pcie))
    assert set(_labels(bandwidth)) == {
        "n1/0 DRAM bandwidth (GPM)",
        "n1/1 memory util (NVML, coarse)",
    }
    assert {"n1/0 XID", "n1/1 ECC uncorr."} <= set(_labels(errors))
    (marks,) = throttle.collections  # one reason set: HW thermal, on 20 samples each
    assert len(marks.get_offsets()) == 20
    assert {tuple(o)[1] for o in marks.get_offsets()} == {6.0}
    io_fig = fig_io(data)
    disk, latency, net, comm = io_fig.axes
    assert {"nvme0n1" in lab for lab in _labels(disk)} == {True} and len(_labels(disk)) == 2
    assert "alert line" in _labels(latency) and latency.get_lines()[-1].get_ydata()[0] == 10
    assert {"n1/ib0 rx", "n1/ib0 tx"} == set(_labels(net))
    assert {"0/all_reduce ms", "1/all_reduce ms"} <= set(_labels(comm))
    assert comm.get_lines()[-1].get_ydata()[0] == 50  # the 50 ms line
    plt.close("all")


def test_device_lists_of_stored_hw_records_become_rows():
    """Both stores give a hw record's GPUs, disks and interfaces as JSON text."""
    import pandas as pd

    from steplens.sinks.report_data import _explode, _explode_gpus

    t = pd.Timestamp("2026-01-01T00:00:00Z")
    hw = pd.DataFrame(
        {
            "time": [t],
            "host": ["n1"],
            "gpus": [
                '[{"index": 1, "mem_used_bytes": 5, "mem_total_bytes": 10, '
                '"mem_bw_util": 40.0, "mem_bw_source": "gpm", "power_w": 300.0}]'
            ],
            "disks": ['[{"device": "sda", "read_mb_s": 1.5, "io_latency_ms": 2.0}]'],
            "nets": ["not json"],
        }
    )
    (gpu,) = _explode_gpus(hw).to_dict("records")
    assert gpu["gpu"] == 1 and gpu["mem_used_pct"] == 50.0 and gpu["mem_bw_source"] == "gpm"
    assert gpu["power_w"] == 300.0
    (disk,) = _explode(hw, "disks", "device").to_dict("records")
    assert disk == {
        "time": t,
        "host": "n1",
        "device": "sda",
        "read_mb_s": 1.5,
        "io_latency_ms": 2.0,
    }
    assert _explode(hw, "nets", "iface").empty


def test_other_ranks_allocator_records_leave_nvml_and_host_series_whole():
    """A rank other than local rank 0 sends hw records with its allocator's GPU figures only:
    the report draws the host-wide samples, without gaps or zeros at those times."""
    import pandas as pd

    from steplens.sinks.report_data import _explode_gpus, _host_wide

    t = pd.Timestamp("2026-01-01T00:00:00Z")
    hw = pd.DataFrame(
        {
            "time": [t, t + pd.Timedelta(seconds=0.5), t + pd.Timedelta(seconds=1)],
            "host": ["n1"] * 3,
            "cpu_percent": [10.0, None, 12.0],
            "gpu_status": ["ok", None, "ok"],
            "gpus": [
                '[{"index": 0, "mem_used_bytes": 9, "mem_total_bytes": 10}]',
                '[{"index": 1, "torch_allocated_bytes": 4, "torch_reserved_bytes": 6}]',
                '[{"index": 0, "mem_used_bytes": 9, "mem_total_bytes": 10}]',
            ],
        }
    )
    host = _host_wide(hw)
    assert host["cpu_percent"].tolist() == [10.0, 12.0]
    assert _explode_gpus(host)["mem_used_pct"].tolist() == [90.0, 90.0]


def test_alert_lines_are_the_thresholds_the_worker_judged_against():
    """A worker set to 50 % loss volatility and 25 ms disk latency: its signals say so, and
    the figures draw those lines (in percent for the volatility, as its values are drawn),
    with the volatility values the worker judged over the line marked."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from steplens.sinks.report_node import fig_io
    from steplens.sinks.report_quality import fig_loss_noise

    data = synthetic_run()
    steps = np.arange(50, 300, 10)
    vol = pd.DataFrame(
        {
            "step": steps,
            "name": "volatility",
            "metric": "loss",
            "value": np.where(steps >= 200, 0.6, 0.4),
            "expected": 0.5,
            "severity": np.where(steps >= 200, "warning", None),
            "rank": -1,
        }
    )
    disk = pd.DataFrame(
        {
            "step": [100],
            "name": ["threshold"],
            "metric": ["disk_io_latency_ms"],
            "value": [3.0],
            "expected": [25.0],
            "upper": [25.0],
            "rank": [0],
        }
    )
    others = data.signals[data.signals["name"] != "volatility"]
    data.signals = pd.concat([others, vol, disk], ignore_index=True)
    noise = fig_loss_noise(data).axes[0]
    line = next(ln for ln in noise.get_lines() if str(ln.get_label()).startswith("alert line"))
    assert line.get_ydata()[0] == pytest.approx(50.0)
    (over,) = noise.collections
    assert len(over.get_offsets()) == 10  # steps 200-290
    latency = fig_io(data).axes[1]
    assert latency.get_lines()[-1].get_ydata()[0] == 25
    plt.close("all")
