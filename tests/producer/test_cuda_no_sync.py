"""On a CUDA machine: the producer causes no host sync, and NVML reads the real GPU.
Skipped without CUDA."""

from __future__ import annotations

import pytest
from tests.waiting import wait_until

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_steps_with_cuda_tensors_never_sync(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    m.watch(model, opt, every=1)
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 1, device="cuda")
    for _ in range(3):  # warm-up outside the debug mode (allocator, cuBLAS handles)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(3, 20):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            m.log_step(step, loss=loss, grad_norm=gn, lr=1e-3, tokens=32, aux=loss * 2)
            m.log_eval(step, loss=loss)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    assert set(range(3, 20)) <= set(steps)
    d = steps[19]
    assert d["loss"] > 0 and d["scalars"]["aux"] == pytest.approx(2 * d["loss"], rel=1e-5)
    assert "grad_norm_preclip" in d and "update_ratio" in d and "param_norm" in d
    assert d["layer_grad_norms"].keys() == d["layer_param_norms"].keys() == {"0", "2"}
    assert d["lr"] == 1e-3
    assert m.stats()["caller_errors"] == 0


def test_nvml_on_a_real_gpu() -> None:
    pytest.importorskip("pynvml")
    from steplens.producer.instruments.gpu_stats import GpuSampler

    s = GpuSampler()
    assert s.start() == "ok"
    gpus = s.sample(slow=True)
    assert len(gpus) == torch.cuda.device_count()
    g = gpus[0]
    assert g["mem_total_bytes"] > g["mem_used_bytes"] > 0
    assert 0 <= g["util_gpu"] <= 100 and g["temp_c"] > 0 and g["power_w"] > 0
    s.close()


def test_the_readme_loop_at_the_defaults_never_syncs(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """The README's snippet on the GPU at the producer's defaults (windows, 1 % raw):
    watch(every=10), timed() over dict batches on the device, the loss and the norm
    clip_grad_norm_ returns given as CUDA tensors: no host sync, the norm in every step's
    window aggregate, watch()'s heavier norms every 10th step."""
    m, tx = memory_monitor()
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.Linear(32, 100)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m.watch(model, opt, sched, every=10, max_grad_norm=1.0)
    batches = [{"input_ids": torch.randint(0, 100, (8, 16), device="cuda")} for _ in range(40)]

    def train_step(batch):  # type: ignore[no-untyped-def]
        ids = batch["input_ids"]
        logits = model(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 100), ids[:, 1:].reshape(-1))

    for batch in batches[:3]:  # warm-up outside the debug mode (allocator, cuBLAS handles)
        train_step(batch).backward()
        opt.zero_grad()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step, batch in enumerate(m.timed(batches)):
            loss = train_step(batch)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            sched.step()
            opt.zero_grad()
            m.log_step(step, loss=loss, grad_norm=grad_norm, tokens=batch["input_ids"].numel())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    m.shutdown()
    (window,) = tx.records("step_window")
    stats = window.data["metrics"]
    assert stats["grad_norm"]["count"] == 40 and stats["loss"]["count"] == 40
    assert stats["grad_norm_preclip"]["count"] == 4
    assert len(tx.records("batch")) == 40
    assert m.stats()["caller_errors"] == 0


def test_remedies_on_the_gpu_never_sync_in_the_loop(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """With every remedy on: skipping() over device batches (named hashes cannot be read
    there: passed through and counted), act() each step, and lowering the lr of a CUDA
    optimizer: no host sync."""
    import time as _time

    from steplens.schema import RUN_RANK, encode, make_record

    m, tx = memory_monitor(remedies=["skip_samples", "rewind", "lower_lr", "profile"])
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.Linear(32, 100)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m.watch(model, opt, sched, every=10)
    batches = [{"input_ids": torch.randint(0, 100, (8, 16), device="cuda")} for _ in range(30)]
    loader = m.skipping(batches)
    m.remedies.skips.add(hashes=["0123456789abcdef"])
    rec = make_record(
        "advice",
        {"action": "lower_lr", "fingerprint": "f", "lr_factor": 0.5},
        run_id=m.run_id,
        rank=RUN_RANK,
        time_ns=_time.time_ns(),
    )
    tx.advise(encode(rec), key=m.run_id.encode())
    assert wait_until(lambda: m.stats()["advice_received"] == 1, timeout_s=10)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step, batch in enumerate(loader):
            ids = batch["input_ids"]
            logits = model[1](model[0](ids[:, :-1]))
            targets = ids[:, 1:].reshape(-1)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 100), targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            m.log_step(step, loss=loss)
            m.act(step)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    m.flush(5)
    assert loader.unreadable == 30
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-4)
    assert [r.data["outcome"] for r in tx.records("acted")] == ["acted"]
    assert m.stats()["caller_errors"] == 0
