"""`make test-busy`'s load generator: it runs the command, keeps a core busy meanwhile, and
ends with it, returning its status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "busy_core.py"


def test_it_returns_the_command_status_and_ends_with_it() -> None:
    script = "import time; time.sleep(0.5); raise SystemExit(3)"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "busy_core: " in done.stderr and "beside the command" in done.stderr


def test_without_a_command_it_refuses() -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "no command given" in done.stderr
