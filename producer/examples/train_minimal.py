"""A tiny training loop on the CPU, instrumented with steplens.

    STEPLENS_KAFKA_BOOTSTRAP=127.0.0.1:19092 python producer/examples/train_minimal.py --steps 200

Kafka's address comes from STEPLENS_KAFKA_BOOTSTRAP (default 127.0.0.1:19092). When Kafka cannot
be reached the records go to the disk spool (STEPLENS_SPOOL_DIR) and are replayed by the next
run of the same run id and rank; the script still exits 0. The last line it prints is the
producer's counters as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import steplens.producer as sl

VOCAB, SEQ_LEN, DIM = 64, 16, 32


def make_data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (n, SEQ_LEN), generator=g)
    lengths = torch.randint(4, SEQ_LEN + 1, (n,), generator=g)
    mask = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
    labels = (ids * mask).sum(1) % 2  # a toy task: parity of the token sum
    return TensorDataset(ids * mask, mask, labels)


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM, mode="sum")
        self.head = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, 2))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.float()
        pooled = self.embed(ids, per_sample_weights=weights) / weights.sum(1, keepdim=True)
        return self.head(pooled)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--run-id", default=None, help="default: STEPLENS_RUN_ID or a new id")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    loader = DataLoader(make_data(4096), batch_size=32, shuffle=True)
    params = sum(p.numel() for p in model.parameters())

    monitor = sl.init(
        args.run_id,
        flops_per_token=6.0 * params,
        peak_flops=1e12,
        lr_schedule={"kind": "cosine", "peak_lr": 3e-3, "total_steps": args.steps},
        model_info={"name": "tiny-classifier", "n_params": params},
    )
    sl.watch(model, optimizer, scheduler, every=10)
    step = 0
    while step < args.steps:
        for ids, mask, labels in sl.timed(loader):
            logits = model(ids, mask)
            loss = nn.functional.cross_entropy(logits, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            # a 0-dim tensor is fine: the producer reads it in its own thread
            sl.log_step(
                step,
                loss=loss.detach(),
                lr=scheduler.get_last_lr()[0],
                tokens=int(mask.sum()),
            )
            if step % 50 == 0:
                sl.log_batch(step, ids, attention_mask=mask, labels=labels, max_len=12)
                with torch.no_grad():
                    accuracy = (logits.argmax(1) == labels).float().mean()
                sl.log_eval(step, split="val", loss=loss.detach(), accuracy=accuracy)
            step += 1
            if step >= args.steps:
                break
    delivered = sl.flush(timeout_s=30.0)  # returns as soon as all is delivered
    sl.shutdown()
    print(json.dumps({"run_id": monitor.run_id, "delivered": delivered, **monitor.stats()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
