"""TLS as docker-compose.yml serves it beyond loopback, against the real servers: s3proxy's
secure endpoint, influxd with --tls-cert/--tls-key and Kafka's SASL_SSL listener, each started
privately on free 127.0.0.1 ports from the local stack's cached binaries, with a CA and server
certificate made by deploy/tls/make-certs.sh. The clients (boto3 through the S3 sink's settings,
influxdb-client through the InfluxDB sink's, the producer and the worker's Kafka credentials
through STEPLENS_KAFKA_*) connect with the CA; a client without it, a plain-text one and one
without valid credentials are refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from steplens.stack.config import StackConfig
from steplens.stack.install import influxd_binary, kafka_libs, s3proxy_libs
from steplens.stack.process import free_ports
from steplens.stack.secret_store import Secrets

ROOT = Path(__file__).resolve().parents[2]
CACHE = StackConfig.create().cache


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: Path  # the folder docker-compose.yml mounts: server.crt, server.key, server.p12
    password: str


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    out = tmp_path_factory.mktemp("tls")
    password = secrets.token_hex(16)
    subprocess.run(
        ["bash", str(ROOT / "deploy/tls/make-certs.sh"), str(out), "kafka.example.org"],
        env={**os.environ, "STEPLENS_TLS_KEYSTORE_PASSWORD": password, "STEPLENS_TLS_UID": "0"},
        check=True,
        capture_output=True,
    )
    return Certs(out / "ca.crt", out / "server", password)


def _secrets() -> Secrets:
    return Secrets(*(secrets.token_hex(16) for _ in range(4)))


@contextlib.contextmanager
def serving(
    argv: list[str], log: Path, ready: Callable[[], bool], timeout_s: float = 120
) -> Iterator[subprocess.Popen[bytes]]:
    """The process of ``argv`` until the block ends, once ``ready()`` holds."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not _holds(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{argv[0]} not ready: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _holds(probe: Callable[[], bool]) -> bool:
    try:
        return probe()
    except Exception:
        return False


def _need(path: Path, what: str) -> None:
    if not path.exists():
        pytest.skip(f"{what} not in the cache ({path}): run `steplens stack up` once")


# ---------------------------------------------------------------------------- S3


def test_s3_secure_endpoint(certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import botocore.exceptions

    from steplens.sinks.s3 import make_s3_client
    from steplens.sinks.settings import S3Settings

    _need(s3proxy_libs(StackConfig.create()), "the s3proxy jars")
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    (port,) = free_ports(1)
    keys = _secrets()
    (tmp_path / "data").mkdir()
    props = {  # the s3 service of docker-compose.yml, its secure endpoint only
        "s3proxy.secure-endpoint": f"https://127.0.0.1:{port}",
        "s3proxy.keystore-path": str(certs.server / "server.p12"),
        "s3proxy.keystore-password": certs.password,
        "s3proxy.authorization": "aws-v2-or-v4",
        "s3proxy.identity": keys.s3_access_key,
        "s3proxy.credential": keys.s3_secret_key,
        "s3proxy.ignore-unknown-headers": "true",
        "jclouds.provider": "filesystem-nio2",
        "jclouds.identity": "local",
        "jclouds.credential": "local",
        "jclouds.filesystem.basedir": str(tmp_path / "data"),
    }
    (tmp_path / "s3proxy.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    endpoint = f"https://127.0.0.1:{port}"

    def client(**kw: Any) -> Any:
        base = {
            "endpoint_url": endpoint,
            "ca_bundle": str(certs.ca),
            "region": "us-east-1",
            "access_key_id": keys.s3_access_key,
            "secret_access_key": keys.s3_secret_key,
        }
        return make_s3_client(S3Settings(**(base | kw)))

    argv = ["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp"]
    argv += [f"{s3proxy_libs(StackConfig.create())}/*", "org.gaul.s3proxy.Main"]
    argv += ["--properties", str(tmp_path / "s3proxy.properties")]
    with serving(argv, tmp_path / "s3proxy.log", lambda: bool(client().list_buckets())):
        s3 = client()
        s3.create_bucket(Bucket="steplens")
        s3.put_object(Bucket="steplens", Key="cold/x", Body=b"over TLS")
        assert s3.get_object(Bucket="steplens", Key="cold/x")["Body"].read() == b"over TLS"
        # a client that does not trust the CA, plain HTTP on the TLS port, a wrong secret
        with pytest.raises(botocore.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
            client(ca_bundle=None).list_buckets()
        with pytest.raises(botocore.exceptions.BotoCoreError):
            client(endpoint_url=f"http://127.0.0.1:{port}").list_buckets()
        with pytest.raises(botocore.exceptions.ClientError) as denied:
            client(secret_access_key="wrong").list_buckets()
        assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


# ---------------------------------------------------------------------------- InfluxDB


def test_influxdb_tls(certs: Certs, tmp_path: Path) -> None:
    from influxdb_client import Point
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.rest import ApiException

    from steplens.sinks.influx import make_client
    from steplens.sinks.settings import InfluxSettings
    from steplens.stack.services.influxdb import CACHE_AND_QUERY_LIMITS

    influxd = influxd_binary(StackConfig.create())
    _need(influxd, "influxd")
    (port,) = free_ports(1)
    keys = _secrets()
    url = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(certs.ca))

    def call(path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return json.loads(resp.read() or b"null")

    argv = [str(influxd), "--bolt-path", str(tmp_path / "influxd.bolt")]
    argv += ["--engine-path", str(tmp_path / "engine")]
    argv += ["--sqlite-path", str(tmp_path / "influxd.sqlite")]
    argv += ["--http-bind-address", f"127.0.0.1:{port}", "--reporting-disabled"]
    argv += ["--ui-disabled", *(part for flag in CACHE_AND_QUERY_LIMITS for part in flag)]
    argv += ["--tls-cert", str(certs.server / "server.crt")]
    argv += ["--tls-key", str(certs.server / "server.key")]
    with serving(argv, tmp_path / "influxd.log", lambda: call("/health")["status"] == "pass"):
        call(
            "/api/v2/setup",
            {
                "username": "steplens",
                "password": keys.influx_password,
                "org": "steplens",
                "bucket": "steplens",
                "token": keys.influx_token,
            },
        )
        settings = InfluxSettings(url=url, ca_cert=str(certs.ca), token=keys.influx_token)
        with make_client(settings) as client:
            point = Point("tls").field("loss", 1.5).time(time.time_ns())
            client.write_api(write_options=SYNCHRONOUS).write("steplens", record=point)
            tables = client.query_api().query(
                'from(bucket:"steplens") |> range(start:-1h)'
                ' |> filter(fn:(r) => r._measurement == "tls")'
            )
            assert [r.get_value() for t in tables for r in t.records] == [1.5]
        # a client that does not trust the CA, plain HTTP on the TLS port, no token
        for refused, match in (
            (InfluxSettings(url=url, token=keys.influx_token), "CERTIFICATE_VERIFY_FAILED"),
            (InfluxSettings(url=f"http://127.0.0.1:{port}", token=keys.influx_token), "HTTPS"),
            (InfluxSettings(url=url, ca_cert=str(certs.ca)), "unauthorized"),
        ):
            with make_client(refused) as client, pytest.raises(Exception, match=match) as exc:
                client.query_api().query("buckets()")
            if refused.token == "":
                assert isinstance(exc.value, ApiException) and exc.value.status == 401


# ---------------------------------------------------------------------------- Kafka


def test_kafka_sasl_ssl_listener(certs: Certs, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, KafkaException, admin

    from steplens.schema.kafka_config import admin_config
    from steplens.schema.topics import TopicSpec, create_missing
    from steplens.stack.services.kafka import Kafka

    _need(kafka_libs(StackConfig.create()), "the Kafka jars")
    plain, controller, remote = free_ports(3)
    cfg = StackConfig.create(home=tmp_path, ports={"kafka": plain, "kafka_controller": controller})
    # the REMOTE listener of docker-compose.yml: SCRAM-SHA-512 over TLS, the key in a PKCS12 store
    listener = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},CONTROLLER://127.0.0.1:{controller},"
        f"REMOTE://127.0.0.1:{remote}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{plain},REMOTE://127.0.0.1:{remote}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
        "REMOTE:SASL_SSL",
        "listener.name.remote.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.remote.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.remote.ssl.keystore.type": "PKCS12",
        "listener.name.remote.ssl.keystore.location": str(certs.server / "server.p12"),
        "listener.name.remote.ssl.keystore.password": certs.password,
    }

    class RemoteKafka(Kafka):
        @property
        def properties(self) -> str:
            kept = [
                ln for ln in super().properties.splitlines() if ln.split("=")[0] not in listener
            ]
            return "".join(f"{ln}\n" for ln in [*kept, *(f"{k}={v}" for k, v in listener.items())])

    kafka = RemoteKafka(cfg, _secrets())
    kafka.prepare(lambda _line: None)
    user, password = "steplens-tls", secrets.token_hex(16)
    sasl = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(certs.ca),
    }

    def topics(conf: dict[str, str]) -> set[str]:
        client = admin.AdminClient(
            {"bootstrap.servers": f"127.0.0.1:{remote}", "log_level": 0, **conf}
        )
        return set(client.list_topics(timeout=5).topics)

    def refused(conf: dict[str, str]) -> bool:
        try:
            topics(conf)
        except KafkaException:
            return True
        return False

    with serving(kafka.argv(), tmp_path / "kafka.log", lambda: kafka.probe() is None):
        assert create_missing(f"127.0.0.1:{plain}", [TopicSpec("tls.raw", 1)]) == ["tls.raw"]
        local = admin.AdminClient(admin_config(f"127.0.0.1:{plain}"))
        info = admin.ScramCredentialInfo(admin.ScramMechanism.SCRAM_SHA_512, 8192)
        upsert = admin.UserScramCredentialUpsertion(user, info, password.encode())
        for done in local.alter_user_scram_credentials([upsert]).values():
            done.result(timeout=30)
        deadline = time.monotonic() + 30
        while not _holds(lambda: "tls.raw" in topics(sasl)):
            assert time.monotonic() < deadline, "the SASL_SSL listener never served the user"
            time.sleep(1)
        # refused: a client that does not trust the CA, SASL without TLS, TLS without SASL,
        # a wrong password
        assert refused({k: v for k, v in sasl.items() if k != "ssl.ca.location"})
        assert refused({**sasl, "security.protocol": "SASL_PLAINTEXT"})
        assert refused({"security.protocol": "SSL", "ssl.ca.location": str(certs.ca)})
        assert refused({**sasl, "sasl.password": "wrong"})

        # the producer takes it all from STEPLENS_KAFKA_* (a process of its own, as a node's)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLENS_")}
        env |= {f"STEPLENS_KAFKA_{k.upper().replace('.', '_')}": v for k, v in sasl.items()}
        env |= {"STEPLENS_KAFKA_BOOTSTRAP": f"127.0.0.1:{remote}", "STEPLENS_TOPIC_RAW": "tls.raw"}
        produce = (
            "import steplens.producer as sl\n"
            "sl.init('tls-run')\n"
            "for step in range(20):\n"
            "    sl.log_step(step, loss=1.0)\n"
            "sl.shutdown()\n"
        )
        subprocess.run([sys.executable, "-c", produce], env=env, check=True, timeout=120)
        consumer = Consumer(
            {
                "bootstrap.servers": f"127.0.0.1:{plain}",
                "group.id": "tls-check",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(["tls.raw"])
        try:
            seen = [m for m in consumer.consume(100, timeout=20) if m.error() is None]
        finally:
            consumer.close()
        assert any(b"tls-run" in (m.value() or b"") for m in seen)

        # the worker's Kafka credentials (Faust's aiokafka) from the same settings
        assert _aiokafka_sends(f"127.0.0.1:{remote}", sasl)
        assert not _aiokafka_sends(f"127.0.0.1:{remote}", {**sasl, "sasl.password": "wrong"})


def _aiokafka_sends(bootstrap: str, conf: dict[str, str]) -> bool:
    import aiokafka
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from steplens.stream_jobs.worker.app import broker_credentials

    async def send() -> bool:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            request_timeout_ms=10_000,
            **credentials_to_aiokafka_auth(broker_credentials(conf)),
        )
        try:
            await producer.start()
            await producer.send_and_wait("tls.raw", b"worker-credentials")
        except Exception:
            return False
        finally:
            await producer.stop()
        return True

    return asyncio.run(send())
