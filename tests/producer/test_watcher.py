"""watch(): pre-clip gradient norm, clipping, parameter norm, update ratio, group lrs."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")


def _train(memory_monitor, max_norm: float, lr: float, steps: int = 4, every: int = 2):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": lr / 2}], lr=lr
    )
    m, tx = memory_monitor(sample_rate=0.0)
    m.watch(model, opt, every=every)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    returned = []
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y) * 100
        opt.zero_grad()
        loss.backward()
        returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        m.log_step(step, loss=loss)
    param_norm = float(
        torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in model.parameters()]))
    )
    m.shutdown()
    return {r.step: r.data for r in tx.records("step")}, returned, param_norm


def test_watch_every_n_with_clipping(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    steps, returned, _ = _train(memory_monitor, max_norm=0.01, lr=0.1)
    assert set(steps) == {0, 2}  # every=2; sent raw with reason "every"
    for s in (0, 2):
        d = steps[s]
        assert d["reason"] == "every"
        assert d["grad_norm_preclip"] == pytest.approx(returned[s], rel=1e-5)
        assert d["clipped"] is True
        assert d["update_ratio"] == 1.0
        assert d["group_lrs"] == [0.1, 0.05]
    assert steps[2]["param_norm"] != steps[0]["param_norm"]


def test_watch_no_clip_no_update(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    steps, _, param_norm = _train(memory_monitor, max_norm=1e9, lr=0.0, steps=1, every=1)
    d = steps[0]
    assert d["clipped"] is False and d["update_ratio"] == 0.0
    assert d["param_norm"] == pytest.approx(param_norm, rel=1e-5)
    assert math.isfinite(d["grad_norm_preclip"])


def test_declared_clip_threshold_survives_gradient_averaging(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """Gradients averaged by hand between backward and step shrink uniformly-looking probes;
    with max_grad_norm the clipped flag follows the norm the loop clipped with."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    m, tx = memory_monitor(sample_rate=1.0)
    m.watch(model, opt, every=1, max_grad_norm=1.0)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    norms = []
    for step, scale in enumerate([0.001, 0.001, 1000.0]):
        loss = torch.nn.functional.mse_loss(model(x), y) * scale
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # what a hand-written all-reduce average does
            p.grad /= 2
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        norms.append(float(norm))
        opt.step()
        m.log_step(step, loss=loss, grad_norm=norm)
    m.shutdown()
    got = {r.step: r.data["clipped"] for r in tx.records("step")}
    assert got == {i: n > 1.0 for i, n in enumerate(norms)}
    assert got == {0: False, 1: False, 2: True}
