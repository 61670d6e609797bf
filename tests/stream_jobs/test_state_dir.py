"""A worker's state folder (Faust's tables, offsets) is its user's alone: the folder, its
missing parents and whatever the worker makes inside."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from steplens.stream_jobs.worker import cli, settings


class _Stop(Exception):
    pass


def _stop(_settings: object) -> None:
    raise _Stop


@pytest.mark.parametrize("exists", [False, True])
def test_the_state_dir_is_made_0700(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exists: bool
) -> None:
    state = tmp_path / "home" / "worker-state"
    if exists:
        state.parent.mkdir()
        state.mkdir(mode=0o755)
        state.chmod(0o755)
    monkeypatch.setattr(settings, "ensure_worker_topics", _stop)  # the folder is made before
    old = os.umask(0o022)
    try:
        with pytest.raises(_Stop):
            cli.main(["--state-dir", str(state), "--bootstrap", "127.0.0.1:1", "--no-history"])
        (state / "app-data" / "v1" / "tables").mkdir(parents=True)  # as Faust makes its own
        (state / "app-data" / "v1" / "offsets").write_text("0")
    finally:
        os.umask(old)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    if not exists:  # a missing parent is made private too
        assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    shared = {
        str(p.relative_to(state)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in state.rglob("*")
        if stat.S_IMODE(p.stat().st_mode) & 0o077
    }
    assert shared == {}
