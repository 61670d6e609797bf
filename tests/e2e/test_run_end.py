"""Nothing is lost at the end of a run: its last step reaches InfluxDB and S3.

A training-like child process in the default windowed mode logs a number of steps that is not
a multiple of the window, then ends: stopped by SIGTERM as torchrun stops its ranks, or by
``shutdown()``. Kafka and both sinks are the real ones (the sinks as subprocesses).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from steplens.schema.topics import Topics, ensure_topics
from steplens.sinks.query import Stores, query_records
from steplens.sinks.report_data import last_steps, wait_for_steps
from steplens.sinks.settings import InfluxSettings, S3Settings

pytestmark = [pytest.mark.stack, pytest.mark.slow]

STEPS = 537  # windows of 100 steps: the last one (500-536) is partial
STORED_WITHIN_S = 120.0

TRAIN = textwrap.dedent(
    """
    import sys, time
    import steplens.producer as sl
    run_id, steps, end = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sl.init(run_id=run_id, rank=0, local_rank=0, world_size=1)
    for step in range(steps):
        time.sleep(0.002)  # a step's work
        sl.log_step(step, loss=3.0 - step / 1000, lr=1e-4)
    if end == "shutdown":
        sl.shutdown()
        print("done", flush=True)
    else:
        print("logged", flush=True)
        time.sleep(300)  # until SIGTERM
    """
)


@dataclass
class Sinks:
    topics: Topics
    influx: Stores = field(repr=False)  # each store alone; they and env hold the secrets
    s3: Stores = field(repr=False)
    env: dict[str, str] = field(repr=False)


@pytest.fixture(scope="module")
def sinks(stack_env: dict[str, str]) -> Iterator[Sinks]:
    tag = uuid.uuid4().hex[:8]
    topics = Topics.prefixed(f"e{tag}", raw_partitions=2, other_partitions=1)
    ensure_topics(stack_env["STEPLENS_KAFKA_BOOTSTRAP"], topics)
    prefix = f"test-run-end-{tag}"
    env = {
        **os.environ,
        **stack_env,
        **topics.env(),
    }
    common = ["--topics", topics.raw, "--metrics-port", "0", "--log-level", "WARNING"]
    commands = [
        ["influx", "--group", f"e{tag}-influx", *common],
        ["s3", "--group", f"e{tag}-s3", "--prefix", prefix, "--max-age-s", "1", *common],
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "steplens.schema.command", "sink", *cmd],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        for cmd in commands
    ]
    try:
        yield Sinks(
            topics,
            # a query reads which fields are text across the whole hot bucket: slow on a
            # shared, loaded host
            Stores(replace(InfluxSettings.from_env(), timeout_ms=30_000), None),
            Stores(None, replace(S3Settings.from_env(), prefix=prefix)),
            env,
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _train(sinks: Sinks, end: str, spool: Path) -> tuple[str, int]:
    """Run the child to its end (``"sigterm"`` or ``"shutdown"``); its run id and exit status.
    Its spool is its own (it adopts no other process's records), and its shutdown deadline is
    long enough for a machine under load: every record is then sent, none left spooled."""
    run_id = f"end-{end}-{uuid.uuid4().hex[:8]}"
    env = {**sinks.env, "STEPLENS_SPOOL_DIR": str(spool), "STEPLENS_SHUTDOWN_TIMEOUT_S": "60"}
    child = subprocess.Popen(
        [sys.executable, "-c", TRAIN, run_id, str(STEPS), end],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if end == "sigterm":
            assert line == "logged"
            child.send_signal(signal.SIGTERM)
        else:
            assert line == "done"
        rc = child.wait(120)
    finally:
        child.kill()
    assert not list(spool.rglob("*.seg")), "records were left in the spool"
    return run_id, rc


def _assert_stored(sinks: Sinks, run_id: str) -> None:
    """The last step is in each store, and the windows there hold every step once."""
    for store, stores in (("InfluxDB", sinks.influx), ("S3", sinks.s3)):
        missing = wait_for_steps(run_id, STEPS - 1, STORED_WITHIN_S, stores=stores)
        assert missing is None, f"{store}: {missing}"
        last = last_steps(run_id, stores)
        assert last == {0: STEPS - 1}, store
        windows = query_records(run_id, "step_window", stores=stores)
        if "metric" in windows:  # InfluxDB: a point per metric; S3: a row per record
            windows = windows[windows["metric"] == "loss"]
        loss = windows.sort_values("step_first")
        firsts, lasts = loss["step_first"].astype(int), loss["step_last"].astype(int)
        spans = list(zip(firsts, lasts, strict=True))
        assert spans[0][0] == 0 and spans[-1][1] == STEPS - 1, (store, spans)
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans)), (store, spans)
        assert int(loss["count"].sum()) == STEPS, store


@pytest.mark.parametrize("attempt", range(3))
def test_sigterm_after_the_last_step_stores_it_in_both_stores(
    sinks: Sinks, attempt: int, tmp_path: Path
) -> None:
    run_id, rc = _train(sinks, "sigterm", tmp_path)
    assert rc == -signal.SIGTERM  # the process still dies by the signal
    _assert_stored(sinks, run_id)


def test_shutdown_stores_the_last_partial_window(sinks: Sinks, tmp_path: Path) -> None:
    run_id, rc = _train(sinks, "shutdown", tmp_path)
    assert rc == 0
    _assert_stored(sinks, run_id)
