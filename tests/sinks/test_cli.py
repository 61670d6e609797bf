"""`steplens sink` as a process: it runs, commits, and serves its metrics on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from sinks_helpers import (
    committed,
    end_offsets,
    produce,
    sink_process,
    step_records,
    unique,
    wait_for,
)

from steplens.sinks.redact import Redactor

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
        # a store yields the CPU to the stream jobs on a shared host (--nice, 10)
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(19, mine + 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_secrets_stay_out_of_debug_logs(stack_env, topics, tmp_path) -> None:
    """At DEBUG botocore logs each request's Authorization header, which names the access key
    id; every secret the sink knows is redacted from what it logs."""
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    produce(bootstrap, topics.raw, step_records(unique("run"), 20))
    group, log = unique("group"), tmp_path / "sink.log"
    extra = ["--log-level", "DEBUG", "--max-age-s", "0.2", "--prefix", unique("debug")]
    with log.open("wb") as out:
        proc = sink_process("s3", topics, group, extra, stdout=out, stderr=out)
        try:
            ends = end_offsets(bootstrap, topics.raw, 4)
            wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "commits")
        finally:
            proc.terminate()
            proc.wait(30)
    text = log.read_text(errors="replace")
    assert "botocore.endpoint Sending http request" in text  # it did log at DEBUG
    assert "Credential=<redacted>" in text  # the request lines are there, without the key
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "STEPLENS_INFLUX_TOKEN"):
        assert stack_env[name] not in text, name


def test_redactor_hides_values_and_credential_fields() -> None:
    r = Redactor(["AKIASECRETKEY", "tok", None])
    line = "headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIA123/2026/s3'} AKIASECRETKEY"
    assert r.scrub(line) == (
        "headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=<redacted>/2026/s3'} <redacted>"
    )
    assert r.scrub("Authorization: Token abc.def-1") == "Authorization: Token <redacted>"
    assert r.scrub("tok stays: too short to hide") == "tok stays: too short to hide"
