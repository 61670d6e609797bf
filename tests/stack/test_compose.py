"""docker-compose.yml is valid for Debian's docker-compose and describes the same stack."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "STEPLENS_INFLUX_TOKEN": "compose-test-token",
    "STEPLENS_INFLUX_PASSWORD": "compose-test-password",
    "AWS_ACCESS_KEY_ID": "compose-test-key",
    "AWS_SECRET_ACCESS_KEY": "compose-test-secret",
}


def _config(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if k not in SECRETS} | extra_env
    return subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_config_validates() -> None:
    import yaml

    result = _config(SECRETS)
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

    result = _config(SECRETS)
    assert result.returncode == 0, result.stderr
    env = yaml.safe_load(result.stdout)["services"]["influxdb"]["environment"]
    for flag, value in CACHE_AND_QUERY_LIMITS:
        assert str(env["INFLUXD_" + flag[2:].upper().replace("-", "_")]) == value, flag
    assert env["GOMEMLIMIT"].endswith("MiB")


def test_compose_refuses_to_run_without_secrets() -> None:
    result = _config({})
    assert result.returncode != 0
    assert "STEPLENS_INFLUX_TOKEN" in result.stderr or "AWS_" in result.stderr


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

    result = _config(SECRETS)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    optional = ("alertmanager", "sink-alertmanager", "trainer")
    assert services["alertmanager"]["profiles"] == ["alertmanager"]
    assert services["sink-alertmanager"]["profiles"] == ["alertmanager"]
    assert services["trainer"]["profiles"] == ["trainer"]
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
