"""Remedies carried out by the Hugging Face and Lightning callbacks, in real (tiny) training
runs on the CPU: the callbacks report their Trainer's checkpoints and carry out the advice;
each run against the same run from the same seed without the remedy."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any

import pytest
from tests.producer.test_profile_auto import advise as readvise  # waits for duplicates too
from tests.producer.test_remedies import advise, back_on_trend
from tests.waiting import wait_until

torch = pytest.importorskip("torch")
from tests.producer.tiny_lm import LIGHTNING_CPU, Regressor  # noqa: E402 - after the torch check

BATCH = 8
BAD = range(40, 46)  # batches (0-based) of corrupted labels: the Trainers' steps 41-46
W = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def sample(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    x = torch.randn(4, generator=g)
    y = x @ W
    if i // BATCH in BAD:
        y = -5.0 * y
    return {"x": x, "labels": y}


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        for i in range(10_000):
            yield sample(i)


CLEAN_X = torch.randn(64, 4, generator=torch.Generator().manual_seed(99))


def clean_loss(model: Any) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model.lin(CLEAN_X), CLEAN_X @ W))


# ---------------------------------------------------------------------- Hugging Face
def run_hf(memory_monitor, tmp_path, advice: dict[str, Any] | None) -> tuple[list[float], Any]:
    transformers = pytest.importorskip("transformers")
    from steplens.producer.integrations.hf import SteplensCallback

    m, t = memory_monitor(remedies=["rewind", "lower_lr"], sample_rate=1.0)
    out = tmp_path / ("with" if advice else "without")
    losses: list[float] = []

    class Advise(transformers.TrainerCallback):  # the stream jobs, at step 43
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if advice and state.global_step == 43:
                data = {k: v.format(out=out) if k == "checkpoint" else v for k, v in advice.items()}
                advise(m, t, 43, **data)

    class Record(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any):
            losses.append(clean_loss(model))

    torch.manual_seed(0)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=90,
        per_device_train_batch_size=BATCH,
        save_strategy="steps",
        save_steps=20,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        max_grad_norm=0.0,  # no clipping: the corrupted batches do their harm
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=m.skipping(Stream()),
        optimizers=(opt, sched),
        callbacks=[Advise(), SteplensCallback(m), Record()],
    )
    trainer.train()
    m.flush(5)
    return losses, t


@pytest.mark.slow
def test_hf_callback_reports_checkpoints_and_rewinds(memory_monitor, tmp_path):
    rewind = {
        "action": "rewind",
        "fingerprint": "spike-hf",
        "onset_step": 41,
        "checkpoint": "{out}/checkpoint-40",
        "checkpoint_step": 40,
        "skip_batches": 3,
        "at_step": 44,  # the loader read batch 44 ahead: skipped from 45 on, reloaded at 44
    }
    without, _ = run_hf(memory_monitor, tmp_path, None)
    with_, t = run_hf(memory_monitor, tmp_path, rewind)
    ckpts = [(r.step, r.data["path"]) for r in t.records("checkpoint")]
    assert ckpts == [(s, str(tmp_path / "with" / f"checkpoint-{s}")) for s in (20, 40, 60, 80, 90)]
    [answer] = t.records("acted")
    assert answer.data["outcome"] == "acted", answer.data
    assert "restored model, optimizer, scheduler" in answer.data["detail"]
    assert answer.data["detail"].endswith("at step 44; skipped the 3 batches after")  # on time
    pre = without[39]  # after step 40
    assert with_[39] == pytest.approx(pre)
    back_with, back_without = back_on_trend(with_, 40, pre), back_on_trend(without, 40, pre)
    assert back_with <= 3 < back_without, (back_with, back_without, with_[38:50], without[38:50])
    assert with_[-1] <= without[-1] + 1e-6


@pytest.mark.slow
def test_hf_callback_lowers_the_lr_of_the_trainers_optimizer(memory_monitor, tmp_path):
    lower = {"action": "lower_lr", "fingerprint": "corr-hf", "lr_factor": 0.25, "at_step": 43}
    _, t = run_hf(memory_monitor, tmp_path, lower)
    [answer] = t.records("acted")
    assert answer.data["outcome"] == "acted"
    assert answer.data["detail"] == "lr x0.25 from step 44: 0.2 -> 0.05"
    lrs = {r.step: r.data.get("lr") for r in t.records("step")}
    assert lrs[40] == pytest.approx(0.2) and lrs[50] == pytest.approx(0.05)


# ---------------------------------------------------------------------- Lightning
def run_lightning(memory_monitor, tmp_path, remedy: bool) -> tuple[list[float], Any]:
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from steplens.producer.integrations.lightning import SteplensCallback

    m, t = memory_monitor(remedies=["rewind"])
    out = tmp_path / ("with" if remedy else "without")
    losses: list[float] = []

    class Module(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = Regressor()

        def training_step(self, batch: Any, _i: int) -> Any:
            return self.net(batch["x"], batch["labels"])["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    ckpts: list[str] = []

    class Advise(L.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
            if remedy and trainer.global_step == 43:
                path = next(p for p in ckpts if "step=40" in p)
                advise(
                    m,
                    t,
                    43,
                    action="rewind",
                    fingerprint="spike-pl",
                    checkpoint=path,
                    checkpoint_step=40,
                    skip_batches=3,
                    at_step=44,
                )

    class Record(L.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: Any, module: Any, *_: Any) -> None:
            losses.append(clean_loss(module.net))
            m.flush(5)
            ckpts[:] = [r.data["path"] for r in t.records("checkpoint")]

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(Stream(), batch_size=BATCH)
    trainer = L.Trainer(
        max_steps=90,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            Advise(),
            SteplensCallback(m, watch_every=None),
            Record(),
            ModelCheckpoint(dirpath=str(out), every_n_train_steps=20, save_top_k=-1),
        ],
    )
    trainer.fit(Module(), m.skipping(loader))
    m.flush(5)
    return losses, t


@pytest.mark.slow
def test_lightning_callback_reports_checkpoints_and_rewinds(memory_monitor, tmp_path):
    without, _ = run_lightning(memory_monitor, tmp_path, remedy=False)
    with_, t = run_lightning(memory_monitor, tmp_path, remedy=True)
    ckpts = [(r.step, r.data["path"]) for r in t.records("checkpoint")]
    assert [s for s, _ in ckpts] == [20, 40, 60, 80]
    assert all(f"step={s}" in p for s, p in ckpts)
    [answer] = t.records("acted")
    assert answer.data["outcome"] == "acted", answer.data
    assert "restored model, optimizer" in answer.data["detail"]
    pre = without[39]
    assert with_[39] == pytest.approx(pre)
    back_with, back_without = back_on_trend(with_, 40, pre), back_on_trend(without, 40, pre)
    assert back_with <= 3 < back_without, (back_with, back_without, with_[38:50], without[38:50])


# ---------------------------------------------------------------------- more remedies
class Poisoned(torch.utils.data.IterableDataset):
    """4 epochs over 64 samples with ids; samples 5 and 50 carry corrupted labels."""

    def __iter__(self) -> Any:
        for _epoch in range(4):
            for i in range(64):
                s = sample(i % 40)  # clean labels
                if i in (5, 50):
                    s["labels"] = -5.0 * s["labels"]
                yield {**s, "sample_id": i}


@pytest.mark.slow
def test_hf_callback_skips_the_named_samples_of_a_skipping_dataset(memory_monitor, tmp_path):
    transformers = pytest.importorskip("transformers")
    from steplens.producer.integrations.hf import SteplensCallback

    m, t = memory_monitor(remedies=["skip_samples"])
    seen: list[list[int]] = []

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        seen.append([int(r["sample_id"]) for r in rows])
        return {k: torch.stack([r[k] for r in rows]) for k in ("x", "labels")}

    class Advise(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 2:
                advise(m, t, 2, action="skip_samples", fingerprint="s-hf", sample_ids=["5", "50"])

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=30,
        per_device_train_batch_size=BATCH,
        save_strategy="no",
        remove_unused_columns=False,  # the collator reads the ids
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    transformers.Trainer(
        model=Regressor(),
        args=args,
        train_dataset=m.skipping(Poisoned()),
        data_collator=collate,
        callbacks=[Advise(), SteplensCallback(m)],
    ).train()
    m.flush(5)
    assert 5 in seen[0]  # before the advice
    later = [i for batch in seen[4:] for i in batch]  # past the batch read ahead
    assert later and 5 not in later and 50 not in later
    assert [r.data["outcome"] for r in t.records("acted")] == ["acted"]


@pytest.mark.slow
def test_lightning_callback_lowers_the_lr_and_profiles(memory_monitor, tmp_path, monkeypatch):
    L = pytest.importorskip("lightning")
    monkeypatch.delenv("STEPLENS_S3_BUCKET", raising=False)  # kept local
    from steplens.producer.integrations.lightning import SteplensCallback

    m, t = memory_monitor(remedies=["lower_lr", "profile"])
    m.remedies.profile_dir = str(tmp_path)

    class Module(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = Regressor()

        def training_step(self, batch: Any, _i: int) -> Any:
            return self.net(batch["x"], batch["labels"])["loss"]

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.2)
            return [opt], [torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)]

    class Advise(L.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
            if trainer.global_step == 5:
                advise(m, t, 5, action="lower_lr", fingerprint="c-pl", lr_factor=0.5, at_step=5)
                advise(m, t, 5, action="profile", fingerprint="p-pl", duration_s=0.2)

    module = Module()
    trainer = L.Trainer(
        max_steps=40,
        **LIGHTNING_CPU,
        callbacks=[Advise(), SteplensCallback(m, watch_every=None)],
    )
    trainer.fit(module, torch.utils.data.DataLoader(Stream(), batch_size=BATCH))
    assert wait_until(lambda: any(a[0] == "profile" for a in m.remedies.answers), timeout_s=20)
    m.flush(5)
    got = {r.data["action"]: r.data for r in t.records("acted")}
    assert got["lower_lr"]["detail"] == "lr x0.5 from step 6: 0.2 -> 0.1"
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1)
    assert trainer.lr_scheduler_configs[0].scheduler.base_lrs == [pytest.approx(0.1)]
    assert got["profile"]["outcome"] == "acted"
    path = got["profile"]["detail"].split("trace ")[1].split(":")[0]
    assert path.startswith(str(tmp_path))


@pytest.mark.slow
def test_hf_callback_profiles_once_per_fingerprint(memory_monitor, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.delenv("STEPLENS_S3_BUCKET", raising=False)  # kept local
    from steplens.producer.integrations.hf import SteplensCallback
    from steplens.producer.remedies.rank_profile import MAX_STEPS

    m, t = memory_monitor(remedies=["profile"])
    profile = {"action": "profile", "fingerprint": "slow-hf", "duration_s": 30.0}
    traces = tmp_path / "traces"
    m.remedies.profile_dir = str(traces)

    class Advise(transformers.TrainerCallback):  # 30 s asked: bounded by MAX_STEPS instead
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step in (5, 6, 40):  # the same incident again: during, after
                readvise(m, t, state.global_step, **profile)

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=60,
        per_device_train_batch_size=BATCH,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    transformers.Trainer(
        model=Regressor(),
        args=args,
        train_dataset=Stream(),
        callbacks=[Advise(), SteplensCallback(m)],
    ).train()
    m.flush(5)
    [answer] = t.records("acted")
    assert (answer.data["action"], answer.data["outcome"]) == ("profile", "acted"), answer.data
    assert answer.data["fingerprint"] == "slow-hf"
    detail = answer.data["detail"]
    path = detail.split("trace ")[1].split(":")[0]
    assert [p.name for p in traces.iterdir()] == [os.path.basename(path)]
    with gzip.open(path, "rt") as f:
        assert any("aten::" in e.get("name", "") for e in json.load(f)["traceEvents"])
    assert int(detail.split(": ")[1].split(" steps")[0]) == MAX_STEPS


@pytest.mark.slow
def test_lightning_callback_skips_the_named_samples_of_its_loader(memory_monitor):
    L = pytest.importorskip("lightning")
    from tests.producer.tiny_lm import Samples, TinyLM

    from steplens.producer.integrations.lightning import SteplensCallback
    from steplens.producer.pipeline.batch_stats import batch_payload

    m, t = memory_monitor(remedies=["skip_samples"])
    ds = Samples(64, {3, 17, 40, 51})
    seen: list[list[int]] = []  # the sample ids of each batch training_step got

    class Module(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = TinyLM()

        def train_dataloader(self) -> Any:  # as a user wraps it: the ids ride in the batch
            loader = torch.utils.data.DataLoader(
                ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1)
            )
            return m.skipping(loader)

        def training_step(self, batch: Any, _i: int) -> Any:
            seen.append(batch["sample_id"].tolist())
            return self.net(batch["input_ids"])["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.05)

    class Advise(L.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
            if trainer.global_step == 2:  # 3 and 17 by id, 40 and 51 by their hashes
                hashes = batch_payload(ds.rows[[40, 51]])[0]["sample_hashes"]
                advise(
                    m,
                    t,
                    2,
                    action="skip_samples",
                    fingerprint="s-pl",
                    sample_ids=["3", "17"],
                    sample_hashes=hashes,
                )

    trainer = L.Trainer(
        max_steps=40,  # 5 epochs of 8 batches
        **LIGHTNING_CPU,
        callbacks=[Advise(), SteplensCallback(m, watch_every=None)],
    )
    trainer.fit(Module())
    m.flush(5)
    [answer] = t.records("acted")
    assert answer.data["outcome"] == "acted", answer.data
    assert "(2 ids, 2 hashes in all)" in answer.data["detail"]
    assert 40 in seen[1]  # before the advice: trained on
    # read after the advice (Lightning reads none ahead from a loader with a length)
    later = [i for batch in seen[2:] for i in batch]
    assert set(later) == set(range(64)) - {3, 17, 40, 51}  # the others: all still trained on
    assert len(seen) == 40


class SizedStream(torch.utils.data.Dataset):
    """``Stream``'s samples, with a length: Lightning reads no batch ahead of such a loader."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> dict[str, Any]:
        return sample(i)


@pytest.mark.slow
@pytest.mark.parametrize("data", [Stream, SizedStream])
def test_lightning_trains_the_batch_after_a_rewinds_skip_from_the_checkpoint(
    memory_monitor, tmp_path, data
):
    """Whether the fit loop reads a batch ahead (a loader without a length) or not, the
    first batch after the 3 skipped is the first one trained from the reloaded weights."""
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from steplens.producer.integrations.lightning import SteplensCallback

    m, t = memory_monitor(remedies=["rewind"])
    first = {tuple(sample(b * BATCH)["x"].tolist()): b for b in range(60)}
    trained: list[tuple[int, Any]] = []  # (batch number, the weights it was trained from)

    class Module(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = Regressor()

        def training_step(self, batch: Any, _i: int) -> Any:
            b = first[tuple(batch["x"][0].tolist())]
            trained.append((b, self.net.lin.weight.detach().clone()))
            return self.net(batch["x"], batch["labels"])["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Advise(L.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
            if trainer.global_step == 43:
                m.flush(5)
                [ckpt] = [r.data["path"] for r in t.records("checkpoint") if r.step == 40]
                advise(
                    m,
                    t,
                    43,
                    action="rewind",
                    fingerprint="spike-pl",
                    checkpoint=ckpt,
                    checkpoint_step=40,
                    skip_batches=3,
                    at_step=44,
                )

    trainer = L.Trainer(
        max_steps=50,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            Advise(),
            SteplensCallback(m, watch_every=None),
            ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=20, save_top_k=-1),
        ],
    )
    trainer.fit(Module(), m.skipping(torch.utils.data.DataLoader(data(), batch_size=BATCH)))
    m.flush(5)
    [answer] = t.records("acted")
    assert answer.data["outcome"] == "acted", answer.data
    assert answer.data["detail"].endswith("at step 44; skipped the 3 batches after")  # on time
    batches = [b for b, _ in trained]
    gap = next(k for k in range(1, len(batches)) if batches[k] != batches[k - 1] + 1)
    assert batches[gap] - batches[gap - 1] == 4, batches  # 3 skipped
    at_checkpoint = trained[40][1]  # the weights after 40 steps
    assert torch.equal(trained[gap][1], at_checkpoint), (batches, gap)
    assert not any(torch.equal(w, at_checkpoint) for _, w in trained[41:gap])
