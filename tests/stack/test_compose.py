"""docker-compose.yml is valid for Debian's docker-compose and describes the same stack; the
local override (deploy/local/) builds on it; `make compose-check` runs it for real."""

from __future__ import annotations

import os
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
    "STEPLENS_TLS_KEYSTORE_PASSWORD": "compose-test-keystore-password",
}
TLS_DIR = "/srv/compose-test-tls"  # what deploy/tls/make-certs.sh writes (DIR/server)
ENV = SECRETS | {"STEPLENS_TLS_DIR": TLS_DIR}
LOCAL = ["-f", "docker-compose.yml", "-f", "deploy/local/docker-compose.local.yml"]


def _config(
    extra_env: dict[str, str], files: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if k not in ENV} | extra_env
    return subprocess.run(
        ["docker-compose", *(files or ["-f", "docker-compose.yml"]), "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_config_validates() -> None:
    import yaml

    result = _config(ENV)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
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
    published = {
        p["published"] if isinstance(p, dict) else p
        for s in services.values()
        for p in s.get("ports", [])
    }
    for port in ("19092", "18086", "19000"):
        assert any(port in str(p) for p in published), published
    assert [name for name, svc in services.items() if not svc.get("mem_limit")] == []


def test_compose_influxdb_has_the_local_stacks_memory_limits() -> None:
    import yaml

    from steplens.stack.services.influxdb import CACHE_AND_QUERY_LIMITS

    result = _config(ENV)
    assert result.returncode == 0, result.stderr
    env = yaml.safe_load(result.stdout)["services"]["influxdb"]["environment"]
    for flag, value in CACHE_AND_QUERY_LIMITS:
        assert str(env["INFLUXD_" + flag[2:].upper().replace("-", "_")]) == value, flag
    assert env["GOMEMLIMIT"].endswith("MiB")


def test_compose_refuses_to_run_without_secrets() -> None:
    result = _config({})
    assert result.returncode != 0
    assert "set STEPLENS_" in result.stderr or "set AWS_" in result.stderr


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
    sources = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/steplens.yaml").read_text()
    )
    assert {d["uid"] for d in sources["datasources"]} == {
        "steplens-influxdb",
        "steplens-prometheus",
    }


def test_optional_services_and_the_node_exporters() -> None:
    """Alertmanager and the trainer loops come only with their profiles; the trainers' node
    exporters are what Prometheus's steplens-node job finds by DNS; Alertmanager routes as the
    local stack's does, on 127.0.0.1."""
    import yaml

    from steplens.stack.services.alertmanager import CONFIG

    result = _config(ENV)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    optional = ("alertmanager", "sink-alertmanager", "trainer")
    assert services["alertmanager"]["profiles"] == ["alertmanager"]
    assert services["sink-alertmanager"]["profiles"] == ["alertmanager"]
    assert services["trainer"]["profiles"] == ["trainer"]
    assert services["mlflow"]["profiles"] == services["mlflow-mirror"]["profiles"] == ["mlflow"]
    optional += ("mlflow", "mlflow-mirror")
    assert not [n for n, s in services.items() if n not in optional and s.get("profiles")]
    assert [str(p).split(":")[0] for p in services["alertmanager"]["ports"]] == ["127.0.0.1"]
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


def _services(files: list[str] | None = None, env: dict[str, str] | None = None) -> dict:
    import yaml

    result = _config(ENV | (env or {}), files)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def test_every_service_is_ready_to_deploy() -> None:
    """init, a restart policy and a memory limit everywhere; a healthcheck on every long-running
    service (one-shot jobs are judged by their exit status and are not restarted)."""
    services = _services()
    for name, svc in services.items():
        assert svc.get("init") is True, name
        assert svc.get("mem_limit"), name
        assert svc.get("restart") in ("unless-stopped", "no"), name
        if svc["restart"] == "no":
            assert name in ("topics", "s3-init", "kafka-users"), name
        else:
            assert svc.get("healthcheck", {}).get("test"), name


def test_no_secret_is_written_in_the_compose_files() -> None:
    """Every secret comes from the environment: the files hold no value for a variable whose
    name says token, password, secret or credential, only ${VAR:?...} references."""
    import re

    names = re.compile(r"(TOKEN|PASSWORD|SECRET|CREDENTIAL)[A-Z_]*:\s*(\S.*)$")
    for path in ("docker-compose.yml", "deploy/local/docker-compose.local.yml"):
        for line in (ROOT / path).read_text().splitlines():
            found = names.search(line.split("#")[0])
            if found and not line.strip().startswith("-"):
                value = found.group(2)
                # the filesystem backend's jclouds credential is a required placeholder
                assert value.startswith("${") or value == "local", (path, line)
    services = _services()
    for value in SECRETS.values():
        assert value not in (ROOT / "docker-compose.yml").read_text()
        assert any(value in str(s.get("environment", {})) for s in services.values())


def test_kafka_listeners_beyond_loopback_require_scram_over_tls() -> None:
    """Host clients use an unauthenticated listener published on 127.0.0.1 only; every other
    client the SCRAM one over TLS, advertised under STEPLENS_KAFKA_ADVERTISED_HOST."""
    kafka = _services(env={"STEPLENS_KAFKA_ADVERTISED_HOST": "kafka.example.org"})["kafka"]
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
    # "HOST_IP:HOST_PORT:PORT/tcp" -> {PORT: HOST_IP}
    published = {p.split(":")[-1].split("/")[0]: p.split(":")[0] for p in kafka["ports"]}
    assert published["19092"] == "127.0.0.1"
    assert published["19095"] == "0.0.0.0"
    # the PLAINTEXT listeners are never published beyond loopback
    for name, protocol in protocols.items():
        if protocol == "PLAINTEXT" and name != "LOCAL":
            port = env["KAFKA_LISTENERS"].split(f"{name}://:")[1].split(",")[0]
            assert port not in published, name


def _published(service: dict) -> dict[str, str]:
    """ "HOST_IP:HOST_PORT:PORT/tcp" -> {PORT: HOST_IP}"""
    return {p.split(":")[-1].split("/")[0]: p.split(":")[0] for p in service["ports"]}


def test_influxdb_and_s3_speak_tls_beyond_loopback() -> None:
    """InfluxDB serves https only (one listener), on every interface by default; S3 serves
    plain HTTP on loopback and https on every interface; the certificate, key and CA come from
    STEPLENS_TLS_DIR, mounted read-only, and the services of the file verify InfluxDB with the
    CA."""
    services = _services()
    influx, s3 = services["influxdb"], services["s3"]
    assert influx["environment"]["INFLUXD_TLS_CERT"] == "/etc/steplens/tls/server.crt"
    assert influx["environment"]["INFLUXD_TLS_KEY"] == "/etc/steplens/tls/server.key"
    assert _published(influx) == {"8086": "0.0.0.0"}
    assert s3["environment"]["S3PROXY_SECURE_ENDPOINT"] == "https://0.0.0.0:443"
    assert s3["environment"]["S3PROXY_KEYSTORE_PATH"] == "/etc/steplens/tls/server.p12"
    assert _published(s3) == {"80": "127.0.0.1", "443": "0.0.0.0"}
    assert "19443" in str(s3["ports"])
    local = _services(
        env={"STEPLENS_INFLUX_BIND": "127.0.0.1", "STEPLENS_S3_TLS_BIND": "127.0.0.1"}
    )
    assert set(_published(local["influxdb"]).values()) == {"127.0.0.1"}
    assert set(_published(local["s3"]).values()) == {"127.0.0.1"}
    mounted = {
        name
        for name, svc in services.items()
        if f"{TLS_DIR}:/etc/steplens/tls:ro" in [str(v) for v in svc.get("volumes", [])]
    }
    assert {"kafka", "influxdb", "s3", "worker", "sink-influx", "sink-s3", "grafana"} <= mounted
    for name in ("worker", "sink-influx", "sink-s3"):
        env = services[name]["environment"]
        assert env["STEPLENS_INFLUX_URL"] == "https://influxdb:8086"
        assert env["STEPLENS_INFLUX_CA_CERT"] == "/etc/steplens/tls/ca.crt"
    missing = _config(SECRETS)
    assert missing.returncode != 0 and "STEPLENS_TLS_DIR" in missing.stderr
    nopass = _config({k: v for k, v in ENV.items() if k != "STEPLENS_TLS_KEYSTORE_PASSWORD"})
    assert nopass.returncode != 0 and "STEPLENS_TLS_KEYSTORE_PASSWORD" in nopass.stderr


def test_the_local_override_builds_on_the_same_versions() -> None:
    """deploy/local's images stand in for the official ones at the versions the local stack
    runs, and only Grafana has none."""
    from steplens.stack.compose_check import LEFT_OUT, PROMETHEUS_VERSION
    from steplens.stack.config import INFLUXDB_VERSION, KAFKA_VERSION, S3PROXY_VERSION

    services = _services(LOCAL)
    assert services["kafka"]["image"] == f"steplens-local/kafka:{KAFKA_VERSION}"
    assert services["s3"]["image"] == f"steplens-local/s3proxy:{S3PROXY_VERSION}"
    assert services["influxdb"]["image"] == f"steplens-local/influxdb:{INFLUXDB_VERSION}"
    assert services["prometheus"]["image"] == f"steplens-local/prometheus:{PROMETHEUS_VERSION}"
    official = [n for n, s in services.items() if "/" in s["image"] and "local" not in s["image"]]
    assert sorted(official) == sorted([*LEFT_OUT, "alertmanager", "mlflow"])
    script = (ROOT / "deploy/local/build-images.sh").read_text()
    assert "ca-certificates" not in (ROOT / "deploy/Dockerfile").read_text()
    assert "STEPLENS_BUILD_CA_DIR" in script


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
