"""The run's own gradient all-reduce timed through a DDP communication hook: two real gloo
ranks, a comm record per timed step, the same training as without the hook."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from steplens.producer.instruments.ddp_comm import bucket_times

pytest.importorskip("torch")
HERE = Path(__file__).parent


def test_a_bucket_is_timed_from_its_hand_over_or_the_previous_completion() -> None:
    # bucket 1 handed over at 2 while bucket 0 ran until 5: it ran from 5 to 9
    assert bucket_times([0.0, 2.0, 10.0], [5.0, 9.0, 12.0]) == [5.0, 4.0, 2.0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_gloo_ranks_send_their_all_reduce_latency_and_train_as_without(tmp_path) -> None:
    steps, every, world = 30, 5, 2
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "STEPLENS_RUN_ID": "ddp-comm",
            "GLOO_SOCKET_IFNAME": "lo",
        }
        cmd = [sys.executable, str(HERE / "ddp_worker.py"), str(steps), str(every), str(tmp_path)]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    got = {}
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        r = json.loads(out.strip().splitlines()[-1])
        got[r["rank"]] = r
    for r in got.values():
        assert r["flushed"] and r["errors"] == 0
        comm = r["comm"]
        assert len(comm) == steps // every  # one record per timed step
        assert {c["op"] for c in comm} == {"ddp_all_reduce"}
        assert all(c["backend"] == "gloo" and 0 < c["latency_ms"] < 5000 for c in comm)
        # buckets of about 0.02 MB: one 64x64 layer and its bias (16,640 bytes)
        assert all(10_000 <= c["bytes"] <= 40_000 for c in comm)
        assert r["diff"] <= 1e-6  # the default all-reduce's sum and mean
    assert got[0]["checksum"] == pytest.approx(got[1]["checksum"], rel=1e-9)


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA device (NCCL)"
)
def test_on_nccl_the_hook_times_with_events_and_never_syncs(tmp_path) -> None:
    """One NCCL rank: every bucket's marks are CUDA events, the record waits in ``pending``
    until they completed, and sync debug mode "error" sees no host sync in the steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from steplens.producer.instruments.ddp_comm import DdpCommTimer

    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        net = DDP(
            torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4))).cuda(),
            bucket_cap_mb=0.3,
        )
        got = []
        timer = DdpCommTimer(lambda step, data, pending: got.append((data, pending)), every=2)
        timer.attach(net)
        x = torch.randn(64, 256, device="cuda")
        for _ in range(2):  # warm-up (DDP rebuilds its buckets after the first step)
            net(x).pow(2).mean().backward()
        torch.cuda.synchronize()
        got.clear()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(4):
                net(x).pow(2).mean().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        assert timer.errors == 0 and len(got) == 2
        for data, pending in got:
            assert pending is not None and pending.ready()
            out = pending.resolve(data)
            assert out["op"] == "ddp_all_reduce" and out["backend"] == "nccl"
            assert 0 <= out["latency_ms"] < 1000 and out["bytes"] > 0
    finally:
        dist.destroy_process_group()
