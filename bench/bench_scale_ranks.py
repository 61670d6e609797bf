"""One run of N ranks against the real local stack: what it costs and what it catches.

Starts ``--workers`` workers of one group (a run wider than their ``--shard-ranks`` is scored
in shards, which they share) and both sinks (InfluxDB, S3) on topics, consumer groups and an
S3 prefix of their own (as ``steplens demo --isolated`` does), then ``sim_ranks.py``
processes that send N ranks' records through the producer's own code for ``--steps`` steps of
``--step-s`` s with six faults at known steps. Measures:

* the wire: records/s and bytes/s the ranks handed to Kafka, by kind;
* the workers: CPU seconds (summed) and the largest one's peak RSS (their process trees,
  psutil), consumer lag and records scored (their /metrics, summed and by worker);
* InfluxDB: the run's series (``influxdb.cardinality``, hot and rollup buckets), influxd's RSS,
  the influx sink's rollup runs (count, mean duration, runs over a minute, coverage lag);
* S3: objects and bytes under the run's prefix, after the sinks stopped; the sinks' CPU and
  peak RSS;
* InfluxDB buckets of its own (hot and rollup, deleted at the end unless ``--keep-buckets``):
  a large run left in the shared buckets slows every later query of them for hours;
* alerts: each fault's first incident on the alerts topic, with the right rank/node/GPU and
  rule, its latency from the fault's onset (the time its first step or sample was logged; a
  GPU throttling on temperature: its first throttled sample);
  every other firing incident counts as a false alarm. The simulator's senders share the
  machine and can hand a step's records over late (``sim_behind_s_max``): each fault's
  ``sent_late_s`` (its onset step's, the earliest sender's) and ``latency_from_send_s`` (the
  latency less that, what the stack itself took) are printed beside it; and where each
  fault's latency went (``fault_hops``): its first record's hops from the ranks to the raw
  topic, through the route stage to the by-run topic, and from there to the alert;

With ``--made-ahead-s S`` the simulator makes every record first (the same code, on a clock
that starts S seconds after the bench does) and sends each step's at its time: the stack is
then measured without thousands of ranks' producer code on its own cores, as it runs beside
a real job (the ranks' CPU is still counted, as ``sim_made_ahead_cpu_s``).

    python bench/bench_scale_ranks.py --ranks 1024 --steps 240
    python bench/bench_scale_ranks.py --ranks 4096 --steps 240 --made-ahead-s 150
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fault_hops  # noqa: E402
from scale_out import free_port, metric  # noqa: E402

# the rules that name each fault's cause (the incident's lead rule starts with one of these)
CAUSES = {
    "straggler": ("straggler", "baseline:step_time_s", "arima:step_time_s"),
    "gpu_ecc_xid": ("hardware:xid_count", "hardware:ecc_uncorrected"),
    "gpu_thermal": ("threshold:gpu_temp_c", "threshold:gpu_temp_drift", "baseline:gpu_temp_c"),
    "node_network": ("threshold:comm_latency_ms", "straggler", "baseline:net_mb_s"),
    "nonfinite_loss": ("nonfinite",),
    "loss_spike": ("spike:loss", "spike:grad_norm", "correlation:loss_grad", "arima:loss"),
}


def stack_env() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "steplens.schema.command", "stack", "env"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = {}
    for raw in out.splitlines():
        line = raw.removeprefix("export ").strip()
        if "=" in line:
            k, v = line.split("=", 1)
            env[k] = v.strip("'\"")
    return env


class AlertTail(threading.Thread):
    """Every record of the alerts topic, with the wall time it arrived."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"scale-tail-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.c.subscribe([topic])
        self.rows: list[tuple[int, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from steplens.schema import Record, decode

        while not self.stop.is_set():
            msg = self.c.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            rec = decode(msg.value())
            if isinstance(rec, Record):
                self.rows.append((time.time_ns(), rec))
        self.c.close()


def serving(port: int) -> psutil.Process | None:
    """The process listening on ``port`` on this machine (the stack's influxd)."""
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            return psutil.Process(c.pid)
    return None


class Sampler(threading.Thread):
    """Every 2 s: the workers' trees (CPU s summed, the largest RSS), their lag and counts
    summed; influxd's RSS; the sinks' CPU."""

    def __init__(
        self, workers: list[int], sinks: list[int], worker_ports: list[int], influx_url: str
    ) -> None:
        super().__init__(daemon=True)
        self.workers = [psutil.Process(p) for p in workers]
        self.sinks = [psutil.Process(p) for p in sinks]
        self.ports = worker_ports
        self.influxd = serving(int(urllib.parse.urlsplit(influx_url).port or 8086))
        self.rows: list[dict[str, float]] = []
        self.stop = threading.Event()

    @staticmethod
    def tree(p: psutil.Process) -> tuple[float, float]:
        cpu = rss = 0.0
        for q in [p, *p.children(recursive=True)]:
            try:
                t = q.cpu_times()
                cpu += t.user + t.system
                rss += q.memory_info().rss
            except psutil.Error:
                pass
        return cpu, rss

    def metric(self, name: str) -> float:
        return sum(metric(port, name) for port in self.ports)

    def sample(self) -> dict[str, float]:
        trees = [self.tree(w) for w in self.workers]
        row = {
            "t": time.monotonic(),
            "worker_cpu_s": sum(cpu for cpu, _ in trees),
            "worker_rss": max(rss for _, rss in trees),
        }
        sinks = [self.tree(p) for p in self.sinks]
        row["sinks_cpu_s"] = sum(cpu for cpu, _ in sinks)
        for i, (_, rss) in enumerate(sinks):
            row[f"sink{i}_rss"] = rss
        row["lag"] = self.metric("steplens_worker_consumer_lag")
        scored = [metric(port, "steplens_worker_records_total") for port in self.ports]
        row["worker_records"] = sum(scored)
        row["wall_s"] = time.time()
        for i, n in enumerate(scored):
            row[f"records_w{i}"] = n
        for name in ("alerts", "signals", "dead_letters", "advice"):
            row[f"worker_{name}"] = self.metric(f"steplens_worker_{name}_total")
        if self.influxd is not None:
            try:
                row["influxd_rss"] = float(self.influxd.memory_info().rss)
                t = self.influxd.cpu_times()
                row["influxd_cpu_s"] = t.user + t.system
            except psutil.Error:
                pass
        return row

    def run(self) -> None:
        while not self.stop.wait(2.0):
            try:
                self.rows.append(self.sample())
            except psutil.Error:
                return


def flux(env: dict[str, str], query: str) -> list[list[str]]:
    """A Flux query's CSV rows, tried again while InfluxDB's query queue is full."""
    for _ in range(3):
        try:
            return _flux(env, query)
        except urllib.error.HTTPError as exc:
            if exc.code != 400 or b"queue" not in exc.read():
                raise
            time.sleep(6.0)
    return _flux(env, query)


def _flux(env: dict[str, str], query: str) -> list[list[str]]:
    org = urllib.parse.quote(env["STEPLENS_INFLUX_ORG"])
    url = f"{env['STEPLENS_INFLUX_URL']}/api/v2/query?org={org}"
    req = urllib.request.Request(
        url,
        data=json.dumps({"query": query, "type": "flux"}).encode(),
        headers={
            "Authorization": f"Token {env['STEPLENS_INFLUX_TOKEN']}",
            "Content-Type": "application/json",
            "Accept": "application/csv",
        },
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        text = r.read().decode()
    return [line.split(",") for line in text.splitlines() if line.strip()]


def cardinality(
    env: dict[str, str], bucket: str, run_id: str, measurement: str | None = None
) -> int | None:
    """The run's series in ``bucket`` (of one measurement)."""
    only = "" if measurement is None else f' and r._measurement == "{measurement}"'
    q = (
        'import "influxdata/influxdb"\n'
        f'influxdb.cardinality(bucket: "{bucket}", start: -3h, '
        f'predicate: (r) => r.run_id == "{run_id}"{only})'
    )
    try:
        rows = flux(env, q)
    except Exception as exc:
        print(f"cardinality of {bucket}: {exc}", file=sys.stderr)
        return None
    head = rows[0] if rows else []
    if "_value" not in head:
        return 0
    i = head.index("_value")
    return sum(int(r[i]) for r in rows[1:] if len(r) > i and r[i].isdigit())


def series_by_measurement(env: dict[str, str], run_id: str) -> dict[str, int | None]:
    bucket = env["STEPLENS_INFLUX_BUCKET"]
    q = f'import "influxdata/influxdb/schema"\nschema.measurements(bucket: "{bucket}", start: -3h)'
    try:
        rows = flux(env, q)
    except Exception as exc:
        print(f"measurements of {bucket}: {exc}", file=sys.stderr)
        return {}
    i = rows[0].index("_value") if rows and "_value" in rows[0] else -1
    names = [r[i] for r in rows[1:] if i >= 0 and len(r) > i and r[i] != "_value"]
    return {m: cardinality(env, bucket, run_id, m) for m in names}


def bucket_series(env: dict[str, str]) -> dict[str, float]:
    """Series per bucket name, from influxd's /metrics (``storage_bucket_series_num``)."""
    base, tok = env["STEPLENS_INFLUX_URL"], env["STEPLENS_INFLUX_TOKEN"]
    headers = {"Authorization": f"Token {tok}"}
    req = urllib.request.Request(f"{base}/api/v2/buckets?limit=100", headers=headers)
    with urllib.request.urlopen(req, timeout=20) as r:
        names = {b["id"]: b["name"] for b in json.loads(r.read())["buckets"]}
    with urllib.request.urlopen(f"{base}/metrics", timeout=20) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('storage_bucket_series_num{bucket="'):
            bid = line.split('"')[1]
            out[names.get(bid, bid)] = float(line.rsplit(" ", 1)[1])
    return out


def rollup_figures(port: int) -> dict[str, float]:
    """The influx sink's rollup runs (its /metrics): how many, how long, the coverage lag."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as r:
        text = r.read().decode()
    got: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("steplens_sink_rollup_"):
            got[name] = float(value)
    n = got.get("steplens_sink_rollup_run_seconds_count", 0.0)
    return {
        "runs_ok": got.get('steplens_sink_rollup_runs_total{result="ok"}', 0.0),
        "runs_failed": got.get('steplens_sink_rollup_runs_total{result="failed"}', 0.0),
        "run_s_mean": got.get("steplens_sink_rollup_run_seconds_sum", 0.0) / max(n, 1.0),
        "runs_over_60s": n - got.get('steplens_sink_rollup_run_seconds_bucket{le="60.0"}', n),
        "coverage_lag_s": got.get("steplens_sink_rollup_coverage_lag_seconds", float("nan")),
    }


def s3_usage(env: dict[str, str], prefix: str) -> tuple[int, int]:
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=env["STEPLENS_S3_ENDPOINT"],
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or env.get("STEPLENS_S3_ACCESS_KEY"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or env.get("STEPLENS_S3_SECRET_KEY"),
        config=Config(s3={"addressing_style": "path"}),
    )
    n = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=env["STEPLENS_S3_BUCKET"], Prefix=prefix
    ):
        for obj in page.get("Contents", []):
            n += 1
            size += obj["Size"]
    return n, size


def members(rec: Any) -> list[tuple[str, str, int | None]]:
    """(rule, scope, rank) of an incident's members (of the alert itself, if it has none)."""
    out = []
    ev = rec.data.get("evidence") or {}
    for m in ev.get("members") or [rec.data]:
        scope = str(m.get("scope", ""))
        rank = m.get("rank") if isinstance(m.get("rank"), int) else None
        if rank is None and scope.startswith("rank:") and scope[5:].isdigit():
            rank = int(scope[5:])
        out.append((str(m.get("rule", "")), scope, rank))
    return out


def matches(fault: dict[str, Any], rule: str, scope: str, rank: int | None) -> bool:
    if not rule.startswith(CAUSES[fault["kind"]]):
        return False
    kind = fault["kind"]
    if kind == "loss_spike":
        return True
    if kind in ("gpu_ecc_xid", "gpu_thermal"):
        return scope == f"gpu:{fault['host']}/{fault['gpu']}"
    if kind == "node_network":
        return fault["host"] in scope or (rank is not None and rank in fault["ranks"])
    return rank == fault["rank"]


def judge(
    alerts: list[tuple[int, Any]], faults: list[dict[str, Any]], onsets: dict[str, int]
) -> dict[str, Any]:
    """Each fault's first page: a firing transition of an incident (its first, or a firing
    again with new members: people are notified of both) with a member that names it (rule
    and scope; the latency from the fault's onset). A page that names no fault is a false
    alarm; one that names only faults paged before is a repeat."""
    found: dict[str, dict[str, Any]] = {}
    other, repeats = [], 0
    for t, rec in sorted(alerts, key=lambda tr: tr[0]):
        if rec.kind != "alert" or rec.data.get("state") != "firing":
            continue
        named = [
            f["kind"]
            for f in faults
            if f["kind"] in onsets
            and t >= onsets[f["kind"]] - 2e9
            and any(matches(f, *m) for m in members(rec))
        ]
        row = {
            "rule": rec.data["rule"],
            "members": sorted({f"{r}@{sc}" for r, sc, _ in members(rec)})[:6],
            "step": rec.step,
            "severity": rec.data.get("severity"),
            "names": named,
        }
        new = [k for k in named if k not in found]
        for k in new:
            found[k] = {**row, "latency_s": (t - onsets[k]) / 1e9, "onset_s": onsets[k] / 1e9}
        if not named:
            other.append(row)
        elif not new:
            repeats += 1
    return {"found": found, "other_pages": other, "repeats": repeats}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


def start(name: str, args: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "steplens.schema.command", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 420.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited ({proc.returncode}) before opening {port}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"port {port} not open after {timeout_s} s")


def stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    import signal

    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument(
        "--steps",
        type=int,
        default=240,
        help="at least 240: the plan's faults (30 steps long) then begin beyond the incidents' "
        "join gap (20 steps) after the one before, so each is judged by its own incident",
    )
    p.add_argument("--step-s", type=float, default=1.0)
    p.add_argument("--ranks-per-process", type=int, default=1024)
    p.add_argument("--full-resolution", action="store_true")
    p.add_argument("--workers", type=int, default=1, help="workers of the one group")
    p.add_argument(
        "--shard-ranks", type=int, default=None, help="the workers' --shard-ranks (their default)"
    )
    p.add_argument("--settle-s", type=float, default=90.0, help="most seconds to wait after")
    p.add_argument(
        "--made-ahead-s",
        type=float,
        default=0.0,
        help="the ranks' records made first (sim_ranks.py --start-at-ns), sending from this "
        "many seconds after the start: the ranks' own CPU then stays off the stack's cores",
    )
    p.add_argument("--out", default=None, help="results as JSON")
    p.add_argument("--keep-buckets", action="store_true", help="keep the run's InfluxDB buckets")
    args = p.parse_args()
    if args.steps < 240:
        p.error("--steps must be at least 240 (the fault plan's spacing)")

    from steplens.schema.topics import Topics, ensure_topics

    senv = stack_env()
    tag = f"scale{args.ranks}-{uuid.uuid4().hex[:6]}"
    run_id = f"run-{tag}"
    prefix = f"steplens.{tag}"
    senv["STEPLENS_INFLUX_BUCKET"] = f"bench-{tag}"
    senv["STEPLENS_INFLUX_ROLLUP_BUCKET"] = f"bench-{tag}-rollup"
    env = {**os.environ, **senv, "STEPLENS_RUN_ID": run_id}
    for key, name in (("RAW", "raw"), ("SIGNALS", "signals"), ("ALERTS", "alerts"),
                      ("ADVICE", "advice"), ("DEADLETTER", "deadletter")):  # fmt: skip
        env[f"STEPLENS_TOPIC_{key}"] = f"{prefix}.{name}"
    boot = senv["STEPLENS_KAFKA_BOOTSTRAP"]
    d = Topics()
    topics = Topics(
        raw=env["STEPLENS_TOPIC_RAW"],
        signals=env["STEPLENS_TOPIC_SIGNALS"],
        alerts=env["STEPLENS_TOPIC_ALERTS"],
        dead_letters=env["STEPLENS_TOPIC_DEADLETTER"],
        advice=env["STEPLENS_TOPIC_ADVICE"],
        raw_partitions=d.raw_partitions,
        other_partitions=d.other_partitions,
    )
    ensure_topics(boot, topics)
    series_before = bucket_series(senv)
    work = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    ports = {k: free_port() for k in ("influx", "s3")}
    worker_ports = [free_port() for _ in range(args.workers)]
    s3_prefix = f"bench/{tag}"
    print(f"run {run_id}; logs in {work}", flush=True)
    shards = [] if args.shard_ranks is None else ["--shard-ranks", str(args.shard_ranks)]
    workers = [
        start(
            f"worker{i or ''}",
            ["worker", "--app-id", f"{tag}-w", "--state-dir", str(work / f"worker{i or ''}"),
             "--web-port", str(port), *shards],
            env, work,
        )
        for i, port in enumerate(worker_ports)
    ]  # fmt: skip
    sinks = [
        start("sink-influx", ["sink", "influx", "--group", f"{tag}-influx",
                              "--metrics-port", str(ports["influx"])], env, work),
        start("sink-s3", ["sink", "s3", "--group", f"{tag}-s3", "--prefix", s3_prefix,
                          "--metrics-port", str(ports["s3"])], env, work),
    ]  # fmt: skip
    children = [*workers, *sinks]
    tail = AlertTail(boot, topics.alerts)
    result: dict[str, Any] = {"ranks": args.ranks, "steps": args.steps, "step_s": args.step_s,
                              "workers": args.workers, "shard_ranks": args.shard_ranks,
                              "mode": "full" if args.full_resolution else "windowed",
                              "run_id": run_id}  # fmt: skip
    try:
        for port, w in zip(worker_ports, workers, strict=True):
            wait_port(port, w)
        wait_port(ports["influx"], sinks[0])
        wait_port(ports["s3"], sinks[1])
        tail.start()
        sampler = Sampler(
            [w.pid for w in workers],
            [s.pid for s in sinks],
            worker_ports,
            senv["STEPLENS_INFLUX_URL"],
        )
        base = sampler.sample()
        sampler.start()
        sims = []
        start_at_ns = time.time_ns() + int(args.made_ahead_s * 1e9)
        for first in range(0, args.ranks, args.ranks_per_process):
            last = min(args.ranks, first + args.ranks_per_process) - 1
            cmd = [sys.executable, str(HERE / "sim_ranks.py"), "--ranks", str(args.ranks),
                   "--first", str(first), "--last", str(last), "--steps", str(args.steps),
                   "--step-s", str(args.step_s), "--run-id", run_id, "--bootstrap", boot,
                   "--topic", topics.raw, "--out", str(work / f"sim-{first}.json")]  # fmt: skip
            if args.full_resolution:
                cmd.append("--full-resolution")
            if args.made_ahead_s > 0:
                cmd += ["--start-at-ns", str(start_at_ns)]
            with open(work / f"sim-{first}.log", "wb") as log:
                sims.append(subprocess.Popen(cmd, env=env, stderr=log))
        sim_ps = [psutil.Process(s.pid) for s in sims]
        sim_cpu: dict[int, float] = {}
        t_start = time.monotonic() + args.made_ahead_s  # when the records are sent from
        while any(s.poll() is None for s in sims):
            for sp in sim_ps:
                try:
                    t = sp.cpu_times()
                    sim_cpu[sp.pid] = t.user + t.system
                except psutil.Error:
                    pass
            time.sleep(2.0)
        t_sent = time.monotonic()
        # settle: the worker scored every record sent (or stopped moving for 20 s)
        sent = 0
        for f in range(0, args.ranks, args.ranks_per_process):
            counts = json.loads((work / f"sim-{f}.json").read_text())["counts"]
            sent += sum(counts["records"].values())
        deadline = time.monotonic() + args.settle_s
        last, moved = -1.0, time.monotonic()
        while time.monotonic() < deadline:
            done = sampler.metric("steplens_worker_records_total") - base["worker_records"]
            if done != last:
                last, moved = done, time.monotonic()
            if done >= sent or time.monotonic() - moved > 20:
                break
            time.sleep(2.0)
        time.sleep(10.0)  # the last incidents' reports
        end = sampler.sample()
        sampler.stop.set()
        sims_out = [json.loads((work / f"sim-{f}.json").read_text())
                    for f in range(0, args.ranks, args.ranks_per_process)]  # fmt: skip
        records: dict[str, int] = {}
        nbytes: dict[str, int] = {}
        onsets: dict[str, int] = {}
        sent_late: dict[str, float] = {}
        behind = 0.0
        for s in sims_out:
            for k, v in s["counts"]["records"].items():
                records[k] = records.get(k, 0) + v
            for k, v in s["counts"]["bytes"].items():
                nbytes[k] = nbytes.get(k, 0) + v
            onsets.update(s["onsets"])
            for kind, late in s.get("onsets_sent_late_s", {}).items():
                sent_late[kind] = min(late, sent_late.get(kind, late))
            behind = max(behind, s["counts"]["behind_s_max"])
        dur = args.steps * args.step_s
        rows = sampler.rows
        lags = [r["lag"] for r in rows]
        result["wire"] = {
            "records_per_s": sum(records.values()) / dur,
            "bytes_per_s": sum(nbytes.values()) / dur,
            "records_by_kind_per_s": {k: v / dur for k, v in records.items()},
            "bytes_by_kind_per_s": {k: v / dur for k, v in nbytes.items()},
            "sim_cpu_s": sum(sim_cpu.values()),
            "sim_made_ahead_cpu_s": sum(s["counts"].get("made_cpu_s", 0.0) for s in sims_out),
            "sim_behind_s_max": behind,
        }
        busy = t_sent - t_start
        sending = [r["worker_cpu_s"] for r in rows if r["t"] <= t_sent]
        result["worker"] = {
            "cpu_s": end["worker_cpu_s"] - base["worker_cpu_s"],
            "cpu_share_while_sending": (max(sending, default=end["worker_cpu_s"])
                                        - base["worker_cpu_s"]) / busy,
            "rss_peak_mb": max([r["worker_rss"] for r in rows] + [end["worker_rss"]]) / 2**20,
            "rss_start_mb": base["worker_rss"] / 2**20,
            "lag_max": max(lags, default=0),
            "lag_p50": pct(lags, 0.5),
            "records_consumed": end["worker_records"] - base["worker_records"],
            "records_sent": sent,
            "scoring_backlog_max": max(
                (sent / busy * min(r["t"] - t_start, busy) - (r["worker_records"]
                 - base["worker_records"]) for r in rows),
                default=0.0,
            ),
            "alerts": end["worker_alerts"] - base["worker_alerts"],
            "signals": end["worker_signals"] - base["worker_signals"],
            "dead_letters": end["worker_dead_letters"] - base["worker_dead_letters"],
            "caught_up_after_s": moved - t_sent,
            "records_by_worker": [metric(p, "steplens_worker_records_total") for p in worker_ports],
            "cpu_s_by_worker": [Sampler.tree(w)[0] for w in sampler.workers],
            # every sample while the ranks sent and after: (wall clock s, raw consumer lag,
            # records each worker scored), to place a late alert against the backlog
            "timeline": [
                [round(r["wall_s"], 2), r["lag"]]
                + [r[f"records_w{i}"] for i in range(len(worker_ports))]
                for r in rows
                if r["t"] >= t_start
            ],
        }  # fmt: skip
        result["sinks_cpu_s"] = end["sinks_cpu_s"] - base["sinks_cpu_s"]
        result["sinks_rss_peak_mb"] = {
            name: max(r.get(f"sink{i}_rss", 0.0) for r in [*rows, end]) / 2**20
            for i, name in enumerate(("influx", "s3"))
        }
        if "influxd_rss" in end:
            result["influxd"] = {
                "rss_start_mb": base.get("influxd_rss", 0) / 2**20,
                "rss_peak_mb": max(r.get("influxd_rss", 0) for r in [*rows, end]) / 2**20,
                "cpu_s": end.get("influxd_cpu_s", 0) - base.get("influxd_cpu_s", 0),
            }
        alerts = list(tail.rows)
        with open(work / "alerts.jsonl", "w") as f:
            for t, rec in alerts:
                row = {"t": t, "step": rec.step, "rank": rec.rank, **rec.data}
                f.write(json.dumps(row, default=str) + "\n")
        faults = sims_out[0]["faults"]
        verdict = judge(alerts, faults, onsets)
        lat = [v["latency_s"] for v in verdict["found"].values()]
        for kind, row in verdict["found"].items():
            row["sent_late_s"] = sent_late.get(kind, 0.0)
            row["latency_from_send_s"] = row["latency_s"] - row["sent_late_s"]
        from_send = [v["latency_from_send_s"] for v in verdict["found"].values()]
        result["alerts"] = {
            "found": verdict["found"],
            "missed": [f["kind"] for f in faults if f["kind"] not in verdict["found"]],
            "latency_p50_s": pct(lat, 0.5),
            "latency_p99_s": pct(lat, 0.99),
            "latency_from_send_p50_s": pct(from_send, 0.5),
            "latency_from_send_p99_s": pct(from_send, 0.99),
            "other_pages": verdict["other_pages"],
            "false_alarms": len(verdict["other_pages"]),
            "repeats": verdict["repeats"],
            "alert_records": len(alerts),
        }
        try:  # where each fault's latency went, hop by hop
            result["alerts"]["hops"] = fault_hops.hops(
                boot, topics.raw, f"{tag}-w-by-run", run_id, faults, onsets, verdict["found"]
            )
        except Exception as exc:
            result["alerts"]["hops"] = {"error": str(exc)}
        try:
            result["rollups"] = rollup_figures(ports["influx"])
        except (OSError, ValueError) as exc:
            result["rollups"] = {"error": str(exc)}
    finally:
        stop(children)
        tail.stop.set()
    # after the sinks stopped (the roller uploads what it holds on the way out)
    time.sleep(5.0)
    after = bucket_series(senv)
    result["influx"] = {
        "bucket_series_added": {k: v - series_before.get(k, 0.0) for k, v in after.items()},
        "series_hot": cardinality(senv, senv["STEPLENS_INFLUX_BUCKET"], run_id),
        "series_rollup": cardinality(senv, senv["STEPLENS_INFLUX_ROLLUP_BUCKET"], run_id),
        "series_hot_by_measurement": series_by_measurement(senv, run_id),
    }
    try:
        n, size = s3_usage(senv, s3_prefix)
        result["s3"] = {"objects": n, "bytes": size}
    except Exception as exc:
        result["s3"] = {"error": str(exc)}
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    _drop_topics(boot, tag)
    if not args.keep_buckets:
        _drop_buckets(senv)
    return 0


def _drop_buckets(env: dict[str, str]) -> None:
    """The run's own InfluxDB buckets."""
    from influxdb_client import InfluxDBClient

    names = (env["STEPLENS_INFLUX_BUCKET"], env["STEPLENS_INFLUX_ROLLUP_BUCKET"])
    url, token = env["STEPLENS_INFLUX_URL"], env["STEPLENS_INFLUX_TOKEN"]
    with InfluxDBClient(url=url, token=token, org=env["STEPLENS_INFLUX_ORG"]) as client:
        api = client.buckets_api()
        for name in names:
            try:
                found = api.find_bucket_by_name(name)
                if found is not None:
                    api.delete_bucket(found)
            except Exception as exc:
                print(f"bucket {name} left: {exc}", file=sys.stderr)


def _drop_topics(bootstrap: str, tag: str) -> None:
    """This run's topics (its own and the worker's internal ones), and nobody else's."""
    sys.path.insert(0, str(HERE))
    from scratch_topics import delete_topics, topic_names

    try:
        mine = {t for t in topic_names(bootstrap) if tag in t}
        delete_topics(bootstrap, mine)
    except Exception as exc:
        print(f"topics left: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
