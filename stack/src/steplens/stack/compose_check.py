"""`make compose-check`: docker-compose.yml built, started, fed, checked and removed, end to end.

1. Builds every image without a registry (deploy/local/build-images.sh): the jars and influxd
   `steplens stack up` uses, Prometheus from the Go module proxy, a Debian base from the archive.
2. Starts the compose project ``steplens-check`` (docker-compose.yml + deploy/local/
   docker-compose.local.yml + deploy/local/docker-compose.check.yml) with the trainer profile:
   every service but Grafana (AGPL, registry-only), two workers and three trainers, on host
   ports of its own (29092, 29095, 28086, 29000, 29443, 29090; the local stack's are left
   alone), with secrets and a CA and server certificate (deploy/tls/make-certs.sh) made for
   this run; the secrets pass only in the environment.
3. Checks, each within a deadline: records flow into Kafka; the SASL_SSL listener serves a
   client with the CA and the password, and refuses one without credentials, with a wrong
   password, without the CA, and one speaking plain text; InfluxDB and S3 answer over TLS with
   the CA and refuse a client without it and plain HTTP on their TLS ports; a producer and a
   worker on this host, given only the STEPLENS_KAFKA_* variables, work through the SASL_SSL
   listener; the workers raise every trainer's incidents; the influx sink stores them and
   `steplens query` on this host reads them back over https; the S3 sink stores them (read
   back over https); Prometheus scrapes both workers, both sinks and every trainer's node
   exporter; the two workers share the raw topic's partitions.
4. Kills the worker that owns the most trainer runs (SIGKILL) and measures the seconds until
   the survivor alerts on those runs again.
5. `down -v`, then checks that no container, volume or network of the project is left.

Exit status 0 when every check held; each check prints its outcome and its time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from steplens.stack.config import KAFKA_VERSION, S3PROXY_VERSION, StackConfig
from steplens.stack.install import (
    KAFKA_ARTIFACTS,
    S3PROXY_ARTIFACTS,
    ensure_influxd,
    ensure_jars,
    kafka_libs,
    recipe,
    s3proxy_libs,
)

PROMETHEUS_VERSION = "0.316.0"
PROJECT = "steplens-check"
WORKERS, TRAINERS = 2, 3
PORTS = {
    "STEPLENS_KAFKA_PORT": 29092,
    "STEPLENS_KAFKA_REMOTE_PORT": 29095,
    "STEPLENS_INFLUX_PORT": 28086,
    "STEPLENS_S3_PORT": 29000,
    "STEPLENS_S3_TLS_PORT": 29443,
    "STEPLENS_PROMETHEUS_PORT": 29090,
}
QUERY = ("--metric=started_step", "--since=-1h")  # `steplens query` for a run's alerts
LEFT_OUT = {"grafana"}  # AGPL; its images come only from a registry
T = TypeVar("T")


class CheckFailed(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"[compose-check] {message}", flush=True)


def root() -> Path:
    return Path(__file__).resolve().parents[4]


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 2.0) -> T:
    """``probe()`` until it returns something other than None; its last exception is the
    failure's reason."""
    start = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - start < timeout_s:
        try:
            result = probe()
            if result is not None:
                say(f"ok   {what} ({time.monotonic() - start:.0f} s)")
                return result
        except Exception as exc:
            last = exc
        time.sleep(every_s)
    raise CheckFailed(f"{what}: not within {timeout_s:.0f} s" + (f" ({last})" if last else ""))


# ---------------------------------------------------------------------------- images


def build_images(cfg: StackConfig) -> None:
    from steplens.stack.config import INFLUXDB_VERSION

    ensure_jars(cfg, "kafka", kafka_libs(cfg), KAFKA_ARTIFACTS, say)
    ensure_jars(cfg, "s3", s3proxy_libs(cfg), S3PROXY_ARTIFACTS, say)
    influxd = ensure_influxd(cfg, say)
    env = {**os.environ, "STEPLENS_CACHE": str(cfg.cache)}
    subprocess.run(
        ["bash", str(recipe("build_prometheus.sh")), PROMETHEUS_VERSION], env=env, check=True
    )
    env |= {
        "KAFKA_VERSION": KAFKA_VERSION,
        "S3PROXY_VERSION": S3PROXY_VERSION,
        "INFLUXDB_VERSION": INFLUXDB_VERSION,
        "PROMETHEUS_VERSION": PROMETHEUS_VERSION,
        "KAFKA_LIBS": str(kafka_libs(cfg)),
        "S3PROXY_LIBS": str(s3proxy_libs(cfg)),
        "INFLUXD": str(influxd),
        "PROMETHEUS": str(cfg.cache / "prometheus" / PROMETHEUS_VERSION / "prometheus"),
    }
    subprocess.run(["bash", str(root() / "deploy/local/build-images.sh")], env=env, check=True)


# ---------------------------------------------------------------------------- compose


class Project:
    """The compose project of the check, with its secrets and host ports."""

    def __init__(self) -> None:
        self.secrets = {
            "STEPLENS_INFLUX_TOKEN": secrets.token_hex(32),
            "STEPLENS_INFLUX_PASSWORD": secrets.token_hex(16),
            "AWS_ACCESS_KEY_ID": "steplens-check",
            "AWS_SECRET_ACCESS_KEY": secrets.token_hex(24),
            "STEPLENS_KAFKA_SASL_USERNAME": "steplens-check",
            "STEPLENS_KAFKA_SASL_PASSWORD": secrets.token_hex(24),
            "STEPLENS_TLS_KEYSTORE_PASSWORD": secrets.token_hex(24),
        }
        self.tls = Path(tempfile.mkdtemp(prefix="steplens-check-tls-"))
        subprocess.run(
            ["bash", str(root() / "deploy/tls/make-certs.sh"), str(self.tls), "127.0.0.1"],
            env={**os.environ, **self.secrets},
            check=True,
            capture_output=True,
        )
        self.ca = str(self.tls / "ca.crt")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("STEPLENS_", "AWS_"))},
            **{k: str(v) for k, v in PORTS.items()},
            # the check reaches them on loopback
            "STEPLENS_KAFKA_REMOTE_BIND": "127.0.0.1",
            "STEPLENS_INFLUX_BIND": "127.0.0.1",
            "STEPLENS_S3_TLS_BIND": "127.0.0.1",
            "STEPLENS_TLS_DIR": str(self.tls / "server"),
            **self.secrets,
        }
        files = ["docker-compose.yml", "deploy/local/docker-compose.local.yml"]
        files.append("deploy/local/docker-compose.check.yml")
        self.argv = ["docker-compose", "-p", PROJECT, *(a for f in files for a in ("-f", f))]
        self.argv += ["--profile", "trainer"]

    def run(self, *args: str, capture: bool = False, check: bool = True) -> str:
        out = subprocess.run(
            [*self.argv, *args],
            cwd=root(),
            env=self.env,
            check=check,
            text=True,
            stdout=subprocess.PIPE if capture else None,
        )
        return out.stdout or ""

    def services(self) -> list[str]:
        import yaml

        config = yaml.safe_load(self.run("config", capture=True))["services"]
        return [
            name
            for name, svc in config.items()
            if name not in LEFT_OUT and set(svc.get("profiles", ["trainer"])) & {"trainer"}
        ]

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service, capture=True).split()

    def host_env(self) -> dict[str, str]:
        """What a client on this host sets to reach the project (InfluxDB and S3 over TLS)."""
        return {
            "STEPLENS_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORTS['STEPLENS_KAFKA_PORT']}",
            "STEPLENS_INFLUX_URL": f"https://127.0.0.1:{PORTS['STEPLENS_INFLUX_PORT']}",
            "STEPLENS_INFLUX_CA_CERT": self.ca,
            "STEPLENS_INFLUX_ORG": "steplens",
            "STEPLENS_INFLUX_TOKEN": self.secrets["STEPLENS_INFLUX_TOKEN"],
            "STEPLENS_S3_ENDPOINT": f"https://127.0.0.1:{PORTS['STEPLENS_S3_TLS_PORT']}",
            "STEPLENS_S3_CA_BUNDLE": self.ca,
            "STEPLENS_S3_BUCKET": "steplens",
            "AWS_ACCESS_KEY_ID": self.secrets["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": self.secrets["AWS_SECRET_ACCESS_KEY"],
            "AWS_DEFAULT_REGION": "us-east-1",
        }


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, text=True, capture_output=True).stdout


def leftovers() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    found = []
    for kind, argv in (
        ("container", ["ps", "-aq", "--filter", label]),
        ("volume", ["volume", "ls", "-q", "--filter", label]),
        ("network", ["network", "ls", "-q", "--filter", label]),
    ):
        found += [f"{kind} {name}" for name in docker(*argv).split()]
    return found


def ports_free() -> None:
    for name, port in PORTS.items():
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise CheckFailed(f"127.0.0.1:{port} ({name}) is taken: stop what listens there")


@contextlib.contextmanager
def host_env(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------- checks


class Checks:
    def __init__(self, project: Project) -> None:
        from steplens.schema.topics import Topics

        self.p = project
        self.topics = Topics.from_env()
        self.bootstrap = project.host_env()["STEPLENS_KAFKA_BOOTSTRAP"]
        self.runs: dict[str, str] = {}  # run id -> trainer container id

    def consumer(self, topic: str, from_end: bool = False) -> Any:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"compose-check-{secrets.token_hex(4)}",
                "auto.offset.reset": "latest" if from_end else "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([topic])
        return c

    def trainer_runs(self) -> None:
        ids = self.p.containers("trainer")
        if len(ids) != TRAINERS:
            raise CheckFailed(f"{len(ids)} trainer containers, expected {TRAINERS}")
        self.runs = {f"check-{cid[:12]}": cid for cid in ids}

    def records_flow(self) -> None:
        seen: dict[str, int] = {}
        c = self.consumer(self.topics.raw)

        def probe() -> bool | None:
            for msg in c.consume(500, timeout=1.0):
                if msg.error() is None:
                    for run in self.runs:
                        if run.encode() in (msg.value() or b""):
                            seen[run] = seen.get(run, 0) + 1
            return True if len(seen) == len(self.runs) and min(seen.values()) >= 20 else None

        try:
            wait_for(
                f"records of all {len(self.runs)} trainers in {self.topics.raw}", probe, 180, 0
            )
        finally:
            c.close()

    def authentication(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        remote = f"127.0.0.1:{PORTS['STEPLENS_KAFKA_REMOTE_PORT']}"
        sasl = {
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": self.p.ca,
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": self.p.secrets["STEPLENS_KAFKA_SASL_USERNAME"],
        }

        def topics(conf: dict[str, str]) -> set[str]:
            admin = AdminClient({"bootstrap.servers": remote, "log_level": 0, **conf})
            return set(admin.list_topics(timeout=5).topics)

        def refused(conf: dict[str, str]) -> bool:
            try:
                topics(conf)
            except KafkaException:
                return True
            return False

        good = {**sasl, "sasl.password": self.p.secrets["STEPLENS_KAFKA_SASL_PASSWORD"]}
        wait_for(
            f"{remote} serves SCRAM-SHA-512 over TLS with the CA and the password",
            lambda: True if self.topics.raw in topics(good) else None,
            60,
        )
        for conf, what in (
            ({"security.protocol": "SSL", "ssl.ca.location": self.p.ca}, "no credentials"),
            ({**sasl, "sasl.password": "wrong"}, "a wrong password"),
            ({k: v for k, v in good.items() if k != "ssl.ca.location"}, "no CA"),
            ({**good, "security.protocol": "SASL_PLAINTEXT"}, "plain text"),
            ({}, "plain text without credentials"),
        ):
            if not refused(conf):
                raise CheckFailed(f"{remote} answered a client with {what}")
        say(f"ok   {remote} refuses no credentials, a wrong password, no CA and plain text")

    def tls_endpoints(self) -> None:
        """InfluxDB and S3 answer over TLS a client that trusts the CA, and refuse one that
        does not, plain HTTP on their TLS ports, and wrong credentials."""
        from steplens.sinks.influx import make_client
        from steplens.sinks.s3 import make_s3_client
        from steplens.sinks.settings import InfluxSettings, S3Settings

        env = self.p.host_env()
        with host_env(env):
            influx = InfluxSettings.from_env()
            s3 = dataclasses.replace(
                S3Settings.from_env(),
                access_key_id=env["AWS_ACCESS_KEY_ID"],
                secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            )

        def bucket(s: InfluxSettings) -> bool | None:
            with make_client(s) as client:
                return client.buckets_api().find_bucket_by_name(s.bucket) is not None or None

        def head(s: S3Settings) -> bool:
            return bool(make_s3_client(s).head_bucket(Bucket=s.bucket))

        def refused(call: Callable[[], object]) -> bool:
            try:
                call()
            except Exception:
                return True
            return False

        wait_for(f"InfluxDB over TLS at {influx.url} with the CA", lambda: bucket(influx), 60)
        for wrong, what in (
            (dataclasses.replace(influx, ca_cert=None), "no CA"),
            (dataclasses.replace(influx, url=influx.url.replace("https:", "http:")), "plain HTTP"),
            (dataclasses.replace(influx, token="wrong"), "a wrong token"),
        ):
            if not refused(functools.partial(bucket, wrong)):
                raise CheckFailed(f"InfluxDB answered a client with {what}")
        say(f"ok   {influx.url} refuses no CA, plain HTTP and a wrong token")
        endpoint = s3.endpoint_url or ""
        wait_for(f"S3 over TLS at {endpoint} with the CA", lambda: head(s3), 60)
        for bad, what in (
            (dataclasses.replace(s3, ca_bundle=None), "no CA"),
            (
                dataclasses.replace(s3, endpoint_url=endpoint.replace("https:", "http:")),
                "plain HTTP",
            ),
            (dataclasses.replace(s3, secret_access_key="wrong"), "a wrong secret key"),
        ):
            if not refused(functools.partial(head, bad)):
                raise CheckFailed(f"S3 answered a client with {what}")
        say(f"ok   {endpoint} refuses no CA, plain HTTP and a wrong secret key")

    def remote_clients(self) -> None:
        """A producer and a worker on this host take the SCRAM credentials from the usual
        STEPLENS_KAFKA_* variables and work through the authenticated listener."""
        remote = {
            **{k: v for k, v in os.environ.items() if not k.startswith("STEPLENS_")},
            "STEPLENS_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORTS['STEPLENS_KAFKA_REMOTE_PORT']}",
            "STEPLENS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "STEPLENS_KAFKA_SSL_CA_LOCATION": self.p.ca,
            "STEPLENS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "STEPLENS_KAFKA_SASL_USERNAME": self.p.secrets["STEPLENS_KAFKA_SASL_USERNAME"],
            "STEPLENS_KAFKA_SASL_PASSWORD": self.p.secrets["STEPLENS_KAFKA_SASL_PASSWORD"],
        }
        run = f"check-remote-{secrets.token_hex(3)}"
        produce = (
            "import steplens.producer as sl\n"
            f"sl.init({run!r})\n"
            "for step in range(50):\n"
            "    sl.log_step(step, loss=1.0)\n"
            "sl.shutdown()\n"
        )
        subprocess.run([sys.executable, "-c", produce], env=remote, check=True, timeout=120)
        c = self.consumer(self.topics.raw)
        try:
            wait_for(
                f"a producer's records through {remote['STEPLENS_KAFKA_BOOTSTRAP']} (SASL_SSL)",
                lambda: (
                    True
                    if any(run.encode() in (m.value() or b"") for m in c.consume(500, timeout=1.0))
                    else None
                ),
                60,
                0,
            )
        finally:
            c.close()
        from confluent_kafka.admin import AdminClient

        group = "steplens-check-remote"
        argv = [str(Path(sys.executable).with_name("steplens")), "worker", f"--app-id={group}"]
        argv += ["--web-port=0", "--no-arima", "--no-history"]
        with tempfile.TemporaryDirectory() as state:
            worker = subprocess.Popen(
                [*argv, f"--state-dir={state}"],
                env=remote,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            admin = AdminClient({"bootstrap.servers": self.bootstrap})

            def assigned() -> bool | None:
                (future,) = admin.describe_consumer_groups([group]).values()
                members = future.result(timeout=10).members
                return True if any(m.assignment.topic_partitions for m in members) else None

            try:
                wait_for("a worker joins its group through the SASL_SSL listener", assigned, 180, 3)
            finally:
                worker.terminate()
                worker.wait(timeout=60)

    def incidents(self) -> dict[str, float]:
        """Every trainer's run has an alert; returns when each was first seen."""
        first: dict[str, float] = {}
        c = self.consumer(self.topics.alerts)

        def probe() -> bool | None:
            for msg in c.consume(500, timeout=1.0):
                key = (msg.key() or b"").decode(errors="replace")
                value = msg.value() or b""
                for run in self.runs:
                    if run not in first and (run == key or run.encode() in value):
                        first[run] = time.monotonic()
            return True if len(first) == len(self.runs) else None

        try:
            wait_for(f"the workers' alerts for all {len(self.runs)} trainer runs", probe, 300, 0)
        finally:
            c.close()
        return first

    def stored(self) -> None:
        from steplens.sinks.query import Stores, query_records
        from steplens.sinks.settings import S3Settings

        env = self.p.host_env()
        steplens = Path(sys.executable).with_name("steplens")
        for run in self.runs:

            def influx(run: str = run) -> bool | None:
                out = subprocess.run(
                    [str(steplens), "query", f"--run={run}", "--kind=alert", "--csv=-", *QUERY],
                    env={**os.environ, **env},
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=True,
                ).stdout
                rows = [line for line in out.splitlines()[1:] if line.strip()]
                return True if rows and any(",influx" in line for line in rows) else None

            wait_for(f"`steplens query` reads {run}'s alerts back from InfluxDB", influx, 120)
        with host_env(env):
            stores = Stores(None, S3Settings.from_env())
            for run in self.runs:
                wait_for(
                    f"{run}'s alerts in S3 (cold Parquet)",
                    lambda run=run: (
                        True if len(query_records(run, "alert", stores=stores)) else None
                    ),
                    120,
                    5,
                )

    def scraped(self) -> None:
        url = f"http://127.0.0.1:{PORTS['STEPLENS_PROMETHEUS_PORT']}/api/v1/targets?state=active"
        want = {
            "steplens-worker": WORKERS,
            "steplens-sink-influx": 1,
            "steplens-sink-s3": 1,
            "steplens-node": TRAINERS,
        }

        def probe() -> bool | None:
            with urllib.request.urlopen(url, timeout=5) as r:
                targets = json.load(r)["data"]["activeTargets"]
            up: dict[str, int] = {}
            for t in targets:
                if t["health"] == "up":
                    up[t["labels"]["job"]] = up.get(t["labels"]["job"], 0) + 1
            return True if all(up.get(job, 0) >= n for job, n in want.items()) else None

        jobs = ", ".join(f"{job} x{n}" for job, n in want.items())
        wait_for(f"Prometheus scrapes {jobs}", probe, 120, 5)

    def owners(self) -> dict[str, dict[str, list[int]]]:
        """Worker container id -> topic -> partitions, from the consumer group."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        (group,) = admin.describe_consumer_groups(["steplens-worker"]).values()
        desc = group.result(timeout=10)
        by_ip = {}
        for cid in self.p.containers("worker"):
            nets = json.loads(docker("inspect", cid))[0]["NetworkSettings"]["Networks"]
            by_ip.update({n["IPAddress"]: cid for n in nets.values()})
        out: dict[str, dict[str, list[int]]] = {}
        for m in desc.members:
            cid = by_ip.get(m.host.lstrip("/"))
            if cid is None or m.assignment is None:
                continue
            for tp in m.assignment.topic_partitions:
                out.setdefault(cid, {}).setdefault(tp.topic, []).append(tp.partition)
        return out

    def shared(self) -> dict[str, dict[str, list[int]]]:
        def probe() -> dict[str, dict[str, list[int]]] | None:
            owners = self.owners()
            raw = [cid for cid, tps in owners.items() if tps.get(self.topics.raw)]
            return owners if len(raw) == WORKERS else None

        return wait_for(f"{WORKERS} workers share {self.topics.raw}'s partitions", probe, 120, 3)

    def run_partitions(self, topic: str) -> dict[str, int]:
        """Each trainer run's partition of the workers' by-run topic (from its keys)."""
        found: dict[str, int] = {}
        c = self.consumer(topic)

        def probe() -> bool | None:
            for msg in c.consume(500, timeout=1.0):
                key = (msg.key() or b"").decode(errors="replace")
                if msg.error() is None and key in self.runs:
                    found[key] = msg.partition()
            return True if len(found) == len(self.runs) else None

        try:
            wait_for(f"every run's partition of {topic}", probe, 60, 0)
        finally:
            c.close()
        return found

    def failover(self, owners: dict[str, dict[str, list[int]]]) -> float:
        by_run = "steplens-worker-by-run"
        partition = self.run_partitions(by_run)
        runs_of = {
            cid: [r for r, p in partition.items() if p in tps.get(by_run, [])]
            for cid, tps in owners.items()
        }
        victim = max(runs_of, key=lambda cid: len(runs_of[cid]))
        orphans = set(runs_of[victim])
        if not orphans:
            raise CheckFailed("no worker owns a trainer run")
        c = self.consumer(self.topics.alerts, from_end=True)
        c.consume(1, timeout=5.0)  # joins and takes its partitions at their end
        docker("kill", victim)
        killed = time.monotonic()
        say(f"killed worker {victim[:12]} (SIGKILL), owner of {len(orphans)} of the runs")
        again: dict[str, float] = {}

        def probe() -> bool | None:
            for msg in c.consume(500, timeout=1.0):
                key = (msg.key() or b"").decode(errors="replace")
                value = msg.value() or b""
                for run in orphans - again.keys():
                    if run == key or run.encode() in value:
                        again[run] = time.monotonic() - killed
            return True if again.keys() == orphans else None

        try:
            wait_for("the surviving worker alerts on the dead one's runs again", probe, 300, 0)
        finally:
            c.close()
        state = json.loads(docker("inspect", victim))[0]
        if state["State"]["Running"] or state["RestartCount"]:
            raise CheckFailed("the killed worker came back: the alerts may be its own")
        seconds = max(again.values())
        say(f"ok   failover: the dead worker's runs alert again {seconds:.0f} s after the kill")
        return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="compose-check", description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="leave the project running (no down)")
    ap.add_argument("--no-build", action="store_true", help="use the images as they are")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode:
        say("no Docker engine answers (start dockerd): nothing checked")
        return 2
    if not args.no_build:
        try:
            build_images(StackConfig.create())
        except subprocess.CalledProcessError as exc:
            say(f"FAIL building the images: {' '.join(map(str, exc.cmd))} exited {exc.returncode}")
            say("(pip behind an HTTPS proxy with its own CA? STEPLENS_BUILD_CA_DIR=its folder)")
            return 1
    built = time.monotonic()
    say(f"images ready in {built - t0:.0f} s")
    project = Project()
    failed = ""
    try:
        project.run("down", "-v", "--remove-orphans", capture=True)
        ports_free()
        services = project.services()
        say(f"starting {', '.join(services)} (not Grafana: AGPL, not served here)")
        project.run(
            "up", "-d", "--scale", f"worker={WORKERS}", "--scale", f"trainer={TRAINERS}", *services
        )
        checks = Checks(project)
        checks.trainer_runs()
        checks.records_flow()
        checks.authentication()
        checks.tls_endpoints()
        checks.incidents()
        checks.remote_clients()
        owners = checks.shared()
        checks.stored()
        checks.scraped()
        checks.failover(owners)
    except (CheckFailed, subprocess.CalledProcessError) as exc:
        failed = str(exc)
        say(f"FAIL {failed}")
        project.run("ps", check=False)
        project.run("logs", "--tail", "30", check=False)
    finally:
        if not args.keep:
            project.run("down", "-v", "--remove-orphans", capture=True, check=False)
            left = leftovers()
            if left:
                failed = failed or f"left behind: {', '.join(left)}"
                say(f"FAIL {failed}")
            else:
                say("ok   down -v left no container, volume or network")
        shutil.rmtree(project.tls, ignore_errors=True)
    say(f"{'FAILED' if failed else 'passed'}: {time.monotonic() - t0:.0f} s in all")
    say(f"({built - t0:.0f} s images, {time.monotonic() - built:.0f} s stack and checks)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
