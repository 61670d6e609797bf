"""A tiny next-token model and its data, for the remedies' training runs on the CPU, and a
one-layer regressor in the shape the Hugging Face Trainer and Lightning tests feed it.

Clean sequences count up modulo the vocabulary (``t[i + 1] = t[i] + 1``): a bigram table
learns them to a loss near 0. Corrupted rows are random tokens (as a broken tokenizer's).
"""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 16
SEQ = 12
# a Lightning Trainer on the CPU that writes and prints nothing of its own
LIGHTNING_CPU: dict[str, Any] = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


class Regressor(torch.nn.Module):
    """``x`` (4 features) -> one value; returns the loss and the output as the Trainer takes."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        out = self.lin(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids: Any, labels: Any = None, **_: Any) -> dict[str, Any]:
        logits = self.head(self.emb(input_ids[:, :-1]))
        out = {"logits": logits}
        out["loss"] = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1)
        )
        return out


def clean_rows(n: int, gen: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, VOCAB, (n, 1), generator=gen)
    return (start + torch.arange(SEQ)) % VOCAB


def corrupted_rows(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=gen)


def eval_loss(model: torch.nn.Module) -> float:
    """Loss on every clean sequence (one per start token)."""
    rows = (torch.arange(VOCAB)[:, None] + torch.arange(SEQ)) % VOCAB
    with torch.no_grad():
        return float(model(rows)["loss"])


class Samples(torch.utils.data.Dataset):
    """``n`` samples, the ``poisoned`` ones corrupted: ``{"input_ids", "sample_id"}``."""

    def __init__(self, n: int, poisoned: set[int], seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.rows = clean_rows(n, gen)
        for i in sorted(poisoned):
            self.rows[i] = corrupted_rows(1, gen)[0]
        self.poisoned = poisoned

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i], "sample_id": i}
