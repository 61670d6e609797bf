"""`steplens worker`'s options come from the worker's settings: a flag given, then the
variable, then the declared default; older flag names keep working."""

from __future__ import annotations

import pytest

from steplens.stream_jobs.engine.signals.ranks import RanksConfig
from steplens.stream_jobs.worker.app import detector_config
from steplens.stream_jobs.worker.cli import parser, settings_from
from steplens.stream_jobs.worker.settings import LimitSettings


def settings(*argv: str):
    return settings_from(parser().parse_args(list(argv)))


def test_defaults_are_the_declared_ones(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_HOME", "/tmp/home-x")
    s = settings()
    assert s.limits == LimitSettings()
    assert s.detector.arima_enabled
    assert detector_config(s.detector).ranks.hang_after_s == RanksConfig.hang_after_s
    assert (s.state_dir, s.web_port) == ("/tmp/home-x/worker-state", 9464)


def test_older_flag_names_still_work() -> None:
    s = settings(
        "--within", "0.5", "--signal-interval", "3", "--history-timeout", "4",
        "--hang-after", "5", "--run-idle-hours", "2", "--no-arima", "--no-history",
    )  # fmt: skip
    assert (s.within_s, s.signal_interval_s, s.history.timeout_s) == (0.5, 3.0, 4.0)
    assert (detector_config(s.detector).ranks.hang_after_s, s.limits.idle_s) == (5.0, 7200.0)
    assert not s.detector.arima_enabled
    assert not s.history.enabled


def test_a_flag_wins_over_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_WORKER_MAX_RUNS", "10")
    monkeypatch.setenv("STEPLENS_WORKER_CHECKPOINT_S", "2")
    monkeypatch.setenv("STEPLENS_WORKER_APP_ID", "from-env")
    s = settings("--max-runs", "20")
    assert (s.limits.max_runs, s.checkpoint_s, s.app_id) == (20, 2.0, "from-env")
    assert settings("--app-id", "from-flag").app_id == "from-flag"


def test_a_bad_flag_is_a_usage_error_and_help_shows_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--max-runs", "0"])
    assert "--max-runs" in capsys.readouterr().err
    text = " ".join(parser().format_help().split())
    assert "(default: 5000; env STEPLENS_WORKER_MAX_RUNS)" in text
