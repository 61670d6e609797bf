"""The quick fault bench, two of its scenarios: a Kafka freeze (the producer re-sends what was
in flight) and an S3 freeze, with the real producer, worker and sinks on a private stack."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.slow]
BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_faults.py"


def test_kafka_and_s3_freezes_lose_and_double_nothing() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--only", "b,e"],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if re.match(r"[be] ", line)]
    assert len(lines) == 2, result.stdout
    for line in lines:
        sent = int(re.search(r"sent (\d+)", line).group(1))
        assert sent > 0 and f"stored {sent}, lost 0, doubled 0" in line, line
        assert "NOT SETTLED" not in line, line
