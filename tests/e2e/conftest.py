"""One quick demo run against the real stack, shared by the end-to-end tests of a session."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DEMO_TIMEOUT_S = 540


@dataclass
class DemoRun:
    run_id: str
    returncode: int
    output: str
    report_dir: Path
    env: dict[str, str] = field(repr=False)  # holds the stack's secrets: never in a report


@pytest.fixture(scope="session")
def quick_demo(stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """`steplens demo --quick --isolated`: topics, consumer groups and run of its own."""
    import os
    import uuid

    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    out = tmp_path_factory.mktemp("demo") / "report"
    env = {**os.environ, **stack_env}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "steplens.schema.command",
            "demo",
            "--quick",
            "--isolated",
            "--run-id",
            run_id,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    output = proc.stdout + proc.stderr
    return DemoRun(run_id, proc.returncode, output, out, env)
