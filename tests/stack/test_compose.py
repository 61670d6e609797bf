"""docker-compose.yml is a local stack that needs no variable and publishes on 127.0.0.1 only;
docker-compose.exposed.yml adds TLS and SASL and refuses to start without its secrets; both are
valid for Debian's docker-compose and describe the same stack; the local override (deploy/local/)
builds on them; `make compose-check` runs them for real."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "STEPLENS_INFLUX_TOKEN": "compose-test-token",
    "STEPLENS_INFLUX_PASSWORD": "compose-test-password",
    "AWS_ACCESS_KEY_ID": "compose-test-key",
    "AWS_SECRET_ACCESS_KEY": "compose-test-secret",
    "STEPLENS_KAFKA_SASL_USERNAME": "compose-test-user",
    "STEPLENS_KAFKA_SASL_PASSWORD": "compose-test-kafka-password",
    "STEPLENS_KAFKA_TRAINER_USERNAME": "compose-test-trainer",
    "STEPLENS_KAFKA_TRAINER_PASSWORD": "compose-test-trainer-password",
    "STEPLENS_TLS_KEYSTORE_PASSWORD": "compose-test-keystore-password",
}
TLS_DIR = "/srv/compose-test-tls"  # what deploy/tls/make-certs.sh writes (DIR/server)
ENV = SECRETS | {"STEPLENS_TLS_DIR": TLS_DIR}
EXPOSED = ["-f", "docker-compose.yml", "-f", "docker-compose.exposed.yml"]
LOCAL = ["-f", "docker-compose.yml", "-f", "deploy/local/docker-compose.local.yml"]
# every host port the files let a variable move
PORT_VARIABLES = {
    "STEPLENS_KAFKA_PORT": "39092",
    "STEPLENS_INFLUX_PORT": "38086",
    "STEPLENS_S3_PORT": "39000",
    "STEPLENS_PROMETHEUS_PORT": "39090",
    "STEPLENS_GRAFANA_PORT": "33000",
    "STEPLENS_MLFLOW_PORT": "35000",
}
DEV_VALUES = ("steplens-dev", "local")  # development credentials are written as such
VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)(:?[-?])?([^}]*)\}")


def _config(
    extra_env: dict[str, str], files: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` with only ``extra_env`` of the stack's variables."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    return _composed(tuple(files or ["-f", "docker-compose.yml"]), tuple(sorted(extra_env.items())))


@functools.cache  # one run of docker-compose (seconds on a busy machine) per files and variables
def _composed(
    files: tuple[str, ...], extra_env: tuple[tuple[str, str], ...]
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPLENS_", "AWS_"))}
    return subprocess.run(
        ["docker-compose", *files, "config"],
        cwd=ROOT,
        env=env | dict(extra_env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _services(files: list[str] | None = None, env: dict[str, str] | None = None) -> dict:
    import yaml

    result = _config(env or {}, files)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def _exposed(env: dict[str, str] | None = None) -> dict:
    return _services(EXPOSED, ENV | (env or {}))


def _published(service: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port: compose v1 writes
    "ADDRESS:PORT:TARGET/tcp", v2 a mapping."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append((p.get("host_ip", "0.0.0.0"), str(p.get("published")), str(p["target"])))
        else:
            *host, target = str(p).split(":")
            address = host[0] if len(host) == 2 else "0.0.0.0"
            out.append((address, host[-1] if host else "", target.split("/")[0]))
    return out


def test_the_local_file_asks_for_nothing_and_publishes_on_loopback_only() -> None:
    """Read as text, without Docker: every variable of docker-compose.yml has a default, and
    every published port, whatever its variables say, is bound to 127.0.0.1."""
    import yaml

    text = (ROOT / "docker-compose.yml").read_text()
    used = VARIABLE.findall(text)
    assert used, "the host ports are variables"
    assert [name for name, op, _ in used if op != ":-"] == []
    resolved = yaml.safe_load(VARIABLE.sub(lambda m: m.group(3), text))
    ports = [(n, str(p)) for n, s in resolved["services"].items() for p in s.get("ports", [])]
    assert {n for n, _ in ports} >= {"kafka", "influxdb", "s3", "prometheus", "grafana"}
    assert [(n, p) for n, p in ports if not p.startswith("127.0.0.1:")] == []


def test_the_local_file_as_compose_reads_it() -> None:
    """`docker-compose config` with an empty environment succeeds, with no TLS anywhere, and
    publishes on 127.0.0.1 only, also with every port variable set."""
    for env in ({}, PORT_VARIABLES):
        services = _services(env=env)
        published = [(n, p) for n, s in services.items() for p in _published(s)]
        assert published and [(n, p) for n, p in published if p[0] != "127.0.0.1"] == []
        assert {p[1] for _, p in published} >= set(env.values())
        assert "kafka-users" not in services
        assert "/etc/steplens/tls" not in str(services)
    kafka = services["kafka"]["environment"]
    assert "SASL" not in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    assert services["worker"]["environment"]["STEPLENS_INFLUX_URL"] == "http://influxdb:8086"


def test_the_exposed_file_refuses_without_its_secrets() -> None:
    """Compose refuses the exposed file with an empty environment, and names what is missing
    (each secret is required: the next test; `make compose-check` drops each in turn)."""
    for env in ({}, {k: v for k, v in ENV.items() if k != "STEPLENS_TLS_DIR"}):
        missing = _config(env, EXPOSED)
        assert missing.returncode != 0
        assert "set STEPLENS_" in missing.stderr or "set AWS_" in missing.stderr
    assert "STEPLENS_TLS_DIR" in missing.stderr
    assert _config(ENV, EXPOSED).returncode == 0


def test_every_secret_of_the_exposed_file_is_required() -> None:
    """Read as text: the exposed file gives no secret a default; it names each one."""
    text = (ROOT / "docker-compose.exposed.yml").read_text()
    required = {name for name, op, _ in VARIABLE.findall(text) if op == ":?"}
    assert required == set(ENV)
    defaults = {name for name, op, _ in VARIABLE.findall(text) if op == ":-"}
    assert not defaults & set(ENV)


def test_compose_config_validates() -> None:
    for services in (_services(), _exposed()):
        for name in (
            "kafka",
            "influxdb",
            "s3",
            "grafana",
            "prometheus",
            "worker",
            "sink-influx",
            "sink-s3",
        ):
            assert name in services
        assert services["worker"]["command"] == ["steplens", "worker"]
        assert services["sink-s3"]["command"] == ["steplens", "sink", "s3"]
        # the stores yield the CPU to the workers, whose alerts should not wait
        for store in ("sink-influx", "sink-s3"):
            assert services[store]["cpu_shares"] < services["worker"].get("cpu_shares", 1024)
        ports = {p[1] for s in services.values() for p in _published(s)}
        assert {"19092", "18086", "19000"} <= ports, ports
        assert [name for name, svc in services.items() if not svc.get("mem_limit")] == []


def test_compose_influxdb_has_the_local_stacks_memory_limits() -> None:
    from steplens.stack.services.influxdb import CACHE_AND_QUERY_LIMITS

    env = _services()["influxdb"]["environment"]
    for flag, value in CACHE_AND_QUERY_LIMITS:
        assert str(env["INFLUXD_" + flag[2:].upper().replace("-", "_")]) == value, flag
    assert env["GOMEMLIMIT"].endswith("MiB")


def test_provisioned_files_exist() -> None:
    import yaml

    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    found = {
        (name, sd["port"])
        for job in prometheus["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
    }
    # every replica of a scaled service is found by its name, not one fixed target
    assert {("worker", 9464), ("sink-influx", 9465), ("sink-s3", 9466)} <= found
    assert not [job for job in prometheus["scrape_configs"] if "static_configs" in job]


def test_grafana_reads_influxdb_as_each_file_serves_it() -> None:
    """The same datasource uids either way: plain HTTP in the local stack, https verified with
    the stack's CA in the exposed one (its datasources file mounted over the local one)."""
    import yaml

    local_file = ROOT / "deploy/grafana/provisioning/datasources/steplens.yaml"
    exposed_file = ROOT / "deploy/grafana/exposed/datasources.yaml"
    local, exposed = (
        yaml.safe_load(f.read_text())["datasources"] for f in (local_file, exposed_file)
    )
    for sources in (local, exposed):
        assert {d["uid"] for d in sources} == {"steplens-influxdb", "steplens-prometheus"}
    (influx_local,) = [d for d in local if d["uid"] == "steplens-influxdb"]
    (influx_exposed,) = [d for d in exposed if d["uid"] == "steplens-influxdb"]
    assert influx_local["url"] == "http://influxdb:8086"
    assert influx_exposed["url"] == "https://influxdb:8086"
    assert influx_exposed["jsonData"]["tlsAuthWithCACert"] is True
    assert "ca.crt" in influx_exposed["secureJsonData"]["tlsCACert"]
    grafana = _exposed()["grafana"]
    mounted = {str(v).split(":")[1]: str(v).split(":")[0] for v in grafana["volumes"]}
    target = "/etc/grafana/provisioning/datasources/steplens.yaml"
    assert Path(mounted[target]).resolve() == exposed_file.resolve()
    assert target not in {str(v).split(":")[1] for v in _services()["grafana"]["volumes"]}


def test_optional_services_and_the_node_exporters() -> None:
    """Alertmanager and the trainer loops come only with their profiles; the trainers' node
    exporters are what Prometheus's steplens-node job finds by DNS; Alertmanager routes as the
    local stack's does, on 127.0.0.1."""
    import yaml

    from steplens.stack.services.alertmanager import CONFIG

    for services in (_services(), _exposed()):
        optional = ("alertmanager", "sink-alertmanager", "trainer", "mlflow", "mlflow-mirror")
        assert services["alertmanager"]["profiles"] == ["alertmanager"]
        assert services["sink-alertmanager"]["profiles"] == ["alertmanager"]
        assert services["trainer"]["profiles"] == ["trainer"]
        assert services["mlflow"]["profiles"] == services["mlflow-mirror"]["profiles"] == ["mlflow"]
        assert not [n for n, s in services.items() if n not in optional and s.get("profiles")]
    assert [p[0] for p in _published(services["alertmanager"])] == ["127.0.0.1"]
    assert "--cluster.listen-address=" in services["alertmanager"]["command"]
    routing = (ROOT / "deploy/alertmanager/alertmanager.yml").read_text()
    assert yaml.safe_load(routing) == yaml.safe_load(CONFIG)
    assert services["sink-alertmanager"]["command"] == [
        "steplens", "sink", "alertmanager", "--url", "http://alertmanager:9093"
    ]  # fmt: skip
    assert "STEPLENS_ALERTMANAGER_URL" not in services["worker"]["environment"]
    trainer = services["trainer"]
    assert trainer["environment"]["STEPLENS_EXPORTER_PORT"] == "9467"
    assert trainer["environment"]["STEPLENS_EXPORTER_HOST"] == "0.0.0.0"
    assert "ports" not in trainer  # scraped inside compose's network only
    script = trainer["command"][-1].removeprefix("/src/")
    assert (ROOT / script).exists()
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (node,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "steplens-node"]
    assert node["dns_sd_configs"] == [
        {"names": ["trainer"], "type": "A", "port": 9467, "refresh_interval": "30s"}
    ]


def test_every_service_is_ready_to_deploy() -> None:
    """init, a restart policy and a memory limit everywhere; a healthcheck on every long-running
    service (one-shot jobs are judged by their exit status and are not restarted)."""
    for services in (_services(), _exposed()):
        for name, svc in services.items():
            assert svc.get("init") is True, name
            assert svc.get("mem_limit"), name
            assert svc.get("restart") in ("unless-stopped", "no"), name
            if svc["restart"] == "no":
                assert name in ("topics", "s3-init", "kafka-users"), name
            else:
                assert svc.get("healthcheck", {}).get("test"), name


def test_only_development_credentials_are_written_in_the_files() -> None:
    """The local file's credentials are development ones, named as such; the exposed file's
    come from the environment only (``${VAR:?...}``) and replace every one of them."""
    names = re.compile(
        r"(TOKEN|PASSWORD|SECRET|CREDENTIAL|IDENTITY|ACCESS_KEY_ID)[A-Z_]*:\s*(\S.*)$"
    )
    for path, allowed in (
        ("docker-compose.yml", DEV_VALUES),
        ("docker-compose.exposed.yml", ("${",)),
        ("deploy/local/docker-compose.local.yml", ()),
    ):
        for line in (ROOT / path).read_text().splitlines():
            found = names.search(line.split("#")[0])
            if found and not line.strip().startswith("-"):
                assert found.group(2).startswith(allowed), (path, line)
    exposed = str(_exposed())
    assert "steplens-dev" not in exposed
    for value in SECRETS.values():
        assert value not in (ROOT / "docker-compose.exposed.yml").read_text()
        assert value in exposed


def test_kafka_listeners_beyond_loopback_require_scram_over_tls() -> None:
    """Host clients use an unauthenticated listener published on 127.0.0.1 only; with the
    exposed file every other client the SCRAM one over TLS, advertised under
    STEPLENS_KAFKA_ADVERTISED_HOST."""
    kafka = _exposed({"STEPLENS_KAFKA_ADVERTISED_HOST": "kafka.example.org"})["kafka"]
    env = kafka["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    advertised = dict(a.split("://") for a in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert advertised["REMOTE"] == "kafka.example.org:19095"
    assert advertised["LOCAL"] == "127.0.0.1:19092"
    assert protocols["REMOTE"] == "SASL_SSL"
    assert env["KAFKA_LISTENER_NAME_REMOTE_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_LISTENER_NAME_REMOTE_SSL_KEYSTORE_LOCATION"] == "/etc/steplens/tls/server.p12"
    assert (
        env["KAFKA_LISTENER_NAME_REMOTE_SSL_KEYSTORE_PASSWORD"]
        == (SECRETS["STEPLENS_TLS_KEYSTORE_PASSWORD"])
    )
    published = {target: address for address, _, target in _published(kafka)}
    assert published == {"19092": "127.0.0.1", "19095": "0.0.0.0"}
    # the PLAINTEXT listeners are never published beyond loopback
    for name, protocol in protocols.items():
        if protocol == "PLAINTEXT" and name != "LOCAL":
            port = env["KAFKA_LISTENERS"].split(f"{name}://:")[1].split(",")[0]
            assert port not in published, name


def test_influxdb_and_s3_speak_tls_beyond_loopback() -> None:
    """With the exposed file InfluxDB serves https only (one listener: its loopback port too)
    and gets a port of its own on every interface by default; S3 keeps plain HTTP on loopback
    and serves https on every interface; the certificate, key and CA come from
    STEPLENS_TLS_DIR, mounted read-only, and the services verify InfluxDB with the CA."""
    services = _exposed()
    influx, s3 = services["influxdb"], services["s3"]
    assert influx["environment"]["INFLUXD_TLS_CERT"] == "/etc/steplens/tls/server.crt"
    assert influx["environment"]["INFLUXD_TLS_KEY"] == "/etc/steplens/tls/server.key"
    assert sorted(_published(influx)) == [
        ("0.0.0.0", "18443", "8086"), ("127.0.0.1", "18086", "8086")
    ]  # fmt: skip
    assert "https://" in str(influx["healthcheck"]["test"])
    assert s3["environment"]["S3PROXY_SECURE_ENDPOINT"] == "https://0.0.0.0:443"
    assert s3["environment"]["S3PROXY_KEYSTORE_PATH"] == "/etc/steplens/tls/server.p12"
    assert sorted(_published(s3)) == [("0.0.0.0", "19443", "443"), ("127.0.0.1", "19000", "80")]
    binds = {
        "STEPLENS_KAFKA_REMOTE_BIND": "10.1.2.3",
        "STEPLENS_INFLUX_TLS_BIND": "10.1.2.3",
        "STEPLENS_S3_TLS_BIND": "10.1.2.3",
    }
    one = _exposed(binds)
    for name in ("kafka", "influxdb", "s3"):
        assert {p[0] for p in _published(one[name])} == {"127.0.0.1", "10.1.2.3"}, name
    mounted = {
        name
        for name, svc in services.items()
        if f"{TLS_DIR}:/etc/steplens/tls:ro" in [str(v) for v in svc.get("volumes", [])]
    }
    assert {"kafka", "influxdb", "s3", "worker", "sink-influx", "sink-s3", "grafana"} <= mounted
    for name in ("worker", "sink-influx", "sink-s3", "topics", "s3-init", "trainer"):
        env = services[name]["environment"]
        assert env["STEPLENS_INFLUX_URL"] == "https://influxdb:8086", name
        assert env["STEPLENS_INFLUX_CA_CERT"] == "/etc/steplens/tls/ca.crt", name
        assert env["STEPLENS_INFLUX_TOKEN"] == SECRETS["STEPLENS_INFLUX_TOKEN"], name


def test_the_local_override_builds_on_the_same_versions() -> None:
    """deploy/local's images stand in for the official ones at the versions the local stack
    runs, and only Grafana has none; the same on top of the exposed file."""
    from steplens.stack.compose_check import LEFT_OUT, PROMETHEUS_VERSION
    from steplens.stack.config import INFLUXDB_VERSION, KAFKA_VERSION, S3PROXY_VERSION

    exposed = [*EXPOSED, "-f", "deploy/local/docker-compose.local.yml"]
    for services in (_services(LOCAL), _services(exposed, ENV)):
        assert services["kafka"]["image"] == f"steplens-local/kafka:{KAFKA_VERSION}"
        assert services["s3"]["image"] == f"steplens-local/s3proxy:{S3PROXY_VERSION}"
        assert services["influxdb"]["image"] == f"steplens-local/influxdb:{INFLUXDB_VERSION}"
        assert services["prometheus"]["image"] == f"steplens-local/prometheus:{PROMETHEUS_VERSION}"
        official = [
            n for n, s in services.items() if "/" in s["image"] and "local" not in s["image"]
        ]
        assert sorted(official) == sorted([*LEFT_OUT, "alertmanager", "mlflow"])
    script = (ROOT / "deploy/local/build-images.sh").read_text()
    assert "ca-certificates" not in (ROOT / "deploy/Dockerfile").read_text()
    assert "STEPLENS_BUILD_CA_DIR" in script


def _python_image(ca_dir: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STEPLENS_BUILD_CA_DIR"}
    if ca_dir is not None:
        env["STEPLENS_BUILD_CA_DIR"] = str(ca_dir)
    return subprocess.run(
        ["bash", str(ROOT / "deploy/local/build-images.sh"), "--python-image"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_python_image_is_named_after_the_certificates_it_trusts(tmp_path: Path) -> None:
    """Setting STEPLENS_BUILD_CA_DIR (or changing what it holds) names another Python image,
    which build-images.sh then builds instead of keeping the one without them."""
    plain = _python_image(None)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "steplens-local/python:3.11"
    (tmp_path / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n")
    first = _python_image(tmp_path).stdout.strip()
    assert first.startswith("steplens-local/python:3.11-ca-") and first != plain.stdout.strip()
    assert _python_image(tmp_path).stdout.strip() == first  # the same folder, the same image
    (tmp_path / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\nBBBB\n")
    assert _python_image(tmp_path).stdout.strip() not in (first, plain.stdout.strip())
    (tmp_path / "proxy.crt").unlink()
    empty = _python_image(tmp_path)
    assert empty.returncode != 0 and "holds no *.crt" in empty.stderr


def test_the_failover_deadline_follows_the_workers_settings() -> None:
    """The check's wait for a takeover grows with the session timeout the compose workers run
    with and the trainers' incident period, as compose resolves them."""
    from steplens.stack.compose_check import failover_deadline

    files = [*LOCAL, "-f", "deploy/local/docker-compose.check.yml", "--profile", "trainer"]
    config = {"services": _services(files)}
    base, why = failover_deadline(config)
    assert "session 20 s" in why and "incident period 15 s" in why
    longer = {"services": _services(files, {"STEPLENS_WORKER_SESSION_TIMEOUT_S": "30"})}
    slower, _ = failover_deadline(longer)
    assert slower > base + 10


def test_the_rollup_retention_is_one_value() -> None:
    from steplens.sinks.rollup import ROLLUP_RETENTION_S
    from steplens.stack.config import ROLLUP_RETENTION_S as STACK_ROLLUP_RETENTION_S

    assert ROLLUP_RETENTION_S == STACK_ROLLUP_RETENTION_S == 30 * 86400
    assert "`steplens_rollup` (30 d)" in (ROOT / "docs/stack.md").read_text()
    assert not (ROOT / "deploy/influxdb/init").exists()  # the sink creates the bucket


def test_the_mlflow_mirror_writes_to_the_profiles_server() -> None:
    services = _services()
    mirror = services["mlflow-mirror"]
    assert mirror["command"] == ["steplens", "mlflow"]
    assert mirror["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert mirror["build"]["args"]["SINKS_EXTRAS"] == "[mlflow]"
    assert [p.split(":")[0] for p in services["mlflow"]["ports"]] == ["127.0.0.1"]


@pytest.mark.slow
def test_compose_check() -> None:
    """The whole `make compose-check` (minutes; the first time builds every image)."""
    if os.environ.get("STEPLENS_COMPOSE_CHECK") != "1":
        pytest.skip(
            "the full compose check runs with STEPLENS_COMPOSE_CHECK=1 (or make compose-check)"
        )
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, check=False).returncode
    ):
        pytest.skip("no Docker engine answers here: the compose stack is not run")
    result = subprocess.run(
        [sys.executable, "-m", "steplens.stack.compose_check"], cwd=ROOT, check=False, timeout=3600
    )
    assert result.returncode == 0
