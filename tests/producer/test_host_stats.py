"""Parsers of /proc files on captured samples, and the sampler on this machine's /proc."""

from __future__ import annotations

import time

import pytest

from steplens.producer.instruments.host_stats import (
    HostSampler,
    disk_rates,
    net_rates,
    parse_cpu_times,
    parse_diskstats,
    parse_meminfo,
    parse_net_dev,
    parse_statm_rss,
    process_memory,
)

DISKSTATS_T0 = """\
   7       0 loop0 10 0 80 5 0 0 0 0 0 4 5 0 0 0 0
 259       0 nvme0n1 1000 0 8000 500 2000 0 16000 1500 0 900 2000 0 0 0 0
 259       1 nvme0n1p1 900 0 7000 450 1900 0 15000 1400 0 800 1850 0 0 0 0
   8       0 sda 100 0 800 100 0 0 0 0 0 50 100 0 0 0 0
   8       1 sda1 90 0 700 90 0 0 0 0 0 40 90 0 0 0 0
"""
DISKSTATS_T1 = """\
   7       0 loop0 10 0 80 5 0 0 0 0 0 4 5 0 0 0 0
 259       0 nvme0n1 1100 0 10048 600 2100 0 20096 1700 0 950 2300 0 0 0 0
 259       1 nvme0n1p1 990 0 9000 540 1990 0 19000 1580 0 850 2120 0 0 0 0
   8       0 sda 100 0 800 100 0 0 0 0 0 50 100 0 0 0 0
   8       1 sda1 90 0 700 90 0 0 0 0 0 40 90 0 0 0 0
"""


def test_diskstats_whole_devices_and_rates() -> None:
    t0, t1 = parse_diskstats(DISKSTATS_T0), parse_diskstats(DISKSTATS_T1)
    assert set(t0) == {"nvme0n1", "sda"}
    rates = {r["device"]: r for r in disk_rates(t0, t1, dt_s=2.0)}
    nv = rates["nvme0n1"]
    assert nv["read_mb_s"] == pytest.approx(2048 * 512 / 1e6 / 2)
    assert nv["write_mb_s"] == pytest.approx(4096 * 512 / 1e6 / 2)
    assert nv["io_latency_ms"] == pytest.approx((100 + 200) / (100 + 100))
    assert rates["sda"]["io_latency_ms"] == 0.0


NET_HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast"
    "|bytes    packets errs drop fifo colls carrier compressed\n"
)
NET_T0 = (
    NET_HEADER
    + """\
    lo: 5000 10 0 0 0 0 0 0 5000 10 0 0 0 0 0 0
  eth0: 1000000 100 0 0 0 0 0 0 2000000 100 0 0 0 0 0 0
"""
)
NET_T1 = NET_T0.replace("1000000 100", "4000000 100").replace("2000000 100", "2500000 100")


def test_net_dev_rates_without_loopback() -> None:
    rates = net_rates(parse_net_dev(NET_T0), parse_net_dev(NET_T1), dt_s=1.0)
    assert rates == [{"iface": "eth0", "rx_mb_s": 3.0, "tx_mb_s": 0.5}]


def test_meminfo_and_cpu() -> None:
    mem = "MemTotal:       16000000 kB\nMemFree: 1 kB\nMemAvailable:    8000000 kB\n"
    assert parse_meminfo(mem) == (8000000 * 1024, 16000000 * 1024)
    busy, total = parse_cpu_times("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 1 1 1\n")
    assert (busy, total) == (150, 1000)


def test_sampler_on_this_host() -> None:
    s = HostSampler()
    s.sample(time.monotonic())
    time.sleep(0.2)
    out = s.sample(time.monotonic())
    assert out["mem_total_bytes"] > out["mem_available_bytes"] > 0
    assert 0.0 <= out["cpu_percent"] <= 100.0
    assert isinstance(out["disks"], list) and isinstance(out["nets"], list)


def test_statm_and_this_process_memory() -> None:
    assert parse_statm_rss("123456 2000 300 10 0 5000 0\n", 4096) == 2000 * 4096
    assert parse_statm_rss("", 4096) == 0
    before = process_memory()
    assert before["mem_total_bytes"] > before["mem_available_bytes"] > 0
    kept = bytearray(b"\x01") * (64 << 20)  # 64 MiB touched: resident
    after = process_memory()
    assert after["rss_bytes"] - before["rss_bytes"] > 32 << 20
    del kept
