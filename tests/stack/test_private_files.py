"""Folders the stack makes are private, the missing parents included."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from steplens.stack.private_files import private_dir


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_missing_parents_are_made_0700_and_existing_ones_left(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        (tmp_path / "home").mkdir()
        (tmp_path / "home").chmod(0o755)
        run = private_dir(tmp_path / "home" / "demo" / "run-1")
    finally:
        os.umask(old)
    assert _mode(run) == 0o700 and _mode(run.parent) == 0o700  # $STEPLENS_HOME/demo
    assert _mode(tmp_path / "home") == 0o755  # not made here: left as it was
