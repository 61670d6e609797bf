"""What steplens costs a real training loop: the demo's model with and without telemetry.

Runs the demo's small transformer (CPU, one process, one thread) for N steps in alternating
rounds: plain, then instrumented exactly as the demo does it (``init``, ``watch(every=1)``,
``log_batch`` and ``log_step`` every step, hardware sampler on). Prints the median step time of
each and their ratio, measured in the same run. ``--kafka`` sends to the local Kafka instead of
the in-memory transport.

    python bench/bench_e2e_training_overhead.py            # about 40-90 s
    python bench/bench_e2e_training_overhead.py --steps 400 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import numpy as np
import torch

import steplens.producer as sl
from steplens.stack.demo_corpus import VOCAB, Grammar, make_batch
from steplens.stack.demo_train import TinyLM, lm_loss


def run(steps: int, instrumented: bool, kafka: bool, seed: int) -> list[float]:
    torch.manual_seed(seed)
    model = TinyLM(len(VOCAB), 48)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    grammar = Grammar(np.random.default_rng(seed))
    batches = [make_batch(grammar, 16, 48) for _ in range(steps)]
    if instrumented:
        transport = None if kafka else sl.MemoryTransport()
        sl.init(run_id=f"bench-{uuid.uuid4().hex[:6]}", sample_rate=1.0, transport=transport)
        sl.watch(model, opt, every=1)
    times = []
    for step, (ids_np, mask_np) in enumerate(batches):
        t0 = time.perf_counter()
        ids = torch.from_numpy(ids_np)
        if instrumented:
            sl.log_batch(step, ids, attention_mask=torch.from_numpy(mask_np), max_len=48)
        loss, n_tokens = lm_loss(model, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if instrumented:
            sl.log_step(step, loss=loss.detach(), lr=3e-3, grad_norm=grad_norm, tokens=n_tokens)
        times.append(time.perf_counter() - t0)
    if instrumented:
        sl.shutdown()
    return times[10:]  # skip the first steps (allocator, lazy init)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kafka", action="store_true", help="send to STEPLENS_KAFKA_BOOTSTRAP")
    args = p.parse_args()
    torch.set_num_threads(1)
    plain: list[float] = []
    inst: list[float] = []
    for r in range(args.rounds):  # alternate, so drift on a shared machine hits both
        plain += run(args.steps, False, args.kafka, r)
        inst += run(args.steps, True, args.kafka, r)
    p50_plain, p50_inst = statistics.median(plain), statistics.median(inst)
    q = statistics.quantiles
    p90_plain, p90_inst = q(plain, n=10)[-1], q(inst, n=10)[-1]
    where = "kafka" if args.kafka else "memory transport"
    print(f"steps per variant: {len(plain)} ({args.rounds} rounds), telemetry to {where}")
    print(f"plain        p50 {p50_plain * 1e3:7.2f} ms   p90 {p90_plain * 1e3:7.2f} ms")
    print(f"instrumented p50 {p50_inst * 1e3:7.2f} ms   p90 {p90_inst * 1e3:7.2f} ms")
    print(
        f"ratio instrumented/plain: p50 {p50_inst / p50_plain:.3f}  p90 {p90_inst / p90_plain:.3f}"
    )


if __name__ == "__main__":
    main()
