"""The Trainer's schedules, read from its arguments, declared as the schedule check reads them:
the declared lr at each step is the scheduler's after that many steps (within its warmup, the
next step's, which the check allows)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
lr_schedule = pytest.importorskip("steplens.stream_jobs.engine.signals.lr_schedule")

from steplens.producer.integrations.hf_schedule import trainer_schedule  # noqa: E402

TOTAL = 200


def scheduler_lrs(args: Any) -> list[float]:
    """The lr ``get_last_lr()`` gives after 0, 1, ... TOTAL steps of the Trainer's scheduler."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    sched = transformers.get_scheduler(
        args.lr_scheduler_type,
        opt,
        num_warmup_steps=args.get_warmup_steps(TOTAL),
        num_training_steps=TOTAL,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    out = [sched.get_last_lr()[0]]
    for _ in range(TOTAL):
        opt.step()
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


@pytest.mark.parametrize(
    ("kind", "kwargs", "warmup"),
    [
        ("linear", {}, 20),
        ("cosine", {}, 20),
        ("cosine", {}, 0),
        ("constant", {}, 0),
        ("constant_with_warmup", {}, 10),
        ("cosine_with_min_lr", {"min_lr_rate": 0.1}, 20),
        ("cosine_with_min_lr", {"min_lr": 1e-4}, 20),
        ("warmup_stable_decay", {"num_decay_steps": 40}, 20),
        ("warmup_stable_decay", {"num_decay_steps": 40, "decay_type": "linear"}, 20),
        ("warmup_stable_decay", {"num_decay_steps": 50, "decay_type": "1-sqrt"}, 0),
        ("warmup_stable_decay", {"num_decay_steps": 50, "min_lr_ratio": 0.1}, 0),
    ],
)
def test_the_declared_lr_is_the_schedulers(tmp_path, kind, kwargs, warmup) -> None:  # type: ignore[no-untyped-def]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        learning_rate=1e-3,
        lr_scheduler_type=kind,
        lr_scheduler_kwargs=kwargs,
        warmup_steps=warmup,
        report_to=[],
    )
    declared = trainer_schedule(args, TOTAL)
    assert declared is not None
    lr_schedule.check_schedule(declared)  # the worker takes it
    got = scheduler_lrs(args)
    for step in range(TOTAL + 1):
        want = lr_schedule.expected_lr(declared, step)
        # within the warmup the declared lr is one step ahead, (step + 1) / warmup: a
        # neighbouring step's, which the check allows
        at = step + 1 if step < warmup else step
        assert want == pytest.approx(got[at], rel=1e-9, abs=1e-12), step


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [
        ("cosine_with_restarts", {}),
        ("polynomial", {}),
        ("inverse_sqrt", {}),
        ("cosine", {"num_cycles": 2.0}),
        ("warmup_stable_decay", {"num_decay_steps": 40, "min_lr_ratio": 0.1}),  # warmup from 0.1
    ],
)
def test_a_schedule_the_declaration_cannot_say_is_not_declared(tmp_path, kind, kwargs) -> None:  # type: ignore[no-untyped-def]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        lr_scheduler_type=kind,
        lr_scheduler_kwargs=kwargs,
        warmup_steps=10,
        report_to=[],
    )
    assert trainer_schedule(args, TOTAL) is None
