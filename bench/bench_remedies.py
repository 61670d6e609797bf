"""Cost of the remedies in the training loop, as ratios measured in the same run.

1. ``act(step)`` with every remedy on and no advice waiting, against a no-op call (one rank:
   no agreement collective).
2. Iterating a DataLoader-like list of 16x48 token batches through ``skipping()``: with
   nothing named, and with 65,536 hashes named (every row hashed on the host), against
   iterating the list itself; and against the same batches' training step of a small model
   (a 2-layer MLP LM on the CPU), so the cost reads as a share of a real step.

    python bench/bench_remedies.py        # about 20 seconds
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

ROUNDS = 7


def per_call(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def per_batch(batches: Callable[[], Iterable[Any]], n: int) -> float:
    t0 = time.perf_counter()
    for _ in batches():
        pass
    return (time.perf_counter() - t0) / n


def median_of(fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(ROUNDS))


def main() -> None:
    import torch

    from steplens.producer.delivery.transport import MemoryTransport
    from steplens.producer.monitor import Monitor

    torch.set_num_threads(1)
    m = Monitor(
        f"bench-{uuid.uuid4().hex[:6]}",
        transport=MemoryTransport(),
        hw_interval_s=0,
        remedies=["skip_samples", "rewind", "lower_lr", "profile"],
    )

    def noop(step: int = 0) -> int:
        return step

    n = 20_000
    base = median_of(lambda: per_call(noop, n))
    act = median_of(lambda: per_call(lambda: m.act(1), n))
    print(f"act(step), no advice: {act * 1e6:.2f} us/call; {act / base:.1f}x a no-op call")

    gen = torch.Generator().manual_seed(0)
    batches = [
        {
            "input_ids": torch.randint(3, 64, (16, 48), generator=gen),
            "attention_mask": torch.ones(16, 48, dtype=torch.long),
        }
        for _ in range(200)
    ]
    plain = median_of(lambda: per_batch(lambda: batches, len(batches)))
    quiet = m.skipping(batches)
    empty = median_of(lambda: per_batch(lambda: quiet, len(batches)))
    m.remedies.skips.add(hashes=[f"{i:016x}" for i in range(65_536)])
    named = median_of(lambda: per_batch(lambda: quiet, len(batches)))

    model = torch.nn.Sequential(
        torch.nn.Embedding(64, 128), torch.nn.Linear(128, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 64),
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def steps() -> float:
        t0 = time.perf_counter()
        for b in batches[:50]:
            ids = b["input_ids"]
            loss = torch.nn.functional.cross_entropy(
                model(ids[:, :-1]).reshape(-1, 64), ids[:, 1:].reshape(-1)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.perf_counter() - t0) / 50

    step = median_of(steps)
    print(f"a training step of the small model: {step * 1e3:.2f} ms")
    for name, t in (("nothing named", empty), ("65,536 hashes named", named)):
        extra = max(0.0, t - plain)
        print(
            f"skipping(), {name}: {t * 1e6:.1f} us/batch ({t / plain:.1f}x iterating the list;"
            f" +{extra * 1e6:.1f} us = {100 * extra / step:.2f} % of a step)"
        )
    m.shutdown(2)


if __name__ == "__main__":
    main()
