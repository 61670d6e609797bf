"""The report's figures and page, from DataFrames shaped like the query layer's."""

from __future__ import annotations

import stat

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
