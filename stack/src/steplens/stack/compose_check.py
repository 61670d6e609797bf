"""`make compose-check`: docker-compose.yml built, started, fed, checked and removed, end to end,
alone (local development) and with docker-compose.exposed.yml (other machines let in).

1. Builds every image without a registry (deploy/local/build-images.sh): the jars and influxd
   `steplens stack up` uses, Prometheus from the Go module proxy, a Debian base from the archive.
2. The files as compose reads them: docker-compose.yml with an empty environment publishes
   every port on 127.0.0.1 only; docker-compose.exposed.yml refuses to start without each of
   its secrets.
3. Local: the project ``steplens-check-local`` (docker-compose.yml + deploy/local/
   docker-compose.local.yml + deploy/local/docker-compose.check.yml, nothing else set but free
   host ports picked at its start) with the trainer profile: every service but
   Grafana (AGPL, registry-only), two workers and three trainers. Checks, each within a
   deadline: records flow into Kafka; the workers raise every trainer's incidents; the two
   workers share the raw topic's partitions; the influx sink stores them and `steplens query`
   on this host reads them back; the S3 sink stores them; Prometheus scrapes both workers, both
   sinks and every trainer's node exporter. Then it kills the worker that owns the most trainer
   runs (SIGKILL) and measures the seconds until the survivor alerts on those runs again,
   within a deadline derived from the workers' settings (``failover_deadline``).
4. Exposed: the project ``steplens-check-exposed`` (docker-compose.exposed.yml added; secrets,
   a CA and a server certificate made for the run, passed only in the environment; its remote
   ports bound to 127.0.0.1) with one worker and one trainer: the SASL_SSL
   listener serves a client with the CA and the password, and refuses one without credentials,
   with a wrong password, without the CA, and one speaking plain text; InfluxDB and S3 answer
   over TLS with the CA and refuse a client without it and plain HTTP on their TLS ports; a
   producer (the trainers' user) and a worker (the services' user) on this host, given only
   the STEPLENS_KAFKA_* variables, work through the SASL_SSL listener; the trainers' user
   writes raw records and reads advice but may not write advice (ACLs); the worker's
   incidents reach InfluxDB (read back over https) and S3.
5. After each project, `down -v`, then checks that no container, volume or network of it is
   left.

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
LOCAL_FILES = ("docker-compose.yml",)
EXPOSED_FILES = ("docker-compose.yml", "docker-compose.exposed.yml")
# the images built here, then the check's trainers (deploy/local/incident_trainer.py)
CHECK_FILES = ("deploy/local/docker-compose.local.yml", "deploy/local/docker-compose.check.yml")
# the host ports compose publishes on 127.0.0.1: free ones, picked when a project is made
PORTS = (
    "STEPLENS_KAFKA_PORT",
    "STEPLENS_INFLUX_PORT",
    "STEPLENS_S3_PORT",
    "STEPLENS_PROMETHEUS_PORT",
)
EXPOSED_PORTS = ("STEPLENS_KAFKA_REMOTE_PORT", "STEPLENS_INFLUX_TLS_PORT", "STEPLENS_S3_TLS_PORT")
EXPOSED_BINDS = ("STEPLENS_KAFKA_REMOTE_BIND", "STEPLENS_INFLUX_TLS_BIND", "STEPLENS_S3_TLS_BIND")
# the exposed project's secrets; each one missing makes compose refuse
SECRET_NAMES = (
    "STEPLENS_INFLUX_TOKEN",
    "STEPLENS_INFLUX_PASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "STEPLENS_KAFKA_SASL_USERNAME",
    "STEPLENS_KAFKA_SASL_PASSWORD",
    "STEPLENS_KAFKA_TRAINER_USERNAME",
    "STEPLENS_KAFKA_TRAINER_PASSWORD",
    "STEPLENS_TLS_KEYSTORE_PASSWORD",
    "STEPLENS_TLS_DIR",
)
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


def clean_env() -> dict[str, str]:
    """This process's environment without any setting of the stack's: compose sees only what
    the check gives it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("STEPLENS_", "AWS_"))}


class Project:
    """A compose project of the check: its files, environment and host ports; ``exposed`` adds
    docker-compose.exposed.yml with secrets, a CA and a server certificate made for the run."""

    def __init__(self, exposed: bool, workers: int, trainers: int) -> None:
        self.exposed, self.workers, self.trainers = exposed, workers, trainers
        self.name = f"{PROJECT}-{'exposed' if exposed else 'local'}"
        self.ports = free_ports((*PORTS, *EXPOSED_PORTS) if exposed else PORTS)
        self.env = clean_env()
        self.secrets: dict[str, str] = {}
        self.tls: Path | None = None
        files = EXPOSED_FILES if exposed else LOCAL_FILES
        if exposed:
            self.secrets = {
                "STEPLENS_INFLUX_TOKEN": secrets.token_hex(32),
                "STEPLENS_INFLUX_PASSWORD": secrets.token_hex(16),
                "AWS_ACCESS_KEY_ID": "steplens-check",
                "AWS_SECRET_ACCESS_KEY": secrets.token_hex(24),
                "STEPLENS_KAFKA_SASL_USERNAME": "steplens-check",
                "STEPLENS_KAFKA_SASL_PASSWORD": secrets.token_hex(24),
                "STEPLENS_KAFKA_TRAINER_USERNAME": "steplens-check-trainer",
                "STEPLENS_KAFKA_TRAINER_PASSWORD": secrets.token_hex(24),
                "STEPLENS_TLS_KEYSTORE_PASSWORD": secrets.token_hex(24),
            }
            self.tls = Path(tempfile.mkdtemp(prefix="steplens-check-tls-"))
            subprocess.run(
                ["bash", str(root() / "deploy/tls/make-certs.sh"), str(self.tls), "127.0.0.1"],
                env={**os.environ, **self.secrets},
                check=True,
                capture_output=True,
            )
            self.env |= dict.fromkeys(EXPOSED_BINDS, "127.0.0.1")  # the check reaches them here
            self.env |= {"STEPLENS_TLS_DIR": str(self.tls / "server"), **self.secrets}
        self.env |= {k: str(v) for k, v in self.ports.items()}
        self.argv = ["docker-compose", "-p", self.name]
        self.argv += [a for f in (*files, *CHECK_FILES) for a in ("-f", f)]
        self.argv += ["--profile", "trainer"]
        self.config = self.load_config()

    @property
    def ca(self) -> str:
        assert self.tls is not None, "the local project has no CA"
        return str(self.tls / "ca.crt")

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

    def load_config(self) -> dict[str, Any]:
        import yaml

        return dict(yaml.safe_load(self.run("config", capture=True)))

    def services(self) -> list[str]:
        """The services of the default and trainer profiles, but Grafana; the exposed project
        leaves out what the local one checks and TLS does not change (Prometheus)."""
        config = self.config["services"]
        names = [
            name
            for name, svc in config.items()
            if name not in LEFT_OUT and set(svc.get("profiles", ["trainer"])) & {"trainer"}
        ]
        return [n for n in names if not (self.exposed and n == "prometheus")]

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service, capture=True).split()

    def host_env(self) -> dict[str, str]:
        """What a client on this host sets to reach the project: the local one with the
        development credentials of docker-compose.yml, the exposed one over TLS."""
        app = self.config["services"]["sink-s3"]["environment"]
        env = {
            "STEPLENS_KAFKA_BOOTSTRAP": f"127.0.0.1:{self.ports['STEPLENS_KAFKA_PORT']}",
            "STEPLENS_INFLUX_URL": f"http://127.0.0.1:{self.ports['STEPLENS_INFLUX_PORT']}",
            "STEPLENS_INFLUX_ORG": "steplens",
            "STEPLENS_INFLUX_TOKEN": app["STEPLENS_INFLUX_TOKEN"],
            "STEPLENS_S3_ENDPOINT": f"http://127.0.0.1:{self.ports['STEPLENS_S3_PORT']}",
            "STEPLENS_S3_BUCKET": "steplens",
            "AWS_ACCESS_KEY_ID": app["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": app["AWS_SECRET_ACCESS_KEY"],
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        if self.exposed:
            env |= {
                "STEPLENS_INFLUX_URL": f"https://127.0.0.1:{self.ports['STEPLENS_INFLUX_TLS_PORT']}",
                "STEPLENS_INFLUX_CA_CERT": self.ca,
                "STEPLENS_S3_ENDPOINT": f"https://127.0.0.1:{self.ports['STEPLENS_S3_TLS_PORT']}",
                "STEPLENS_S3_CA_BUNDLE": self.ca,
            }
        return env

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.name}"
        found = []
        for kind, argv in (
            ("container", ["ps", "-aq", "--filter", label]),
            ("volume", ["volume", "ls", "-q", "--filter", label]),
            ("network", ["network", "ls", "-q", "--filter", label]),
        ):
            found += [f"{kind} {name}" for name in docker(*argv).split()]
        return found


def free_ports(names: tuple[str, ...]) -> dict[str, int]:
    """A free port on 127.0.0.1 for each name (the machine may run other stacks)."""
    with contextlib.ExitStack() as held:
        found = {}
        for name in names:
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            found[name] = s.getsockname()[1]
    return found


def published(config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(service, host address, host port) of every published port; compose v1 writes them as
    "ADDRESS:PORT:TARGET/tcp", v2 as mappings."""
    out = []
    for name, svc in config["services"].items():
        for p in svc.get("ports", []):
            if isinstance(p, dict):
                out.append((name, p.get("host_ip", "0.0.0.0"), str(p.get("published", ""))))
            else:
                parts = str(p).split(":")
                address = parts[0] if len(parts) == 3 else "0.0.0.0"
                out.append((name, address, parts[-2] if len(parts) > 1 else ""))
    return out


def compose_config(files: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` of ``files`` with exactly ``env``."""
    argv = ["docker-compose", *(a for f in files for a in ("-f", f)), "config"]
    return subprocess.run(argv, cwd=root(), env=env, capture_output=True, text=True, check=False)


def files_as_composed() -> None:
    """docker-compose.yml alone needs no variable and publishes on 127.0.0.1 only; with
    docker-compose.exposed.yml, compose refuses while any of its secrets is missing."""
    import yaml

    out = compose_config(LOCAL_FILES, clean_env())
    if out.returncode:
        raise CheckFailed(f"docker-compose.yml with an empty environment: {out.stderr.strip()}")
    wide = [p for p in published(yaml.safe_load(out.stdout)) if p[1] != "127.0.0.1"]
    if wide:
        raise CheckFailed(f"docker-compose.yml publishes beyond loopback: {wide}")
    say("ok   docker-compose.yml: no variable needed, every port on 127.0.0.1")
    for name in SECRET_NAMES:
        env = clean_env() | dict.fromkeys(set(SECRET_NAMES) - {name}, "x" * 12)
        out = compose_config(EXPOSED_FILES, env)
        if out.returncode == 0 or name not in out.stderr:
            raise CheckFailed(f"docker-compose.exposed.yml started without {name}")
    say(f"ok   docker-compose.exposed.yml refuses without each of its {len(SECRET_NAMES)} secrets")


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, text=True, capture_output=True).stdout


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
        if len(ids) != self.p.trainers:
            raise CheckFailed(f"{len(ids)} trainer containers, expected {self.p.trainers}")
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

        remote = f"127.0.0.1:{self.p.ports['STEPLENS_KAFKA_REMOTE_PORT']}"
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

    def remote_env(self, who: str) -> dict[str, str]:
        """A client's environment on this host through the SASL_SSL listener, as the
        ``who`` user (``SASL``: the services', ``TRAINER``: the trainers')."""
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("STEPLENS_")},
            "STEPLENS_KAFKA_BOOTSTRAP": f"127.0.0.1:{self.p.ports['STEPLENS_KAFKA_REMOTE_PORT']}",
            "STEPLENS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "STEPLENS_KAFKA_SSL_CA_LOCATION": self.p.ca,
            "STEPLENS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "STEPLENS_KAFKA_SASL_USERNAME": self.p.secrets[f"STEPLENS_KAFKA_{who}_USERNAME"],
            "STEPLENS_KAFKA_SASL_PASSWORD": self.p.secrets[f"STEPLENS_KAFKA_{who}_PASSWORD"],
        }

    def remote_clients(self) -> None:
        """A producer (the trainers' user) and a worker (the services' user) on this host take
        the SCRAM credentials from the usual STEPLENS_KAFKA_* variables and work through the
        authenticated listener."""
        remote = self.remote_env("TRAINER")
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
                env=self.remote_env("SASL"),
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

    def advice_acl(self) -> None:
        """The trainers' user writes raw records and reads advice, and is refused when it
        writes advice; the services' user writes advice."""
        from confluent_kafka import Consumer, Producer, TopicPartition

        def conf(who: str) -> dict[str, str]:
            env = self.remote_env(who)
            return {
                "bootstrap.servers": env["STEPLENS_KAFKA_BOOTSTRAP"],
                "security.protocol": "SASL_SSL",
                "ssl.ca.location": self.p.ca,
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": env["STEPLENS_KAFKA_SASL_USERNAME"],
                "sasl.password": env["STEPLENS_KAFKA_SASL_PASSWORD"],
                "log_level": "0",
            }

        def produce(who: str, topic: str) -> str | None:
            """None when delivered, else the error's name."""
            errors: list[Any] = []
            p = Producer({**conf(who), "message.timeout.ms": "20000"})
            p.produce(
                topic, b"compose-check", key=b"check", on_delivery=lambda e, _m: errors.append(e)
            )
            p.flush(30)
            if not errors:
                return "not answered"
            return None if errors[0] is None else str(errors[0].name())

        for who, topic, want in (
            ("TRAINER", self.topics.raw, None),
            ("TRAINER", self.topics.advice, "TOPIC_AUTHORIZATION_FAILED"),
            ("SASL", self.topics.advice, None),
        ):
            got = produce(who, topic)
            if got != want:
                raise CheckFailed(f"the {who.lower()} user writing {topic}: {got}, not {want}")
        reader = Consumer({**conf("TRAINER"), "group.id": "unused", "enable.auto.commit": False})
        try:
            reader.assign([TopicPartition(self.topics.advice, 0, 0)])
            msgs = reader.consume(10, timeout=20)
            if not any(m.error() is None and m.value() == b"compose-check" for m in msgs):
                raise CheckFailed(f"the trainer user read no advice from {self.topics.advice}")
        finally:
            reader.close()
        say(
            f"ok   the trainers' user writes {self.topics.raw} and reads {self.topics.advice}, "
            "and is refused writing advice; the services' user writes advice"
        )

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

                def cold(run: str = run) -> bool | None:
                    return True if len(query_records(run, "alert", stores=stores)) else None

                wait_for(
                    f"{run}'s alerts in S3 (cold Parquet)",
                    cold,
                    120,
                    5,
                )

    def scraped(self) -> None:
        url = f"http://127.0.0.1:{self.p.ports['STEPLENS_PROMETHEUS_PORT']}/api/v1/targets?state=active"
        want = {
            "steplens-worker": self.p.workers,
            "steplens-sink-influx": 1,
            "steplens-sink-s3": 1,
            "steplens-node": self.p.trainers,
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
        """Worker container id -> topic -> partitions, from the workers' consumer groups (the
        Faust agent's, and the route stage's for the raw topic)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        groups = admin.describe_consumer_groups(["steplens-worker", "steplens-worker-route"])
        by_ip = {}
        for cid in self.p.containers("worker"):
            nets = json.loads(docker("inspect", cid))[0]["NetworkSettings"]["Networks"]
            by_ip.update({n["IPAddress"]: cid for n in nets.values()})
        out: dict[str, dict[str, list[int]]] = {}
        for group in groups.values():
            for m in group.result(timeout=10).members:
                owner = by_ip.get(m.host.lstrip("/"))
                if owner is None or m.assignment is None:
                    continue
                for tp in m.assignment.topic_partitions:
                    out.setdefault(owner, {}).setdefault(tp.topic, []).append(tp.partition)
        return out

    def shared(self) -> dict[str, dict[str, list[int]]]:
        def probe() -> dict[str, dict[str, list[int]]] | None:
            owners = self.owners()
            raw = [cid for cid, tps in owners.items() if tps.get(self.topics.raw)]
            return owners if len(raw) == self.p.workers else None

        return wait_for(
            f"{self.p.workers} workers share {self.topics.raw}'s partitions", probe, 120, 3
        )

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

    def group_state(self) -> tuple[str, int]:
        """The workers' consumer group: its state (Stable, PreparingRebalance, ...) and members."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        (group,) = admin.describe_consumer_groups(["steplens-worker"]).values()
        desc = group.result(timeout=10)
        return str(desc.state).rsplit(".", 1)[-1], len(desc.members)

    def failover(self) -> float:
        by_run = "steplens-worker-by-run"
        partition = self.run_partitions(by_run)
        owners = self.owners()  # now, not as the group stood before the other checks
        runs_of = {
            cid: [r for r, p in partition.items() if p in tps.get(by_run, [])]
            for cid, tps in owners.items()
        }
        if not runs_of or not max(map(len, runs_of.values())):
            raise CheckFailed("no worker owns a trainer run")
        victim = max(runs_of, key=lambda cid: len(runs_of[cid]))
        orphans = set(runs_of[victim])
        deadline, why = failover_deadline(self.p.config)
        c = self.consumer(self.topics.alerts, from_end=True)
        # its partitions taken (at their end) before the kill, so no later alert is missed
        wait_for(
            "the check's alerts consumer is assigned",
            lambda: (c.consume(1, timeout=1.0), c.assignment())[1] or None,
            60,
            0,
        )
        docker("kill", victim)
        killed = time.monotonic()
        say(f"killed worker {victim[:12]} (SIGKILL), owner of {len(orphans)} of the runs")
        again: dict[str, float] = {}
        states: list[str] = []  # the group's states seen, one entry per change
        looked = 0.0

        def probe() -> bool | None:
            nonlocal looked
            for msg in c.consume(500, timeout=1.0):
                key = (msg.key() or b"").decode(errors="replace")
                value = msg.value() or b""
                for run in orphans - again.keys():
                    if run == key or run.encode() in value:
                        again[run] = time.monotonic() - killed
            if time.monotonic() - looked > 3:
                looked = time.monotonic()
                with contextlib.suppress(Exception):
                    state = "{} ({} members)".format(*self.group_state())
                    if not states or states[-1] != state:
                        states.append(state)
            return True if again.keys() == orphans else None

        say(f"the survivor has {deadline:.0f} s: {why}")
        try:
            wait_for("the surviving worker alerts on the dead one's runs again", probe, deadline, 0)
        except CheckFailed as exc:
            raise CheckFailed(f"{exc}; the group went {' -> '.join(states)}") from None
        finally:
            c.close()
        state = json.loads(docker("inspect", victim))[0]
        if state["State"]["Running"] or state["RestartCount"]:
            raise CheckFailed("the killed worker came back: the alerts may be its own")
        seconds = max(again.values())
        say(f"ok   failover: the dead worker's runs alert again {seconds:.0f} s after the kill")
        say(f"     (the workers' group went {' -> '.join(states)})")
        return seconds


# A busy machine (2 cores shared with other work) stretches each step of a takeover this much.
BUSY = 4.0


def failover_deadline(config: dict[str, Any]) -> tuple[float, str]:
    """How long the survivor may take to alert on a killed worker's runs, from the settings the
    compose workers and the check's trainers run with: the session timeout (the dead member's
    eviction) and a heartbeat (the survivor learns of it), a checkpoint interval (what it scores
    again) and one period of the trainers' incidents (the next one to alert on), each stretched
    by ``BUSY``; plus the history timeout, for a run warmed from its history instead of the
    table."""
    from steplens.schema.settings import resolve
    from steplens.stream_jobs.worker.settings import WorkerSettings

    services = config["services"]
    with host_env({k: str(v) for k, v in services["worker"]["environment"].items()}):
        s = resolve(WorkerSettings)
    trainer = services["trainer"]["environment"]
    period = int(trainer["CHECK_INCIDENT_EVERY"]) * float(trainer["CHECK_STEP_S"])
    session = s.session_timeout_s * (1 + 1 / 6)
    deadline = BUSY * (session + s.checkpoint_s + period) + s.history.timeout_s
    why = (
        f"{BUSY:g} x (session {s.session_timeout_s:g} s + heartbeat {s.session_timeout_s / 6:.1f} s"
        f" + checkpoint {s.checkpoint_s:g} s + incident period {period:g} s)"
        f" + history timeout {s.history.timeout_s:g} s"
    )
    return deadline, why


def local_checks(project: Project) -> None:
    checks = Checks(project)
    checks.trainer_runs()
    checks.records_flow()
    checks.incidents()
    checks.shared()
    checks.stored()
    checks.scraped()
    checks.failover()


def exposed_checks(project: Project) -> None:
    checks = Checks(project)
    checks.trainer_runs()
    checks.records_flow()
    checks.authentication()
    checks.tls_endpoints()
    checks.incidents()
    checks.remote_clients()
    checks.advice_acl()
    checks.stored()


def run_project(project: Project, checks: Callable[[Project], None], keep: bool) -> str:
    """Starts the project, runs its checks, removes it; the failure's reason, or ""."""
    failed = ""
    say(f"---- {project.name}")
    try:
        project.run("down", "-v", "--remove-orphans", capture=True)
        services = project.services()
        say(f"starting {', '.join(services)} (not Grafana: AGPL, not served here)")
        scale = ("--scale", f"worker={project.workers}", "--scale", f"trainer={project.trainers}")
        project.run("up", "-d", *scale, *services)
        checks(project)
    except (CheckFailed, subprocess.CalledProcessError) as exc:
        failed = str(exc)
        say(f"FAIL {failed}")
        project.run("ps", check=False)
        project.run("logs", "--tail", "30", check=False)
    finally:
        if not keep:
            project.run("down", "-v", "--remove-orphans", capture=True, check=False)
            left = project.leftovers()
            if left:
                failed = failed or f"left behind: {', '.join(left)}"
                say(f"FAIL {failed}")
            else:
                say("ok   down -v left no container, volume or network")
        if project.tls is not None:
            shutil.rmtree(project.tls, ignore_errors=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="compose-check", description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="leave the projects running (no down)")
    ap.add_argument("--no-build", action="store_true", help="use the images as they are")
    ap.add_argument(
        "--only", choices=("local", "exposed"), help="start one project (default: both)"
    )
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
            if not os.environ.get("STEPLENS_BUILD_CA_DIR"):
                say("(pip behind an HTTPS proxy with its own CA? STEPLENS_BUILD_CA_DIR=its folder)")
            return 1
    built = time.monotonic()
    say(f"images ready in {built - t0:.0f} s")
    # the projects' settings come from their files and the check only, the host's clients too
    for name in [k for k in os.environ if k.startswith(("STEPLENS_", "AWS_"))]:
        del os.environ[name]
    failed = ""
    times = []
    try:
        files_as_composed()
    except CheckFailed as exc:
        failed = str(exc)
        say(f"FAIL {failed}")
    for exposed, workers, trainers, checks in (
        (False, 2, 3, local_checks),
        (True, 1, 1, exposed_checks),
    ):
        if failed or args.only == ("local" if exposed else "exposed"):
            continue
        started = time.monotonic()
        failed = run_project(Project(exposed, workers, trainers), checks, args.keep)
        times.append(f"{time.monotonic() - started:.0f} s {'exposed' if exposed else 'local'}")
    say(f"{'FAILED' if failed else 'passed'}: {time.monotonic() - t0:.0f} s in all")
    say(f"({built - t0:.0f} s images, {', '.join(times) or 'no project'})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
