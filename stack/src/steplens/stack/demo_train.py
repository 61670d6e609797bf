"""The demo's training run: a small transformer LM on the CPU, instrumented with steplens.

Run it as 2 ranks::

    torchrun --nproc-per-node 2 -m steplens.stack.demo_train --steps 600

Each rank trains on its own stream of the synthetic corpus (``demo_corpus``); gradients are
averaged with one all-reduce per step (gloo). The scripted incidents of ``demo_incidents`` are
injected at their steps and announced in the log as they start.

It instruments itself exactly as the README's snippet shows, at the producer's defaults
(windows of 100 steps, one step in 100 raw): ``init``, ``watch(every=10)``, ``timed(loader)``
(whose dict batches also give the data-quality checks), ``log_step`` with the loss and the
gradient norm ``clip_grad_norm_`` returns, ``log_eval`` and ``shutdown``; and the README's
opt-in remedies: ``init(remedies=...)``, ``skipping(loader)``, ``checkpoint`` and ``act``
(inert without ``--act``). A test holds the two to the same calls.

Incidents follow the loop's iterations (its wall progress), not the model's step nor the
batches read: a rewind sends the step back and skips batches, and the run meets each
incident once, as a bad moment happens once; a bad shard (``--scenario bad_shard``) comes back
at its iterations until its samples are skipped. ``--scenario``: one of ``demo_scenarios``
instead of the demo's incident plan; each iteration's batch then comes from its own seed, so
the run with remedies and the run without train on the same batches except where a remedy
changed them (a skipped batch is replaced, not the rest shifted). ``--loss-file``: rank 0
writes each iteration's loss, the held-out loss at the end and what the remedies did (JSON
lines), for the demo's comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from steplens.stack.demo_corpus import PAD, VOCAB, Grammar, make_batch
from steplens.stack.demo_incidents import Incident, plan_incidents, save_plan
from steplens.stack.demo_scenarios import SCENARIOS, plan_scenario, visits

# Nominal peak of one CPU core for the MFU figure (the demo runs one thread per rank).
CPU_PEAK_FLOPS = 5.0e10
REMEDIES = ["skip_samples", "rewind", "lower_lr", "profile"]
KEEP_CHECKPOINTS = 8
TIMING_INCIDENTS = ("stall", "straggler")  # they change no number of the run
MAX_ITERATIONS = 3  # a run with remedies stops after 3x its steps of iterations, rewound or not


class TinyLM(nn.Module):
    """Decoder-only transformer: token + position embeddings, pre-norm blocks, tied head."""

    def __init__(
        self, vocab: int, seq_len: int, d_model: int = 64, n_layers: int = 2, n_heads: int = 4
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.causal: torch.Tensor
        self.register_buffer(
            "causal", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False
        )
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(n, device=ids.device))
        x = self.blocks(x, mask=self.causal[:n, :n], is_causal=True)
        return self.norm(x) @ self.tok.weight.T


def lm_loss(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Next-token cross entropy over non-padding targets; also the number of target tokens."""
    logits = model(ids[:, :-1])
    targets = ids[:, 1:]
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=PAD
    )
    return loss, int((targets != PAD).sum())


def cosine_lr(step: int, peak: float, floor: float, warmup: int, total: int) -> float:
    """The declared schedule: linear warm-up, then cosine from ``peak`` down to ``floor``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


class Incidents:
    """Decides, iteration by iteration, what goes wrong on this rank; announces each incident
    once. Keyed by the loop's iterations, not the model's step: a rewind does not replay them."""

    def __init__(self, plan: list[Incident], rank: int, log_file: Path | None) -> None:
        self.plan = plan
        self.rank = rank
        self.log_file = log_file
        self.announced: set[str] = set()

    def active(self, kind: str, it: int) -> Incident | None:
        for inc in self.plan:
            if inc.kind == kind and inc.covers(it):
                return inc
        return None

    def shard_visit(self, it: int) -> bool:
        """Whether the bad shard's samples come back at iteration ``it`` (they recur)."""
        return any(it in visits(i) for i in self.plan if i.kind == "bad_shard")

    def announce(self, it: int) -> None:
        for inc in self.plan:
            if inc.first_step == it and inc.kind not in self.announced:
                self.announced.add(inc.kind)
                if self.rank != 0:
                    continue
                where = "every rank" if inc.rank is None else f"rank {inc.rank}"
                print(
                    f"[demo] INCIDENT {inc.kind} starts at step {it} on {where}: {inc.description}",
                    flush=True,
                )
                if self.log_file is not None:
                    with self.log_file.open("a") as f:
                        f.write(
                            json.dumps({"kind": inc.kind, "step": it, "time_ns": time.time_ns()})
                            + "\n"
                        )


def corrupted_batch(rng: np.random.Generator, batch: int, seq_len: int) -> np.ndarray:
    """Random tokens in every position, rows twice the allowed length (as a broken tokenizer)."""
    return rng.integers(3, len(VOCAB), size=(batch, 2 * seq_len), dtype=np.int64)


def save_checkpoint(folder: Path, step: int, state: tuple[Any, Any, Any], rank: int) -> str:
    """Rank 0 saves the model, optimizer and scheduler (replicas are identical); every rank
    reports the same path. The last ``KEEP_CHECKPOINTS`` are kept."""
    path = folder / f"step-{step}.pt"
    if rank == 0:
        tmp = path.with_suffix(".tmp")
        model, optimizer, scheduler = state
        saved = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        torch.save({k: v.state_dict() for k, v in saved.items()}, tmp)
        tmp.replace(path)
        for old in sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem[5:]))[
            :-KEEP_CHECKPOINTS
        ]:
            old.unlink(missing_ok=True)
    return str(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run-id", default=os.environ.get("STEPLENS_RUN_ID") or "")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=48)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--log-every", type=int, default=25, help="print progress every N steps")
    p.add_argument("--stall-s", type=float, default=75.0)
    p.add_argument("--slow-s", type=float, default=0.5)
    p.add_argument("--no-incidents", action="store_true")
    p.add_argument("--scenario", choices=SCENARIOS, default=None, help="demo --act's scenarios")
    p.add_argument(
        "--no-timing-incidents",
        action="store_true",
        help="leave out the stall and the straggler (the losses are the same without them)",
    )
    p.add_argument("--act", action="store_true", help="opt into every remedy (init remedies)")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="checkpoints without --act too"
    )
    p.add_argument("--loss-file", type=Path, default=None, help="rank 0: each step's loss")
    p.add_argument(
        "--incidents-file",
        type=Path,
        default=None,
        help="rank 0 writes the incident plan here (JSON) and the starts to FILE.log",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--step-s",
        type=float,
        default=0.0,
        help="each iteration takes at least this long (the rest is slept, as a larger model's "
        "step would take): a run's steps a second then do not depend on the machine",
    )
    return p.parse_args(argv)


def _flat_allreduce(params: list[nn.Parameter], world: int) -> None:
    """Average gradients across ranks with one all-reduce of a flat buffer."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[torch.Tensor]) -> dict[str, Any]:
    model.eval()
    total, count, correct = 0.0, 0, 0
    for ids in batches:
        logits = model(ids[:, :-1])
        targets = ids[:, 1:]
        keep = targets != PAD
        ce = nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum")
        total += float(ce)
        count += int(keep.sum())
        correct += int((logits.argmax(-1)[keep] == targets[keep]).sum())
    model.train()
    loss = total / max(1, count)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "accuracy": correct / max(1, count),
    }


def train(args: argparse.Namespace) -> int:
    import steplens.producer as sl
    from steplens.producer import get_monitor

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # same initial weights on every rank
    run_id = args.run_id or f"demo-{uuid.uuid4().hex[:8]}"

    if args.scenario is not None:
        plan = plan_scenario(args.scenario, args.steps, args.batch_size, world)
    elif args.no_incidents:
        plan = []
    else:
        plan = plan_incidents(args.steps, args.stall_s, args.slow_s)
    if args.no_timing_incidents:
        plan = [i for i in plan if i.kind not in TIMING_INCIDENTS]
    starts_log = None
    if args.incidents_file is not None:
        starts_log = args.incidents_file.with_suffix(".starts.jsonl")
        if rank == 0:
            save_plan(plan, args.incidents_file)
            starts_log.write_text("")
    incidents = Incidents(plan, rank, starts_log)

    model = TinyLM(len(VOCAB), args.seq_len)
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup, floor = max(10, args.steps // 20), args.lr / 10
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: cosine_lr(s, args.lr, floor, warmup, args.steps) / args.lr
    )

    # --- steplens: the lines a user adds to a training script (the README's) ---------------
    sl.init(
        run_id=run_id,
        flops_per_token=6.0 * n_params,
        peak_flops=CPU_PEAK_FLOPS,
        lr_schedule={
            "kind": "cosine",
            "peak_lr": args.lr,
            "min_lr": floor,
            "warmup_steps": warmup,
            "total_steps": args.steps,
        },
        model_info={"seq_len": args.seq_len},
        remedies=REMEDIES if args.act else [],
    )
    sl.watch(model, optimizer, scheduler, every=10, max_grad_norm=1.0)
    # ----------------------------------------------------------------------------------------
    ckpt_dir = args.checkpoint_dir or Path(tempfile.gettempdir()) / f"steplens-{run_id}"
    checkpoints = args.act or args.checkpoint_dir is not None
    if checkpoints and rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    losses = open(args.loss_file, "w") if args.loss_file and rank == 0 else None  # noqa: SIM115
    grammar = Grammar(np.random.default_rng(args.seed + 1 + rank))
    eval_grammar = Grammar(np.random.default_rng(args.seed + 10_000))
    eval_batches = [
        torch.from_numpy(make_batch(eval_grammar, 32, args.seq_len)[0]) for _ in range(2)
    ]
    dup_pool = make_batch(Grammar(np.random.default_rng(args.seed + 77)), 4, args.seq_len)
    noise = np.random.default_rng(args.seed + 99 + rank)
    # the bad shard: this rank's share of it, the same rows at every visit
    shard = corrupted_batch(
        np.random.default_rng(args.seed + 555 + rank), args.batch_size, args.seq_len
    )
    if rank == 0:
        print(
            f"[demo] run {run_id}: {n_params:,} parameters, {world} rank(s), "
            f"{args.steps} steps of {args.batch_size}x{args.seq_len} tokens",
            flush=True,
        )

    at = [0]  # the loop's iteration the next batch is for: incidents follow it

    def batches() -> Iterator[dict[str, Any]]:
        """This rank's batches, as a collator gives them (with their samples' ids), incidents
        included.

        A straggler's delay happens here, so it shows as data loading time (``sl.timed``); a
        corrupted batch has over-length rows, of which the model reads the first ``seq_len``."""
        slept, hit, last, k = -1, -1, -1, 0
        while True:
            it = at[0]
            k, last = (k + 1 if it == last else 0), it  # k: batches drawn for this iteration
            if args.scenario is not None:  # twins differ only where a remedy changed the data
                grammar.rng = np.random.default_rng([args.seed + 1, rank, it, k])
            ids_np, mask_np = make_batch(grammar, args.batch_size, args.seq_len)
            names = [f"{rank}:{it}.{k}:{i}" for i in range(args.batch_size)]
            if incidents.active("duplicates", it):
                rows = noise.integers(0, 4, size=args.batch_size)
                ids_np, mask_np = dup_pool[0][rows], dup_pool[1][rows]
            bad = incidents.active("corrupted_batch", it) or incidents.active("blip", it)
            if bad is not None and bad.rank == rank and hit != it:  # once, even if skipped
                hit = it
                ids_np = corrupted_batch(noise, args.batch_size, args.seq_len)
                mask_np = np.ones_like(ids_np)
            if k == 0 and incidents.shard_visit(it):
                ids_np, mask_np = shard, np.ones_like(shard)
                names = [f"shard:{rank}:{i}" for i in range(args.batch_size)]
            slow = incidents.active("straggler", it)
            if slow is not None and slow.rank == rank and slept != it:
                time.sleep(slow.params["slow_s"])
                slept = it
            yield {
                "input_ids": torch.from_numpy(ids_np),
                "attention_mask": torch.from_numpy(mask_np),
                "sample_ids": names,
            }

    t_begin = time.perf_counter()
    step = it = 0  # the model's step (a rewind sends it back) and the loop's iteration
    for batch in sl.timed(sl.skipping(batches())):
        if step >= args.steps or it >= MAX_ITERATIONS * args.steps:
            break
        t_step = time.perf_counter()
        incidents.announce(it)
        stall = incidents.active("stall", it)
        if stall is not None and stall.rank == rank:
            time.sleep(stall.params["stall_s"])
        ids = batch["input_ids"][:, : args.seq_len]

        loss, n_tokens = lm_loss(model, ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if world > 1:
            _flat_allreduce(params, world)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        blow = incidents.active("lr_blowup", it)
        if blow is not None:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * blow.params["factor"]
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()  # back on the declared schedule after a blow-up

        sl.log_step(step, loss=loss, grad_norm=grad_norm, tokens=n_tokens)
        if rank == 0 and args.eval_every and (step + 1) % args.eval_every == 0:
            sl.log_eval(step, **evaluate(model, eval_batches))
        if checkpoints and step % args.checkpoint_every == 0:
            path = save_checkpoint(ckpt_dir, step, (model, optimizer, scheduler), rank)
            sl.checkpoint(step, path)
        if args.scenario == "bad_shard":  # the shard's rows trained on, every rank's
            bad = torch.tensor([sum(str(n).startswith("shard:") for n in batch["sample_ids"])])
            if world > 1:
                dist.all_reduce(bad)
        if losses is not None:
            row: dict[str, Any] = {"it": it, "step": step, "loss": float(loss.detach())}
            if args.scenario == "bad_shard" and int(bad):
                row["shard_rows"] = int(bad)
            losses.write(json.dumps(row) + "\n")
        if rank == 0 and args.log_every and (it % args.log_every == 0 or step == args.steps - 1):
            elapsed = time.perf_counter() - t_begin
            print(
                f"[demo] step {step + 1}/{args.steps}  loss {loss.item():.3f}  "
                f"lr {lr:.2e}  grad {float(grad_norm):.2f}  {elapsed:.0f}s",
                flush=True,
            )
        # what the stream jobs advised (run-wide: every rank at the same step); a rewind
        # goes back to its checkpoint's step, as a restart from it would
        step = sl.act(step) + 1
        it += 1
        at[0] = it
        if args.step_s > 0:
            time.sleep(max(0.0, args.step_s - (time.perf_counter() - t_step)))

    if losses is not None:
        final = evaluate(model, eval_batches)["loss"]  # the held-out loss the run ends with
        losses.write(json.dumps({"final": final, "iterations": it}) + "\n")
        monitor = get_monitor()  # the remedies' answers, for the comparison (no instrumentation)
        for answer in monitor.remedies.answers if monitor is not None else ():
            keys = ("action", "fingerprint", "outcome", "detail", "step")
            losses.write(json.dumps({"acted": dict(zip(keys, answer, strict=True))}) + "\n")
        losses.close()
    sl.shutdown()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
