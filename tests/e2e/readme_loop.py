"""The README's "Instrument a training script" loop, line for line, on a tiny CPU model: one
batch of random tokens at ``--bad-at``; prints the held-out loss at the end and the remedies'
answers (JSON, last line). Run as a script by ``test_readme_loop.py``, with and without
``--remedies``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.producer
from tests.producer.tiny_lm import SEQ, TinyLM, clean_rows, corrupted_rows, eval_loss


class Output(dict):
    """A Hugging Face model's output: its fields as keys and attributes (``.loss``)."""

    __getattr__ = dict.__getitem__


class Model(TinyLM):
    """The tiny LM with a Hugging Face model's output, as the README calls it."""

    def forward(self, input_ids: Any, labels: Any = None, **_: Any) -> Any:
        return Output(super().forward(input_ids))


def batches(n: int, bad_at: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """``n`` batches of 8 clean rows; the one at ``bad_at`` random tokens."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        rows = corrupted_rows(8, gen) if i == bad_at else clean_rows(8, gen)
        yield {"input_ids": rows}


def evaluate(model: torch.nn.Module) -> dict[str, float]:
    return {"loss": eval_loss(model)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--bad-at", type=int, default=1000)
    p.add_argument("--remedies", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    import steplens.producer as sl

    torch.manual_seed(0)
    model = Model()
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup, total = 100, a.steps

    def cosine(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
    loader = batches(a.steps, a.bad_at, seed=1)
    path = str(a.out / "checkpoint.pt")
    step = -1

    # --- the README's loop ----------------------------------------------------------------
    # fmt: off
    sl.init(run_id=a.run_id, flops_per_token=6 * n_params, peak_flops=5e10,
            lr_schedule={"kind": "cosine", "peak_lr": 3e-3, "min_lr": 3e-4,
                         "warmup_steps": warmup, "total_steps": total},
            model_info={"seq_len": SEQ},                     # the longest input the model takes
            remedies=["profile", "skip_samples", "rewind", "lower_lr"] if a.remedies else [])
    sl.watch(model, optimizer, scheduler, every=10, max_grad_norm=1.0)  # norms, clipping, lr
    for step, batch in enumerate(sl.timed(sl.skipping(loader))):  # data wait, lengths, dups
        loss = model(**batch).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(); scheduler.step(); optimizer.zero_grad()  # noqa: E702
        sl.log_step(step, loss=loss, grad_norm=grad_norm, tokens=batch["input_ids"].numel())
        if step % 500 == 0:
            sl.log_eval(step, **evaluate(model))             # {"loss": ..., "accuracy": ...}
        if step % 1000 == 0:                                 # opt-in: what a rewind may reload
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
            sl.checkpoint(step, path)
        sl.act(step)                                         # opt-in: carry out the advice
    # fmt: on
    # ----------------------------------------------------------------------------------------
    monitor = sl.get_monitor()
    answers = list(monitor.remedies.answers) if monitor is not None else []
    sl.shutdown()
    keys = ("action", "fingerprint", "outcome", "detail", "step")
    out = {
        "last_step": step,
        "final": eval_loss(model),
        "answers": [dict(zip(keys, x, strict=True)) for x in answers],
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
