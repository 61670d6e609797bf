"""`steplens worker`'s options come from the worker's settings: a flag given, then the
variable, then the declared default; older flag names keep working."""

from __future__ import annotations

import pytest

from steplens.stream_jobs.engine.core import CODE, CRITICAL
from steplens.stream_jobs.engine.signals import gpu_errors
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
    assert (
        detector_config(s.detector, s.limits.max_ranks).ranks.hang_after_s
        == RanksConfig.hang_after_s
    )
    assert (s.state_dir, s.web_port) == ("/tmp/home-x/worker-state", 9464)


def test_older_flag_names_still_work() -> None:
    s = settings(
        "--within", "0.5", "--signal-interval", "3", "--history-timeout", "4",
        "--hang-after", "5", "--run-idle-hours", "2", "--no-arima", "--no-history",
    )  # fmt: skip
    assert (s.within_s, s.signal_interval_s, s.history.timeout_s) == (0.5, 3.0, 4.0)
    assert (
        detector_config(s.detector, s.limits.max_ranks).ranks.hang_after_s,
        s.limits.idle_s,
    ) == (5.0, 7200.0)
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


def _xid_paged(max_ranks: int, nodes: int) -> bool:
    """Every GPU of ``nodes`` nodes of 8 sampled, then the last one's XID count rises: is it
    paged under the caps a worker with ``--max-ranks max_ranks`` gives its runs?"""
    cfg = detector_config(settings().detector, max_ranks).gpu_errors
    st = gpu_errors.GpuErrorState()

    def sample(node: int, xids: int) -> list:
        gpus = [{"index": g, "xid_count": xids if g == 7 else 0} for g in range(8)]
        return gpu_errors.hw(st, cfg, {"gpus": gpus}, f"node-{node}", 10, 8 * node)

    for node in range(nodes):
        sample(node, 0)
    got = sample(nodes - 1, 1)
    return any((s.severity == CODE[CRITICAL]).any() for s in got)


def test_a_run_of_16384_ranks_is_followed_whole_by_default() -> None:
    """A run's GPU caps follow ``--max-ranks``: at its default a run of 16,384 GPUs has its
    last GPU's XID paged; under a cap of 4,096 it is counted as overflow, not paged."""
    assert settings().limits.max_ranks >= 16384
    assert _xid_paged(settings().limits.max_ranks, nodes=2048)
    assert not _xid_paged(4096, nodes=2048)
