"""`steplens sink` as a process: it runs, commits, and serves its metrics on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from sinks_helpers import committed, end_offsets, produce, step_records, unique, wait_for

pytestmark = pytest.mark.stack


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_sink_process_serves_metrics_and_stops_on_sigterm(stack_env, topics) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    produce(bootstrap, topics.raw, step_records(unique("run"), 25))
    port, group = free_port(), unique("group")
    code = "import sys; from steplens.sinks.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["influx", "--topics", topics.raw, "--group", group, "--metrics-port", str(port)]
    args += ["--dead-letter-topic", topics.dead_letters, "--log-level", "WARNING"]
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=dict(os.environ))
    try:
        ends = end_offsets(bootstrap, topics.raw, 4)
        wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "commits")
        text = scrape(port)
        assert 'steplens_sink_records_total{outcome="accepted",sink="influx"} 25.0' in text
        assert 'steplens_sink_commits_total{result="ok",sink="influx"}' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
