"""On a CUDA machine: the producer causes no host sync, and NVML reads the real GPU.
Skipped without CUDA."""

from __future__ import annotations

import pytest

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
    from steplens.producer.gpu_stats import GpuSampler

    s = GpuSampler()
    assert s.start() == "ok"
    gpus = s.sample(slow=True)
    assert len(gpus) == torch.cuda.device_count()
    g = gpus[0]
    assert g["mem_total_bytes"] > g["mem_used_bytes"] > 0
    assert 0 <= g["util_gpu"] <= 100 and g["temp_c"] > 0 and g["power_w"] > 0
    s.close()
