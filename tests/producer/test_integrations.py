"""The Hugging Face and Lightning callbacks in real (tiny) training runs on CPU."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from tests.producer.tiny_lm import LIGHTNING_CPU, Regressor  # noqa: E402 - after the torch check


def cpu_args(transformers: Any, out: Any, **kw: Any) -> Any:
    """A Trainer's arguments for a short CPU run: no reports, no checkpoints, no progress bar."""
    return transformers.TrainingArguments(
        output_dir=str(out), report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, **kw
    )


class _Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return {"x": x, "labels": x.sum(0, keepdim=True)}


@pytest.mark.slow
def test_hf_trainer_callback(memory_monitor, tmp_path) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    from steplens.producer.integrations.hf import SteplensCallback

    m, tx = memory_monitor(sample_rate=1.0)
    args = cpu_args(
        transformers,
        tmp_path,
        max_steps=6,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=3,
        per_device_train_batch_size=8,
        max_grad_norm=0.05,
    )
    trainer = transformers.Trainer(
        model=Regressor(),
        args=args,
        train_dataset=_Data(),
        eval_dataset=_Data(),
        callbacks=[SteplensCallback(m, watch_every=2)],
    )
    trainer.train()
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    assert {2, 4, 6} <= set(steps)
    logged = {e["step"]: e for e in trainer.state.log_history if "loss" in e}
    for s in (2, 4, 6):
        d = steps[s]
        # the scheduler's lr after step s (the Trainer logs the one step s used)
        assert "loss" in d and d["lr"] == pytest.approx(5e-5 * (1 - s / 6))
        assert logged[s]["learning_rate"] == pytest.approx(5e-5 * (1 - (s - 1) / 6))
        assert d["grad_norm_preclip"] == pytest.approx(logged[s]["grad_norm"], rel=1e-4)
        assert d["clipped"] is (logged[s]["grad_norm"] > 0.05)
    assert any(d["clipped"] for d in steps.values())
    assert any("param_norm" in d and "layer_param_norms" in d for d in steps.values())
    evals = tx.records("eval")
    assert [e.step for e in evals] == [3, 6] and all("loss" in e.data for e in evals)


class _SlowData(_Data):
    """Each sample takes 20 ms to load: a batch of 2 waits at least 40 ms."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        import time

        time.sleep(0.02)
        return super().__getitem__(i)


@pytest.mark.slow
def test_hf_trainer_callback_times_the_input_pipeline(memory_monitor, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The wait for the next batches, from the end of one step to the start of the next, comes
    with each logged step as the mean per step since the last log, and is part of its step
    time."""
    transformers = pytest.importorskip("transformers")
    from steplens.producer.integrations.hf import SteplensCallback

    m, tx = memory_monitor(sample_rate=1.0)
    batches = {"max_steps": 6, "logging_steps": 2, "per_device_train_batch_size": 2}
    args = cpu_args(transformers, tmp_path, **batches)
    trainer = transformers.Trainer(
        model=Regressor(), args=args, train_dataset=_SlowData(), callbacks=[SteplensCallback(m)]
    )
    trainer.train()
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    waits = {s: d.get("data_time_s") for s, d in steps.items()}
    # the first step's batch is fetched before any step ends: steps 2-6 are timed
    assert all(waits[s] is not None and waits[s] >= 0.035 for s in (4, 6))
    # a step's time holds its own wait, whenever its record is sent (a logged step's at once,
    # the others' at the next step's start): the share of it spent waiting is at most 1
    for s in range(2, 7):
        assert 0 < steps[s]["data_time_s"] <= steps[s]["step_time_s"]


@pytest.mark.slow
def test_lightning_callback(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    L = pytest.importorskip("lightning")
    from steplens.producer.integrations.lightning import SteplensCallback

    class Module(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = Regressor()

        def training_step(self, batch: Any, _i: int) -> Any:
            return self.net(batch["x"], batch["labels"])["loss"]

        def validation_step(self, batch: Any, _i: int) -> None:
            self.log("val_loss", self.net(batch["x"], batch["labels"])["loss"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    m, tx = memory_monitor(sample_rate=1.0)
    loader = torch.utils.data.DataLoader(_Data(), batch_size=8)
    trainer = L.Trainer(
        max_steps=4,
        **LIGHTNING_CPU,
        val_check_interval=2,
        gradient_clip_val=0.05,
        callbacks=[SteplensCallback(m, watch_every=1)],
    )
    trainer.fit(Module(), loader, loader)
    m.shutdown()
    steps = tx.records("step")
    assert [r.step for r in steps] == [1, 2, 3, 4]
    for r in steps:
        d = r.data
        assert d["lr"] == 0.01 and "loss" in d and "update_ratio" in d
        assert d["clipped"] is (d["grad_norm_preclip"] > 0.05)
        assert d["layer_grad_norms"].keys() == {"net.lin"}
    assert any(r.data["clipped"] for r in steps)
    assert [e.data["loss"] for e in tx.records("eval")]


@pytest.mark.slow
def test_hf_trainer_at_the_defaults_follows_its_declared_schedule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A healthy Trainer run logging every step with the Trainer's own cosine schedule
    declared: no lr-schedule deviation at step 1 (the Trainer logs lr 0.0 there, the lr its
    first step used). Windows of one step: the first window is cut by time
    after the first step whenever that step is slow (a GPU's warm-up), and step 1's lr is then
    judged alone."""
    transformers = pytest.importorskip("transformers")
    detector = pytest.importorskip("steplens.stream_jobs.engine.detector")
    from steplens.producer.delivery.transport import MemoryTransport
    from steplens.producer.integrations.hf import SteplensCallback
    from steplens.producer.monitor import Monitor

    tx = MemoryTransport()
    m = Monitor(
        "hf-run",
        transport=tx,
        hw_interval_s=0,
        spool_dir=str(tmp_path / "spool"),
        window_steps=1,
        lr_schedule={
            "kind": "cosine",
            "peak_lr": 0.01,
            "min_lr": 0.0,
            "warmup_steps": 4,
            "total_steps": 40,
        },
    )
    args = cpu_args(
        transformers,
        tmp_path,
        max_steps=40,
        logging_steps=1,
        learning_rate=0.01,
        lr_scheduler_type="cosine",
        warmup_steps=4,
        per_device_train_batch_size=8,
    )
    trainer = transformers.Trainer(
        model=Regressor(), args=args, train_dataset=_Data(), callbacks=[SteplensCallback(m)]
    )
    trainer.train()
    m.shutdown()
    logged = {e["step"]: e["learning_rate"] for e in trainer.state.log_history if "loss" in e}
    assert logged[1] == 0.0  # the Trainer's convention
    det = detector.RunDetector("hf-run")
    reports = [a for r in tx.records() for a in det.process(r)[1]]
    assert [(a.rule, a.step) for a in reports if a.state == "firing" and "lr" in a.rule] == []
    first = min(tx.records("step_window"), key=lambda w: w.step)
    assert first.step == 1 and first.data["metrics"]["lr"]["last"] > 0


class _RecordingRegressor(Regressor):
    """Keeps the loss of each training forward (a host number: the test's own sync)."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        out = super().forward(x, labels)
        if self.training:
            self.losses.append(float(out["loss"].detach()))
        return out


@pytest.mark.slow
def test_hf_every_step_carries_its_own_loss_and_the_lr_it_ran_at(memory_monitor, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """logging_steps 3 with 2 micro-batches a step: each of the 6 steps is sent with the mean
    of its micro-batches' losses (the Trainer logs the mean of 3 steps); an lr multiplied
    outside the scheduler for one step is sent at that step; the Trainer's linear schedule
    is declared for a run that declared none."""
    transformers = pytest.importorskip("transformers")
    from steplens.producer.integrations.hf import SteplensCallback

    class Blowup(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args, state, control, optimizer=None, **kw):  # type: ignore[no-untyped-def]
            if state.global_step == 2:  # the third step
                for g in optimizer.param_groups:
                    g["lr"] *= 30.0  # the scheduler sets it back at its next step

    m, tx = memory_monitor(sample_rate=1.0)
    model = _RecordingRegressor()
    batches = {"max_steps": 6, "logging_steps": 3, "per_device_train_batch_size": 4}
    args = cpu_args(transformers, tmp_path, gradient_accumulation_steps=2, **batches)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_Data(), callbacks=[SteplensCallback(m), Blowup()]
    )
    trainer.train()
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    micro = model.losses
    assert len(micro) == 12
    for s in range(1, 7):
        assert steps[s]["loss"] == pytest.approx((micro[2 * s - 2] + micro[2 * s - 1]) / 2)
    logged = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    for s in (3, 6):  # the Trainer's mean of 3 steps, rounded to 4 digits
        mean = sum(steps[k]["loss"] for k in range(s - 2, s + 1)) / 3
        assert logged[s] == pytest.approx(mean, abs=1e-4)
    linear = lambda s: 5e-5 * (1 - s / 6)  # noqa: E731 - the scheduler's lr after step s
    assert steps[3]["lr"] == pytest.approx(30 * linear(3))
    assert [steps[s]["lr"] for s in (2, 4)] == [pytest.approx(linear(2)), pytest.approx(linear(4))]
    declared = tx.records("run_meta")[-1].data["lr_schedule"]
    assert declared == {
        "kind": "linear",
        "peak_lr": 5e-5,
        "warmup_steps": 0,
        "total_steps": 6,
        "min_lr": 0.0,
    }


@pytest.mark.slow
def test_lightning_sends_each_optimizer_step_once_with_accumulation(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """accumulate_grad_batches 2: each optimizer step is sent once, with the mean of its two
    micro-batches' losses, the time its batches waited for a slow loader, and the lr it ran
    at: the scheduler's after its step (PyTorch's convention), times 30 for the step whose
    lr was multiplied outside the scheduler."""
    L = pytest.importorskip("lightning")
    from steplens.producer.integrations.lightning import SteplensCallback

    net = _RecordingRegressor()

    class Module(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: Any, _i: int) -> Any:
            return self.net(batch["x"], batch["labels"])["loss"]

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.01)
            lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / 10)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": lam, "interval": "step"}}

    class Blowup(L.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_start(self, trainer, module, batch, batch_idx):  # type: ignore[no-untyped-def]
            if trainer.global_step == 2 and batch_idx % 2 == 0:  # the third step
                for g in trainer.optimizers[0].param_groups:
                    g["lr"] *= 30.0  # the scheduler sets it back at its next step

    m, tx = memory_monitor(sample_rate=1.0)
    loader = torch.utils.data.DataLoader(_SlowData(), batch_size=2)
    trainer = L.Trainer(
        max_steps=4,
        accumulate_grad_batches=2,
        **LIGHTNING_CPU,
        callbacks=[SteplensCallback(m, watch_every=None), Blowup()],
    )
    trainer.fit(Module(), loader)
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    assert [r.step for r in tx.records("step")] == [1, 2, 3, 4]
    micro = net.losses
    assert len(micro) == 8
    for s in range(1, 5):
        assert steps[s]["loss"] == pytest.approx((micro[2 * s - 2] + micro[2 * s - 1]) / 2)
    # from the second step on, both batches of a step waited for 2 samples of 20 ms each
    assert all(steps[s]["data_time_s"] >= 0.07 for s in (2, 3, 4))
    scheduled = lambda s: 0.01 * (1 - s / 10)  # noqa: E731 - get_last_lr() after step s
    assert [steps[s]["lr"] for s in (1, 2, 3, 4)] == pytest.approx(
        [scheduled(1), scheduled(2), 30 * scheduled(3), scheduled(4)]
    )
