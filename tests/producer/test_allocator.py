"""The PyTorch allocator's figures in the ``hw`` GPU entries: merged into NVML's entry of the
same GPU, read only once the training code initialised CUDA, sent by every rank."""

from __future__ import annotations

import time

import pytest

from steplens.producer.instruments.allocator import AllocatorReader, merge
from steplens.producer.instruments.hardware import HardwareSampler
from steplens.producer.instruments.report_cadence import allocator_cadence
from waiting import wait_until

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_allocator_entries_join_nvml_entries_by_uuid_else_index() -> None:
    nvml = [
        {"index": 0, "uuid": "GPU-a", "mem_used_bytes": 10},
        {"index": 1, "uuid": "GPU-b", "mem_used_bytes": 20},
    ]
    own = [
        {"index": 0, "uuid": "GPU-b", "torch_allocated_bytes": 5},  # a reordered device
        {"index": 3, "torch_allocated_bytes": 7},  # not listed by NVML
    ]
    got = merge(nvml, own)
    assert got[1] == {
        "index": 1,
        "uuid": "GPU-b",
        "mem_used_bytes": 20,
        "torch_allocated_bytes": 5,
    }
    assert "torch_allocated_bytes" not in got[0]
    assert got[2] == {"index": 3, "torch_allocated_bytes": 7}
    assert merge([{"index": 2}], [{"index": 2, "torch_ooms": 1}]) == [{"index": 2, "torch_ooms": 1}]


def test_a_rank_sends_its_allocator_every_few_seconds_and_at_once_when_it_retried() -> None:
    """Read every second: sent at the first read, then every 5 s, and at once when the
    allocator retried or failed, or the devices changed (the next heartbeat counts from
    there); every second at 0."""

    def gpus(retries: int = 0, ooms: int = 0, index: int = 0) -> dict[str, list[dict[str, int]]]:
        return {"gpus": [{"index": index, "torch_alloc_retries": retries, "torch_ooms": ooms}]}

    reads = {t: gpus(int(t >= 7), int(t >= 14), int(t >= 26)) for t in range(30)}
    cadence = allocator_cadence(5.0)
    sent = [t for t in range(30) if cadence.due(reads[t], float(t))]
    assert sent == [0, 5, 7, 12, 14, 19, 24, 26]
    every = allocator_cadence(0.0)
    assert all(every.due(reads[t], float(t)) for t in range(30))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is in use here")
def test_nothing_is_read_and_no_cuda_context_made_before_the_training_code_uses_cuda() -> None:
    reader = AllocatorReader()
    assert reader.read() == [] and reader.errors == 0
    assert not torch.cuda.is_initialized()
    sampler = HardwareSampler(lambda d: None, host_wide=False)
    assert sampler.sample_once() == {}  # another rank: nothing to send


def test_other_ranks_send_no_hw_record_without_allocator_figures(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """Local rank 1 runs the sampler for its allocator only: on a process without CUDA in
    use it sends nothing (NVML and the host are local rank 0's)."""
    m, tx = memory_monitor(hw_interval_s=0.05, local_rank=1, rank=1, world_size=2)
    assert m._hw is not None and not m._hw.host_wide
    assert wait_until(lambda: m._hw.samples >= 2)
    m.shutdown()
    assert all(r.data.get("gpus") for r in tx.records("hw"))
    if not torch.cuda.is_available():
        assert tx.records("hw") == []


@cuda
def test_allocator_figures_on_a_real_gpu_read_without_a_host_sync(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """Sync debug mode "error" holds for every thread: the sampler's reads raise on a sync
    (caught and counted in ``allocator.errors``); they count none, and the figures follow a
    tensor kept across steps."""
    m, tx = memory_monitor(
        hw_interval_s=0.05, hw_allocator_every_s=0.0, local_rank=1, rank=1, world_size=2
    )
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    kept = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            kept.append(x * 2)  # 4 MiB more each time
            time.sleep(0.02)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    m.shutdown()
    assert m._hw.allocator.errors == 0
    entries = [g for r in tx.records("hw") for g in r.data["gpus"]]
    assert entries, "no allocator figures"
    last = entries[-1]
    assert last["torch_reserved_bytes"] >= last["torch_allocated_bytes"] >= 4 << 20
    assert last["torch_limit_bytes"] >= last["torch_reserved_bytes"]
    assert last["torch_peak_bytes"] >= last["torch_allocated_bytes"]
    assert last["uuid"].startswith(("GPU-", "MIG-"))
    rising = [e["torch_allocated_bytes"] for e in entries]
    assert rising[-1] > rising[0]
