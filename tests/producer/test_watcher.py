"""watch(): pre-clip gradient norm, clipping, parameter norm, per-layer norms, update ratio,
the step's learning rate."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _train(memory_monitor, max_norm: float, lr: float, steps: int = 4, every: int = 2):  # type: ignore[no-untyped-def]
    model = _model()
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
        assert 0.0 < d["update_ratio"] < 1.0  # clipped to 0.01: most weights barely move
        assert d["lr"] == 0.1 and d["group_lrs"] == [0.1, 0.05]  # the groups differ
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
    model = _model()
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


def test_the_schedulers_lr_reaches_steps_logged_without_one(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """The README's loop: watch(model, optimizer, scheduler) and log_step without lr=."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    m, tx = memory_monitor(sample_rate=0.0)
    m.watch(model, opt, sched, every=1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    used = []
    for step in range(7):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        used.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        m.log_step(step, loss=loss)
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    assert [steps[s]["lr"] for s in range(7)] == used == [1e-2] * 3 + [5e-3] * 3 + [2.5e-3]
    assert all("group_lrs" not in d for d in steps.values())  # one group: no list
    windows = tx.records("step_window")
    assert windows and all("lr" in w.data["metrics"] for w in windows)


def test_every_steps_lr_reaches_the_window_between_watched_steps(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """watch(every=3) with a warm-up: the lr of each step (a host number) rides on every
    log_step, so the window sees the whole ramp; only the watched steps are sent raw."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    m, tx = memory_monitor(sample_rate=0.0, window_steps=1000)
    m.watch(model, opt, sched, every=3)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    used = []
    for step in range(8):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        used.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        m.log_step(step, loss=loss)
    m.shutdown()
    raw = {r.step: r.data for r in tx.records("step")}
    assert set(raw) == {0, 3, 6} and all(d["reason"] == "every" for d in raw.values())
    assert [raw[s]["lr"] for s in (0, 3, 6)] == [used[0], used[3], used[6]]
    [window] = tx.records("step_window")
    lr = window.data["metrics"]["lr"]
    assert lr["count"] == 8 == window.data["count"]
    assert lr["min"] == pytest.approx(2.5e-3) and lr["max"] == pytest.approx(1e-2)
    assert lr["mean"] == pytest.approx(sum(used) / 8)


def test_a_logged_grad_norm_says_clipped_on_every_step(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """The plain loop logs clip_grad_norm_'s result: with watch(max_grad_norm=...) every step
    says whether it was clipped, not only the watched ones, so the window's clipping rate
    counts every step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    m, tx = memory_monitor(sample_rate=1.0, window_steps=1000)
    m.watch(model, opt, every=4, max_grad_norm=1.0)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    norms = []
    for step, scale in enumerate([0.001, 1000.0, 0.001, 1000.0, 1000.0, 0.001]):
        loss = torch.nn.functional.mse_loss(model(x), y) * scale
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        norms.append(float(norm))
        opt.step()
        m.log_step(step, loss=loss, grad_norm=norm)
    m.shutdown()
    got = {r.step: r.data.get("clipped") for r in tx.records("step")}
    assert got == {i: n > 1.0 for i, n in enumerate(norms)}
    assert list(got.values()) == [False, True, False, True, True, False]
    [window] = tx.records("step_window")
    assert window.data["metrics"]["clipped"]["count"] == 6
    assert window.data["metrics"]["clipped"]["mean"] == pytest.approx(0.5)


def _adam_ratios(memory_monitor, lr: float, threshold: float | None = None) -> list[float]:  # type: ignore[no-untyped-def]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    config = {} if threshold is None else {"update_threshold": threshold}
    m, tx = memory_monitor(sample_rate=0.0, **config)
    m.watch(model, opt, every=1)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        x, y = torch.randn(32, 64, generator=gen), torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.log_step(step, loss=loss)
    m.shutdown()
    return [r.data["update_ratio"] for r in tx.records("step")]


def test_update_ratio_is_meaningful_for_adam(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """Adam moves every weight by about lr: with an absolute threshold of 0 the ratio is 1 at
    any lr; relative to each weight's size (1e-3 by default) it says how much of the model
    the step moved, and falls to 0 when nothing learns."""
    torch.manual_seed(0)
    absolute = _adam_ratios(memory_monitor, lr=1e-5, threshold=0.0)
    small = _adam_ratios(memory_monitor, lr=1e-5)
    usual = _adam_ratios(memory_monitor, lr=1e-3)
    frozen = _adam_ratios(memory_monitor, lr=0.0)
    assert min(absolute) > 0.99
    assert max(small) < 0.3 and min(small) > 0.0
    assert min(usual) > 0.8
    assert frozen == [0.0] * 6


def test_per_layer_norms_are_the_layers_norms(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    m, tx = memory_monitor(sample_rate=0.0)
    m.watch(model, opt, every=1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    grads = {
        name: float(
            torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in mod.parameters()]))
        )
        for name, mod in (("0", model[0]), ("2", model[2]))
    }
    opt.step()
    params = {
        name: float(
            torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in mod.parameters()]))
        )
        for name, mod in (("0", model[0]), ("2", model[2]))
    }
    m.log_step(0, loss=loss)
    m.shutdown()
    (d,) = [r.data for r in tx.records("step")]
    assert d["layer_grad_norms"] == pytest.approx(grads, rel=1e-5)
    assert d["layer_param_norms"] == pytest.approx(params, rel=1e-5)
    total = math.sqrt(sum(v * v for v in grads.values()))
    assert d["grad_norm_preclip"] == pytest.approx(total, rel=1e-5)


class _Blocks(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 4)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_many_layers_send_the_most_changed(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """Past max_layers a record carries the layers that changed most since last sent: first
    the never-sent ones, then a layer whose weights were scaled up stands out."""
    model = _Blocks(5)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    m, tx = memory_monitor(sample_rate=0.0, max_layers=3)
    m.watch(model, opt, every=1)
    x = torch.randn(8, 4)
    for step in range(3):
        if step == 2:
            with torch.no_grad():
                model.layers[3].weight.mul_(10)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.log_step(step, loss=loss)
    m.shutdown()
    sent = [set(r.data["layer_param_norms"]) for r in tx.records("step")]
    assert sent[0] == {"embed", "layers.0", "layers.1"}
    assert sent[1] == {"layers.2", "layers.3", "layers.4"}
    assert "layers.3" in sent[2]


def test_a_failing_hook_never_reaches_the_training_loop(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    m, _ = memory_monitor(sample_rate=0.0)
    m.watch(model, opt, every=1)
    (watcher,) = m._watching.watchers

    def broken(*_args: object) -> None:
        raise RuntimeError("device lost")

    watcher._gather = broken
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    opt.step()  # the pre-step hook fails inside: counted, not raised
    assert m.stats()["caller_errors"] >= 1


def test_the_returned_grad_norm_reaches_every_steps_window(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """At the defaults (windows, 1 % raw) with watch(every=10): the norm clip_grad_norm_
    returns, given to log_step as a 0-dim tensor, is in every step's aggregate, and so is
    whether the step was clipped; watch()'s own norms come every 10th step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    m, tx = memory_monitor()
    m.watch(model, opt, every=10, max_grad_norm=1.0)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(40):
        loss = torch.nn.functional.mse_loss(model(x), y) * (100 if step % 2 else 0.001)
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        m.log_step(step, loss=loss, grad_norm=grad_norm)
    m.shutdown()
    (window,) = tx.records("step_window")
    stats = window.data["metrics"]
    assert stats["grad_norm"]["count"] == 40
    assert stats["clipped"]["count"] == 40 and stats["clipped"]["mean"] == pytest.approx(0.5)
    assert stats["grad_norm_preclip"]["count"] == 4
