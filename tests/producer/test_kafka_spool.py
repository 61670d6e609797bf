"""Records spooled by a process that ended during a Kafka outage reach the topic later: sent by
the next producer with the same spool folder, or by ``steplens spool send``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from producer_kafka_helpers import consume_all, new_raw_topic

from steplens.producer.monitor import Monitor

pytestmark = pytest.mark.stack

OUTAGE_RUN = textwrap.dedent(
    """
    import sys
    from steplens.producer.monitor import Monitor
    run_id, topic, spool, first, last = sys.argv[1:6]
    m = Monitor(run_id, kafka_bootstrap="127.0.0.1:1", topic=topic, spool_dir=spool,
                sample_rate=1.0, hw_interval_s=0, delivery_timeout_s=1, rank=0, local_rank=0)
    for step in range(int(first), int(last)):
        m.log_step(step, loss=1.0 + step)
    m.shutdown(timeout_s=3)
    print(m.stats()["spooled"])
    """
)


def _outage_run(run_id: str, topic: str, spool: Path, first: int, last: int) -> int:
    """A job that logs ``first``..``last`` while no broker answers, then exits."""
    out = subprocess.run(
        [sys.executable, "-c", OUTAGE_RUN, run_id, topic, str(spool), str(first), str(last)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "steplens spool send" in out.stderr  # the exit message says how to send them
    return int(out.stdout.split()[-1])


def _steps(records: list) -> set[int]:  # type: ignore[type-arg]
    return {r.step for r in records if r.kind == "step"}


def test_the_next_process_sends_what_an_outage_left(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    topic = new_raw_topic(bootstrap)
    run_id = f"outage-{uuid.uuid4().hex[:8]}"
    assert _outage_run(run_id, topic, tmp_path, 0, 500) >= 500
    m = Monitor(run_id, kafka_bootstrap=bootstrap, topic=topic, spool_dir=str(tmp_path),
                sample_rate=1.0, hw_interval_s=0, rank=0, local_rank=0)  # fmt: skip
    for step in range(500, 1000):
        m.log_step(step, loss=1.0 + step)
    assert m.flush(60)
    m.shutdown()
    records = consume_all(bootstrap, topic, lambda rs: _steps(rs) >= set(range(1000)))
    assert _steps(records) == set(range(1000))
    assert not list(tmp_path.rglob("*.seg"))


def test_spool_send_sends_a_spool_by_hand(stack_env: dict[str, str], tmp_path: Path) -> None:
    from steplens.producer.delivery.spool_cli import main

    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    topic = new_raw_topic(bootstrap)
    run_id = f"by-hand-{uuid.uuid4().hex[:8]}"
    assert _outage_run(run_id, topic, tmp_path, 0, 300) >= 300
    assert main(["send", str(tmp_path), "--topic", topic, "--bootstrap", bootstrap]) == 0
    records = consume_all(bootstrap, topic, lambda rs: _steps(rs) >= set(range(300)))
    assert _steps(records) == set(range(300))
    assert not list(tmp_path.rglob("*.seg"))
