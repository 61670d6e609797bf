"""NVML parsing with the real pynvml structures behind a stand-in device API (no GPU here),
and the "no NVML" path of this machine."""

from __future__ import annotations

from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

from fake_nvml import FakeDevices, FakeGpmDevices  # noqa: E402

from steplens.producer.instruments.gpu_stats import GpuSampler  # noqa: E402


def test_parses_every_field_and_counts_every_xid() -> None:
    s = GpuSampler(FakeDevices())
    assert s.start() == "ok"
    fast = s.sample(slow=False)
    g0, g1 = fast
    assert g0["uuid"] == "GPU-0" and g0["name"] == "NVIDIA H200"
    assert g0["mem_used_bytes"] == 10 << 30 and g0["mem_total_bytes"] == 141 << 30
    assert (g0["util_gpu"], g0["util_mem"], g0["power_w"]) == (97.0, 40.0, 650.5)
    assert (g0["temp_c"], g0["sm_clock_mhz"], g0["throttle_reasons"]) == (71.0, 1980.0, 4)
    assert (g0["ecc_corrected"], g0["ecc_uncorrected"]) == (3, 0)
    assert "ecc_corrected" not in g1 and s.errors == 0  # NotSupported is absence, not an error
    assert (g0["xid_count"], g0["xid_last"], g1["xid_count"], g1["xid_last"]) == (2, 31, 1, 48)
    assert "pcie_tx_mb_s" not in g0
    # this stand-in has no GPM (an older nvidia-ml-py): the coarse counter, said so
    assert (g0["mem_bw_util"], g0["mem_bw_source"]) == (40.0, "util")
    slow = s.sample(slow=True)[0]
    assert (slow["pcie_tx_mb_s"], slow["pcie_rx_mb_s"]) == (2000.0, 500.0)
    assert slow["energy_j"] == pytest.approx(123456.789)
    s.close()


def test_no_gpu_here_says_so_and_carries_on() -> None:
    s = GpuSampler()
    status = s.start()
    if status == "ok":
        pytest.skip("this machine has a GPU")
    assert s.sample() == []


def _bandwidth(sampler: GpuSampler) -> list[tuple[Any, Any]]:
    return [(g.get("mem_bw_util"), g.get("mem_bw_source")) for g in sampler.sample()]


def test_dram_bandwidth_from_gpm_where_supported_else_the_utilisation_counter() -> None:
    nvml = FakeGpmDevices(rates=[0.625, 0.25, 0.9])
    s = GpuSampler(nvml)
    assert s.start() == "ok"
    # GPM measures between two samples: the first only takes the starting one
    assert _bandwidth(s) == [(None, None), (40.0, "util")]
    assert _bandwidth(s) == [(62.5, "gpm"), (40.0, "util")]
    assert _bandwidth(s) == [(25.0, "gpm"), (40.0, "util")]  # each interval on its own
    g0 = s.sample()[0]
    assert g0["mem_bw_util"] == pytest.approx(90.0) and g0["util_mem"] == 40.0
    assert s.errors == 0
    s.close()
    assert len(nvml.allocated) == 2 and nvml.freed == nvml.allocated


def test_gpm_that_keeps_failing_falls_back_to_the_utilisation_counter() -> None:
    nvml = FakeGpmDevices(rates=[0.5] * 10, fail_metrics=3)
    s = GpuSampler(nvml)
    assert s.start() == "ok"
    assert _bandwidth(s)[0] == (None, None)  # first sample
    assert _bandwidth(s)[0] == (None, None)  # failed: left out, counted
    assert s.errors == 1
    _bandwidth(s)  # re-primes after a failure
    assert _bandwidth(s)[0] == (None, None)  # second failure
    _bandwidth(s)
    assert _bandwidth(s)[0] == (40.0, "util")  # third in a row: the counter from now on
    assert s.errors == 3 and nvml.freed == nvml.allocated
    assert _bandwidth(s)[0] == (40.0, "util")
    s.close()
