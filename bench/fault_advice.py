"""Fault scenario (j) of ``bench_faults.py``: hostile advice against a run that opted into remedies.

Two ranks train a small regressor as the README's loop does (``watch``, ``skipping``,
``checkpoint`` every 100 steps, ``act`` every step; remedies ``skip_samples``, ``rewind`` and
``lower_lr``; a constant lr of 0.1 declared). A stranger who can read the raw topic and write
the advice topic waits for the run's first checkpoint record after step 0 and then sends, keyed
by the run unless said otherwise:

- a ``lower_lr`` with ``lr_factor`` 5e-324 (the smallest float above 0);
- a ``rewind`` to the checkpoint the run reported, skipping 10^9 batches;
- a ``rewind`` to a file the run never reported;
- 3,000 ``lower_lr`` x0.5, each with a new fingerprint;
- advice without a key, advice keyed for another run, and advice for another run under this
  run's key.

Held (the line says each): every message accounted for by every rank (let through or refused
with a counted reason), the lr never below its floor (0.1 of the schedule's), both ranks train
to their last step, and rank 0 dead-letters each message that is not advice for this run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from steplens.schema import RUN_RANK, Record, decode, encode, make_record

REMEDIES = ["skip_samples", "rewind", "lower_lr"]
PEAK_LR = 0.1
FLOOR = 0.1  # the producer's default lr_floor: a share of the declared schedule's lr
FLOOD = 3000
STRANGERS = 10  # of each kind: no key, another run's key, another run under this key
CHECKPOINT_EVERY = 100
# counts of the advice inbox that are not one per message (forgotten, unanswered, dropped)
NOT_PER_MESSAGE = {"seen_forgotten", "refused_unanswered", "queue_full"}


def advised_rank(run_id: str, steps: int, step_s: float, ckpt_dir: str) -> int:
    """A rank that follows the README's loop with remedies on; prints what it saw as JSON."""
    import torch

    import steplens.producer as sl

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=PEAK_LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _s: 1.0)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(16, 1, generator=gen)
    loader = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=gen)
        loader.append((x, x @ w + 0.1 * torch.randn(32, 1, generator=gen)))
    monitor = sl.init(
        run_id=run_id,
        full_resolution=True,
        hw_interval_s=0,
        delivery_timeout_s=5,
        lr_schedule={"kind": "constant", "peak_lr": PEAK_LR},
        remedies=REMEDIES,
    )
    sl.watch(model, opt, sched, every=10)
    min_lr, trained, last = PEAK_LR, 0, -1
    for step, (x, y) in enumerate(sl.timed(sl.skipping(loader))):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        sl.log_step(step, loss=loss, grad_norm=grad_norm)
        if step % CHECKPOINT_EVERY == 0:
            path = Path(ckpt_dir) / f"rank{monitor.identity.rank}-{step}.pt"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
            sl.checkpoint(step, path)
        sl.act(step)
        min_lr = min(min_lr, opt.param_groups[0]["lr"])
        trained, last = trained + 1, step
        time.sleep(step_s)
    sl.shutdown(timeout_s=120)
    stats = monitor.stats()
    seen = {
        "trained": trained,
        "last_step": last,
        "min_lr": min_lr,
        "final_lr": opt.param_groups[0]["lr"],
        "advice": stats["advice"] or {},
        "received": stats["advice_received"],
        "remedies": stats["remedies"],
    }
    print(json.dumps(seen), flush=True)
    return 0


def start_ranks(
    env: dict[str, str], run_id: str, ranks: int, steps: int, step_s: float, root: Path
) -> list[subprocess.Popen[str]]:
    ckpt = root / "checkpoints"
    ckpt.mkdir(exist_ok=True)
    procs = []
    for rank in range(ranks):
        cmd = [sys.executable, __file__, run_id, str(steps), str(step_s), str(ckpt)]
        renv = {**env, "RANK": str(rank), "WORLD_SIZE": str(ranks)}
        log = (root / f"rank{rank}.log").open("w")
        procs.append(
            subprocess.Popen(cmd, env=renv, stdout=log, stderr=subprocess.STDOUT, text=True)
        )
    return procs


def first_checkpoint(bootstrap: str, raw_topic: str, run_id: str, timeout_s: float) -> Record:
    """What any reader of the raw topic learns: the run's first checkpoint after step 0."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"stranger-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([raw_topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=1.0):
                rec = decode(msg.value()) if msg.error() is None else None
                if (
                    isinstance(rec, Record)
                    and rec.kind == "checkpoint"
                    and rec.run_id == run_id
                    and (rec.step or 0) > 0
                ):
                    return rec
    finally:
        consumer.close()
    raise RuntimeError(f"no checkpoint of {run_id} on {raw_topic} within {timeout_s:.0f} s")


def forged(run_id: str, ckpt: Record) -> list[tuple[str, bytes | None, bytes]]:
    """(what, key, value) of every message the stranger sends, in order."""
    at = (ckpt.step or 0) + 30  # ahead of the run, as the stream jobs would set it
    key = run_id.encode()

    def advice(data: dict[str, Any], run: str = run_id) -> bytes:
        rec = make_record(
            "advice", data, run_id=run, rank=RUN_RANK, step=ckpt.step, time_ns=time.time_ns()
        )
        return encode(rec)

    out: list[tuple[str, bytes | None, bytes]] = [
        (
            "vanishing lr_factor",
            key,
            advice(
                {"action": "lower_lr", "fingerprint": "tiny", "lr_factor": 5e-324, "at_step": at}
            ),
        ),
        (
            "rewind skipping 10^9 batches",
            key,
            advice(
                {
                    "action": "rewind",
                    "fingerprint": "billion",
                    "checkpoint": ckpt.data["path"],
                    "checkpoint_step": ckpt.step,
                    "skip_batches": 10**9,
                    "at_step": at,
                }
            ),
        ),
        (
            "rewind to an unreported file",
            key,
            advice(
                {
                    "action": "rewind",
                    "fingerprint": "elsewhere",
                    "checkpoint": "/tmp/not-a-checkpoint-of-this-run.pt",
                    "at_step": at,
                }
            ),
        ),
    ]
    for i in range(FLOOD):
        data = {"action": "lower_lr", "fingerprint": f"flood-{i}", "lr_factor": 0.5, "at_step": at}
        out.append(("flood", key, advice(data)))
    half = {"action": "lower_lr", "fingerprint": "x", "lr_factor": 0.5, "at_step": at}
    for i in range(STRANGERS):
        out.append(("no key", None, advice({**half, "fingerprint": f"nokey-{i}"})))
        out.append(("another run's key", b"another-run", advice({**half, "fingerprint": f"k{i}"})))
        other = advice({**half, "fingerprint": f"o{i}"}, run="another-run")
        out.append(("another run under this key", key, other))
    return out


def send(bootstrap: str, topic: str, messages: list[tuple[str, bytes | None, bytes]]) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failed: list[object] = []
    for _what, key, value in messages:
        producer.produce(
            topic, value, key=key, on_delivery=lambda err, _m: failed.append(err) if err else None
        )
        producer.poll(0)
    left = producer.flush(60)
    return len(messages) - left - len(failed)


def rank_seen(log: Path) -> dict[str, Any] | None:
    lines = log.read_text(errors="replace").strip().splitlines()
    try:
        return dict(json.loads(lines[-1])) if lines else None
    except ValueError:
        return None


def judge(
    seen: list[dict[str, Any] | None],
    sent: int,
    steps: int,
    messages: list[tuple[str, bytes | None, bytes]],
    lettered: int,
) -> tuple[str, bool]:
    """The scenario's line and whether everything held."""
    strangers = sum(1 for what, _, _ in messages if what == "another run under this key")
    parts, ok = [], sent == len(messages)
    for rank, s in enumerate(seen):
        if s is None:
            parts.append(f"rank {rank}: no report")
            ok = False
            continue
        counts = {k: v for k, v in s["advice"].items() if k not in NOT_PER_MESSAGE}
        accounted = s["received"] + sum(counts.values())
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["advice"].items()))
        bounds = ", ".join(f"{k} {v}" for k, v in sorted(s["remedies"].items())) or "none"
        floor = FLOOR * PEAK_LR
        held = (
            accounted == sent
            and s["min_lr"] >= floor * (1 - 1e-9)
            and s["trained"] == steps
            and s["last_step"] == steps - 1
        )
        ok = ok and held
        parts.append(
            f"rank {rank}: {accounted}/{sent} accounted (let through {s['received']}; {reasons};"
            f" remedies refused or held: {bounds}), lr min {s['min_lr']:.3g} (floor {floor:.3g}),"
            f" trained {s['trained']}/{steps} to step {s['last_step']}"
        )
    ok = ok and lettered == strangers
    parts.append(f"rank 0 dead-lettered {lettered} of {strangers} advice for another run")
    return f"{sent} of {len(messages)} forged messages sent; " + "; ".join(parts), ok


if __name__ == "__main__":
    run_id, steps, step_s, ckpt_dir = sys.argv[1:5]
    sys.exit(advised_rank(run_id, int(steps), float(step_s), ckpt_dir))
