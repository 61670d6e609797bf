"""The node exporter scraped over HTTP: DCGM exporter and node_exporter names from the samples
the hardware sampler already takes (GPUs on a stand-in for NVML, the host from captured /proc
files), no NVML call per scrape, opt-in on local rank 0, never in training's way."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")
pynvml = pytest.importorskip("pynvml")

from fake_nvml import FakeGpmDevices  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from steplens.producer.export.node_exporter import start_exporter  # noqa: E402
from steplens.producer.instruments.gpu_stats import GpuSampler  # noqa: E402
from steplens.producer.instruments.hardware import HardwareSampler  # noqa: E402
from steplens.producer.instruments.host_stats import HostSampler  # noqa: E402

DISKSTATS = (
    "   8       0 sda {reads} 0 {rsect} 400 {writes} 0 {wsect} 900 0 0 0 0 0 0 0 0 0\n"
    "   8       1 sda1 5 0 40 4 2 0 16 9 0 0 0 0 0 0 0 0 0\n"
)
NET_DEV = (
    "Inter-|   Receive                            |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets\n"
    "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
    "  ib0: {rx} 10 0 0 0 0 0 0 {tx} 20 0 0 0 0 0 0\n"
)


class CountingNvml(FakeGpmDevices):
    """Counts every NVML call the sampler makes."""

    def __init__(self) -> None:
        super().__init__(rates=[0.5] * 100_000)
        self.calls = 0

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            object.__setattr__(self, "calls", object.__getattribute__(self, "calls") + 1)
        return object.__getattribute__(self, name)


class BusyHost(HostSampler):
    """A host whose CPU is half busy between any two samples."""

    ticks = 0

    def sample(self, now: float) -> dict[str, Any]:
        self.ticks += 50
        Path(self.proc, "stat").write_text(f"cpu  {self.ticks} 0 0 {self.ticks} 0 0 0 0 0 0\n")
        return super().sample(now)


def _proc(root: Path, i: int) -> str:
    """/proc files of a host whose disk and network counters grow with ``i``."""
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "diskstats").write_text(
        DISKSTATS.format(reads=100 + i, rsect=8000 + 800 * i, writes=50 + i, wsect=4000 + 80 * i)
    )
    (root / "net" / "dev").write_text(NET_DEV.format(rx=10_000 + 1000 * i, tx=5_000 + 10 * i))
    (root / "meminfo").write_text("MemTotal: 2048 kB\nMemAvailable: 1024 kB\n")
    return str(root)


def _scrape(port: int) -> dict[str, list[Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(samples: list[Any], name: str | None = None, **labels: str) -> float:
    found = [
        s.value
        for s in samples
        if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (labels, samples)
    return float(found[0])


def _wait(cond: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.02)
    return cond()


@pytest.fixture
def node(tmp_path: Path) -> Any:
    nvml = CountingNvml()
    proc = tmp_path / "proc"
    _proc(proc, 0)
    sent: list[dict[str, Any]] = []
    sampler = HardwareSampler(sent.append, 0.02, 1, gpu=GpuSampler(nvml), host=BusyHost(str(proc)))
    exporter = start_exporter(sampler, "run-x", "node-a", "127.0.0.1", 0)
    assert exporter.wait_started()
    sampler.start()
    yield sampler, exporter, nvml, proc, sent
    sampler.stop()
    exporter.stop()


def test_scrape_serves_dcgm_and_node_exporter_names(node) -> None:
    _, exporter, _, proc, sent = node
    _proc(proc, 1)
    assert _wait(lambda: len(sent) >= 3)  # GPM has a bandwidth from the second sample on
    m = _scrape(exporter.port)
    g0 = {"gpu": "0", "UUID": "GPU-0", "device": "nvidia0", "Hostname": "node-a"}
    g1 = {"gpu": "1", "UUID": "GPU-1", "Hostname": "node-a"}
    assert _value(m["DCGM_FI_DEV_GPU_UTIL"], **g0) == 97.0
    assert _value(m["DCGM_FI_DEV_GPU_UTIL"], modelName="NVIDIA H200", gpu="1") == 97.0
    assert _value(m["DCGM_FI_DEV_FB_USED"], **g0) == 10 * 1024  # MiB, as DCGM
    assert _value(m["DCGM_FI_DEV_FB_FREE"], **g1) == (141 - 11) * 1024
    assert _value(m["DCGM_FI_DEV_POWER_USAGE"], **g0) == 650.5
    assert _value(m["DCGM_FI_DEV_GPU_TEMP"], **g0) == 71.0
    assert _value(m["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"], **g0) == 3.0
    assert [s.labels["gpu"] for s in m["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]] == ["0"]  # GPU 1: none
    # the last XID code (DCGM's metric) and every XID counted (steplens's)
    assert (
        _value(m["DCGM_FI_DEV_XID_ERRORS"], **g0),
        _value(m["DCGM_FI_DEV_XID_ERRORS"], **g1),
    ) == (
        31.0,
        48.0,
    )
    assert _value(m["steplens_gpu_xid_errors"], "steplens_gpu_xid_errors_total", **g0) == 2.0
    # slow fields (every slow_every-th sample; here every one) at their units
    assert _value(m["DCGM_FI_PROF_PCIE_TX_BYTES"], **g0) == 2e9
    assert _value(m["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"], **g0) == pytest.approx(123_456_789)
    # memory bandwidth with its source: GPM on GPU 0, the utilisation counter on GPU 1
    bw = m["steplens_gpu_mem_bw_util_percent"]
    assert _value(bw, source="gpm", **g0) == pytest.approx(50.0)
    assert _value(bw, source="util", **g1) == 40.0
    assert _value(m["DCGM_FI_PROF_DRAM_ACTIVE"], **g0) == pytest.approx(0.5)
    assert [s.labels["gpu"] for s in m["DCGM_FI_PROF_DRAM_ACTIVE"]] == ["0"]
    # the host, as node_exporter names it: cumulative counters, labelled by device
    assert _value(m["node_memory_MemAvailable_bytes"]) > 0
    assert _value(m["node_disk_read_bytes"], device="sda") == (8000 + 800) * 512
    assert _value(m["node_disk_written_bytes"], device="sda") == (4000 + 80) * 512
    assert [s.labels["device"] for s in m["node_disk_read_bytes"]] == ["sda"]  # no partitions
    assert _value(m["node_network_receive_bytes"], device="ib0") == 11_000
    assert _value(m["node_network_transmit_bytes"], "node_network_transmit_bytes_total") == 5_010
    assert [s.labels["device"] for s in m["node_network_receive_bytes"]] == ["ib0"]  # no lo
    assert _value(m["steplens_node_cpu_busy_ratio"]) == pytest.approx(0.5)
    assert _value(m["steplens_node_info"], run_id="run-x", gpu_status="ok") == 1.0
    age = time.time() - _value(m["steplens_node_sample_timestamp_seconds"])
    assert 0 <= age < 5


def test_a_scrape_reads_the_newest_sample_and_calls_no_nvml(node) -> None:
    sampler, exporter, nvml, _, sent = node
    assert _wait(lambda: len(sent) >= 2)
    sampler.stop(timeout_s=30)  # joins the sampler: a sample in flight when stop was asked ends
    calls = nvml.calls
    first = _scrape(exporter.port)
    for _ in range(20):
        assert _scrape(exporter.port) == first
    assert nvml.calls == calls
    # the sample the scrapes show is the newest one the sampler sent
    newest = sent[-1]["gpus"][0]["mem_used_bytes"] / (1 << 20)
    assert _value(first["DCGM_FI_DEV_FB_USED"], gpu="0") == newest


def test_before_the_first_sample_only_the_info_metric(tmp_path: Path) -> None:
    sampler = HardwareSampler(lambda _: None, 60.0, gpu=GpuSampler(CountingNvml()))
    exporter = start_exporter(sampler, "run-y", "node-b", "127.0.0.1", 0)
    assert exporter.wait_started()
    try:
        m = _scrape(exporter.port)
        assert set(m) == {"steplens_node_info"}
        assert _value(m["steplens_node_info"], gpu_status="no_sample") == 1.0
    finally:
        exporter.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_monitor_serves_on_local_rank_0_when_asked(monkeypatch) -> None:
    import steplens.producer as sl

    port = _free_port()
    monkeypatch.setenv("STEPLENS_EXPORTER_PORT", str(port))
    other = sl.Monitor(
        "exp-run", transport=sl.MemoryTransport(), local_rank=1, rank=1, hw_interval_s=0.05
    )
    assert other._exporter is None  # only local rank 0 samples the node
    other.shutdown()
    m = sl.Monitor("exp-run", transport=sl.MemoryTransport(), local_rank=0, hw_interval_s=0.05)
    try:
        assert m._exporter.wait_started()
        assert m._exporter.host == "127.0.0.1" and m._exporter.port == port
        m.log_step(1, loss=2.0)  # training goes on beside it
        scraped = _wait(lambda: "node_memory_MemTotal_bytes" in _scrape(port) and _scrape(port))
        assert _value(scraped["steplens_node_info"], run_id="exp-run") == 1.0
    finally:
        m.shutdown()
    assert _wait(lambda: not _port_taken(port)), "the port stays taken after shutdown"


def test_off_by_default_and_a_taken_port_never_stops_training(monkeypatch, caplog) -> None:
    import steplens.producer as sl

    monkeypatch.delenv("STEPLENS_EXPORTER_PORT", raising=False)
    m = sl.Monitor("exp-off", transport=sl.MemoryTransport(), hw_interval_s=0.05)
    assert m.config.exporter_port == 0 and m._exporter is None
    m.shutdown()
    with pytest.raises(ValueError, match="exporter_port"):
        sl.Monitor("exp-bad", transport=sl.MemoryTransport(), exporter_port=70_000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        tx = sl.MemoryTransport()
        m = sl.Monitor("exp-taken", transport=tx, hw_interval_s=0.05, exporter_port=taken)
        assert not m._exporter.wait_started()
        for step in range(5):
            m.log_step(step, loss=1.0)
        assert m.flush(10)
        m.shutdown()
    assert "node exporter not started" in caplog.text
    assert len(tx.records("step_window")) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_keep_the_port(tmp_path: Path) -> None:
    """A DataLoader worker forked from rank 0 must not hold the exporter's socket: the port is
    free once the rank shuts down, whatever its children do."""
    import steplens.producer as sl

    port = _free_port()
    m = sl.Monitor("exp-fork", transport=sl.MemoryTransport(), exporter_port=port)
    assert m._exporter.wait_started()
    gate = tmp_path / "gate"
    pid = os.fork()
    if pid == 0:  # the child lives on until the parent has checked the port
        ok = m._exporter is None
        deadline = time.monotonic() + 20
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if ok else 1)
    try:
        m.shutdown()
        assert _wait(lambda: not _port_taken(port)), "the child holds the port"
    finally:
        gate.touch()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_without_prometheus_client_it_says_what_to_install(monkeypatch, caplog) -> None:
    import sys

    from steplens.producer.export.node_exporter import NodeCollector, NodeExporter

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    exporter = NodeExporter(NodeCollector("r", "h"), "127.0.0.1", 0)
    exporter.start()
    assert not exporter.wait_started()
    assert "steplens-producer[exporter]" in caplog.text


def test_the_compose_trainer_serves_its_node_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``producer/examples/synthetic_node.py``, as compose's ``trainer`` runs it: its node
    exporter answers while it steps, and SIGTERM (docker stop) ends it cleanly."""
    import json
    import signal
    import subprocess
    import sys

    script = Path(__file__).parents[2] / "producer" / "examples" / "synthetic_node.py"
    port = _free_port()
    env = {
        **os.environ,
        "STEPLENS_EXPORTER_PORT": str(port),
        "STEPLENS_HW_INTERVAL_S": "0.1",
        "STEPLENS_KAFKA_BOOTSTRAP": f"127.0.0.1:{_free_port()}",  # no Kafka: the spool
        "STEPLENS_SPOOL_DIR": str(tmp_path / "spool"),
        "STEPLENS_DELIVERY_TIMEOUT_S": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), "--step-s", "0.01", "--run-id", "compose-trainer"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        scraped = _wait(lambda: _try_scrape(port), 60)
        assert scraped and "node_memory_MemTotal_bytes" in scraped
        assert _value(scraped["steplens_node_info"], run_id="compose-trainer") == 1.0
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["caller_errors"] == 0


def _try_scrape(port: int) -> dict[str, list[Any]] | None:
    try:
        scraped = _scrape(port)
    except OSError:
        return None
    return scraped if "node_memory_MemTotal_bytes" in scraped else None
