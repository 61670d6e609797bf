"""Alerts judged on every client path: real CPU training of a tiny next-token model
(``tests/producer/tiny_lm.py``) through the plain loop (``timed`` over its batches,
``log_step`` each step; paths ``windowed`` and ``full``), the Hugging Face Trainer with
``SteplensCallback`` (``hf1``, ``hf10``, ``hf50``: its ``logging_steps``, the mean the Trainer
logs) or the Lightning Trainer with its ``SteplensCallback`` (``lightning``), each at the
callback's defaults; the records as the producer makes them (``Monitor`` with an in-memory
transport: windows, raw samples and guard flags at the defaults, or every step with
``full_resolution``), scored by the worker's detectors in-process (``RunDetector``, the pure
engine, as ``bench_stream_incidents.py`` does).

Schedules: cosine and linear to zero at the last step, warmup-stable-decay (the last fifth
decays, cosine, to zero) and constant, after a warmup; declared in ``run_meta`` by the plain
loop and Lightning, read by the Hugging Face callback from the Trainer's arguments.
``--accumulate N``: N micro-batches a step (gradient accumulation; a bad batch is one of them).
Incidents, from a step in the run's second half (the leak: a fifth): one corrupted batch
(random tokens), an lr blow-up (x30 for 4 steps; in the Trainers set on the optimizer outside
its scheduler, as a bug would), a data stall (for 40 steps each batch waits twice the run's
median step, at least ``--stall-ms``: the same share of a step on a loaded machine), a
straggler rank (two ranks in processes of their own, gloo, on every path: the plain loop's
``DistributedDataParallel``, the Hugging Face Trainer as ``torchrun`` starts it, each rank
reading its own shard of an iterable dataset, Lightning's ``ddp`` strategy; for 40 steps rank 1
waits for each batch as the stall does, while rank 0 waits for it at the all-reduce), a slow
memory leak (from a fifth of the run to its end the loop keeps 40 MiB of every second,
touched, while steps take at least 60 ms, so the producer's health readings, every 5 s at its
defaults and sent as the memory grows, see a minute of it); and healthy runs of ``--healthy``
steps.

Printed per path, schedule and incident: whether it was paged (an incident that opened from
its first step to ``--tolerance`` steps after its last), the delay in steps and in logged
points (the records of its rank with a step in between: windows and raw steps, or steps), and
whether the incident's lead rule names the cause, and the event's best score among its cause's
rules against the 99.99th percentile of the same rule's scores in the path's healthy runs; per
path, the pages per 10,000 healthy steps (every incident opened in a healthy run, or before or
after the fault in a faulty one, over the steps outside it) and the events paged again (a
second incident opened within the fault's steps and ``--tolerance``).

    python bench/bench_client_paths.py                      # about an hour on 2 cores
    python bench/bench_client_paths.py --paths hf10,lightning --schedules cosine --healthy 2000
"""

from __future__ import annotations

import argparse
import logging
import pickle
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "producer"))
from tiny_lm import LIGHTNING_CPU, VOCAB, TinyLM, clean_rows, corrupted_rows

from steplens.producer import MemoryTransport
from steplens.producer.monitor import Monitor
from steplens.stream_jobs.engine.core import NO_STEP
from steplens.stream_jobs.engine.detector import RunDetector

PEAK, WARMUP, BATCH = 0.05, 50, 32
NOISE = 0.2  # share of a healthy batch's tokens drawn at random
# the words a lead rule of each cause has
CAUSES = {
    "bad_batch": ("spike:loss", "correlation:loss_grad", "data:", "nonfinite"),
    "lr_blowup": ("lr_schedule", "spike:", "correlation:loss_grad", "nonfinite"),
    "data_stall": ("threshold:data_wait_share", "correlation:data_bottleneck"),
    "straggler": ("straggler",),
    "memory_leak": ("memory:rss_growth", "threshold:host_mem_available_pct"),
}
INCIDENTS = ("bad_batch", "lr_blowup", "data_stall", "straggler", "memory_leak")
LEAK_BYTES_S = 40 << 20  # what a leaking run keeps, per second of its steps
LEAK_STEP_S = 0.06  # a leaking run's steps take this long at least (health read every 5 s)


@dataclass
class Outcome:
    path: str
    schedule: str
    incident: str | None
    steps: int
    start: int | None
    last: int | None
    pages: list[tuple[str, int]]  # (lead rule, step) of each incident opened
    points: list[int]  # steps of rank 0's logged points (windows' last steps, raw steps)
    scores: dict[str, list[tuple[int, float]]]  # rule -> (step, score) of the cause's signals


def noisy_rows(n: int, gen: torch.Generator) -> torch.Tensor:
    """Clean rows with ``NOISE`` of their tokens random: the loss settles at the noise's
    entropy (not at 0, where any wobble is a large relative rise) and no two rows repeat."""
    rows = clean_rows(n, gen)
    swap = torch.rand(rows.shape, generator=gen) < NOISE
    return torch.where(swap, torch.randint(0, VOCAB, rows.shape, generator=gen), rows)


def schedule_of(kind: str, steps: int) -> dict:
    """The declared schedule of ``kind`` over ``steps``."""
    if kind == "constant":
        return {"kind": "constant", "peak_lr": PEAK}
    base = {"peak_lr": PEAK, "warmup_steps": WARMUP, "total_steps": steps, "min_lr": 0.0}
    if kind == "wsd":
        return {**base, "kind": "wsd", "decay_steps": steps // 5, "decay_type": "cosine"}
    return {**base, "kind": kind}


def hf_scheduler(kind: str, steps: int) -> dict:
    """The Trainer's arguments for the same schedule."""
    if kind == "constant":
        return {"lr_scheduler_type": "constant", "warmup_steps": 0}
    if kind == "wsd":
        decay = {"num_decay_steps": steps // 5, "decay_type": "cosine"}
        return {
            "lr_scheduler_type": "warmup_stable_decay",
            "lr_scheduler_kwargs": decay,
            "warmup_steps": WARMUP,
        }
    return {"lr_scheduler_type": kind, "warmup_steps": WARMUP}


def lr_at(sched: dict, step: int) -> float:
    from steplens.stream_jobs.engine.signals.lr_schedule import expected_lr

    return float(expected_lr(sched, step) or 0.0)


def monitor(
    name: str,
    transport: MemoryTransport,
    sched: dict | None,
    spool: str,
    full_resolution: bool = False,
    rank: int = 0,
    world: int = 1,
) -> Monitor:
    """A rank of a run on one node at the producer's defaults, its records kept in memory."""
    return Monitor(
        name,
        transport=transport,
        rank=rank,
        local_rank=rank,
        world_size=world,
        hw_interval_s=0,
        remedies=None,
        lr_schedule=sched,
        spool_dir=spool,
        full_resolution=full_resolution,
    )


@dataclass
class Run:
    path: str
    schedule: str
    incident: str | None
    steps: int
    seed: int
    stall_s: float  # the least a stalled batch waits
    accumulate: int = 1
    rank: int = 0  # of a straggler's two
    kept: list[bytes] = field(default_factory=list)  # what a leak keeps
    leaked_at: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between the first steps' batches
    last_batch: float | None = None

    @property
    def name(self) -> str:
        return f"{self.path}-{self.schedule}-{self.incident or 'healthy'}"

    @property
    def start(self) -> int | None:
        if self.incident == "memory_leak":
            return self.steps // 5  # a slow leak needs a minute of health readings
        return self.steps * 3 // 5 if self.incident else None

    @property
    def last(self) -> int | None:
        start = self.start
        if start is None:
            return None
        if self.incident == "memory_leak":
            return self.steps - 1  # to the end
        return start + {"bad_batch": 0, "lr_blowup": 3}.get(self.incident or "", 39)

    def rows(self, step: int, gen: torch.Generator) -> list[torch.Tensor]:
        """The micro-batches of ``step`` (the first one corrupted at a bad batch), after the
        stall's wait: twice the median step of the run's first 100 (at least ``stall_s``), so
        the stall is the same share of a step on an idle or a loaded machine."""
        now = time.perf_counter()
        if self.last_batch is not None and len(self.gaps) < 100:
            self.gaps.append(now - self.last_batch)
        self.last_batch = now
        waits = self.incident == "data_stall" or (self.incident == "straggler" and self.rank == 1)
        if waits and self.start <= step <= self.last:  # type: ignore[operator]
            typical = float(np.median(self.gaps)) if self.gaps else 0.0
            time.sleep(max(self.stall_s, 2.0 * typical))
        out = [noisy_rows(BATCH, gen) for _ in range(self.accumulate)]
        if self.incident == "bad_batch" and step == self.start:
            out[0] = corrupted_rows(BATCH, gen)
        return out

    def leak(self, step: int) -> None:
        """A leaking loop keeps ``LEAK_BYTES_S`` of every second since its last step (touched
        bytes: resident), from the leak's first step on."""
        if step < self.start:  # type: ignore[operator]
            return
        now = time.perf_counter()
        if self.leaked_at is not None:
            self.kept.append(b"\x01" * int(LEAK_BYTES_S * (now - self.leaked_at)))
        self.leaked_at = now

    def end_step(self, step: int, began: float) -> None:
        """The end of ``step`` (begun at ``began``, ``perf_counter``): the leak kept, and a
        leaking run's step made to last ``LEAK_STEP_S`` (a larger model's)."""
        if self.incident != "memory_leak":
            return
        self.leak(step)
        time.sleep(max(0.0, LEAK_STEP_S - (time.perf_counter() - began)))

    @property
    def shift(self) -> int:
        """How much later than its batch's index the client logs the fault's first step: the
        Trainers number a step by the steps done (the batch of index s is their step s + 1),
        and their loaders read one batch ahead, so a wait for the batch of index s falls in
        their step s."""
        trainer = self.path.startswith("hf") or self.path == "lightning"
        return 1 if trainer and self.incident in ("bad_batch", "lr_blowup") else 0

    @property
    def world(self) -> int:
        return 2 if self.incident == "straggler" else 1

    def blown(self, step: int) -> bool:
        return self.incident == "lr_blowup" and self.start <= step <= self.last  # type: ignore[operator]


def train(run: Run) -> tuple[list, int | None, int | None]:
    """One run: its records (of every rank, in time order), and the fault's first and last
    step as the client logs them."""
    records = train_ranks(run) if run.world > 1 else train_rank(run)
    if run.start is None or run.last is None:
        return records, None, None
    return records, run.start + run.shift, run.last + run.shift


def train_rank(run: Run) -> list:
    """One rank of ``run`` through its path's client: its records."""
    if run.path.startswith("hf"):
        return train_hf(run, int(run.path[2:]))
    if run.path == "lightning":
        return train_lightning(run)
    torch.manual_seed(run.seed)
    transport = MemoryTransport()
    with tempfile.TemporaryDirectory() as spool:
        plain_loop(run, TinyLM(), transport, spool)
    return transport.records()


def plain_loop(run: Run, model: torch.nn.Module, transport: MemoryTransport, spool: str) -> None:
    """The README's loop: ``timed`` over the batches, ``log_step`` each step."""
    gen = torch.Generator().manual_seed(run.seed + run.rank)
    sched = schedule_of(run.schedule, run.steps)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK)
    mon = monitor(run.name, transport, sched, spool, run.path == "full", run.rank, run.world)
    batches = (run.rows(step, gen) for step in range(run.steps))
    for step, micro in enumerate(mon.timed(batches)):
        began = time.perf_counter()
        lr = lr_at(sched, step) * (30.0 if run.blown(step) else 1.0)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = torch.zeros(())
        for ids in micro:
            part = model(ids)["loss"] / len(micro)
            part.backward()
            loss += part.detach()
        grad = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        tokens = sum(ids.numel() for ids in micro)
        mon.log_step(step, loss=loss, lr=lr, grad_norm=grad, tokens=tokens)
        run.end_step(step, began)
    mon.shutdown()
    run.kept.clear()


def train_ranks(run: Run) -> list:
    """Two ranks of ``run``'s path on this machine (processes, gloo), rank 1 the straggler:
    its records and rank 0's, in time order."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        mp.spawn(_rank_main, args=(run, port, out), nprocs=2, join=True)
        records = []
        for rank in (0, 1):
            with open(Path(out) / f"rank{rank}.pkl", "rb") as f:
                records += pickle.load(f)
    return sorted(records, key=lambda r: r.time_ns)


def _rank_main(rank: int, run: Run, port: int, out: str) -> None:
    """A rank as ``torchrun`` starts it: the environment names it, its client joins the group
    (the plain loop itself, the Trainers from the environment)."""
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    logging.getLogger("steplens").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": run.world, "LOCAL_WORLD_SIZE": run.world}
    os.environ.update({k: str(v) for k, v in env.items()})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK="0")
    run = replace(run, rank=rank, gaps=[])
    if run.path in ("windowed", "full"):
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", rank=rank, world_size=run.world)
        torch.manual_seed(run.seed)
        transport = MemoryTransport()
        with tempfile.TemporaryDirectory() as spool:
            plain_loop(run, DistributedDataParallel(TinyLM()), transport, spool)
        records = transport.records()
    else:
        records = train_rank(run)
    with open(Path(out) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(records, f)
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_hf(run: Run, logging_steps: int) -> list:
    """One rank of a run through the Hugging Face Trainer at its defaults (AdamW, clipping at
    1.0, its own schedule, which the callback declares), logging every ``logging_steps``. With
    two ranks each reads its own shard of the iterable dataset (``dispatch_batches`` off: a
    rank that waits for its data waits alone)."""
    import transformers

    from steplens.producer.integrations.hf import SteplensCallback

    transformers.logging.set_verbosity_error()
    torch.manual_seed(run.seed)
    gen = torch.Generator().manual_seed(run.seed + run.rank)

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[dict]:
            for step in range(run.steps):
                for ids in run.rows(step, gen):
                    for _ in range(run.world):  # every rank's slot: each keeps its own
                        for row in ids:
                            yield {"input_ids": row}

    class Faults(transformers.TrainerCallback):
        """Before the monitor's callback: an lr set outside the scheduler, a leak kept and a
        step's floor slept inside the step (not in its wait for data)."""

        began = 0.0

        def on_step_begin(self, args, state, control, optimizer=None, **kw):  # type: ignore[no-untyped-def]
            self.began = time.perf_counter()
            if run.blown(state.global_step):
                for g in optimizer.param_groups:
                    g["lr"] *= 30.0  # the scheduler sets it back at its next step

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            run.end_step(state.global_step - 1, self.began)

    ranks = {}
    if run.world > 1:
        ranks = {"ddp_backend": "gloo", "accelerator_config": {"dispatch_batches": False}}
    transport = MemoryTransport()
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as spool:
        mon = monitor(run.name, transport, None, spool, rank=run.rank, world=run.world)
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=run.steps,
            per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=run.accumulate,
            learning_rate=PEAK,
            logging_steps=logging_steps,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            seed=run.seed,
            **ranks,
            **hf_scheduler(run.schedule, run.steps),
        )
        trainer = transformers.Trainer(
            model=TinyLM(),
            args=args,
            train_dataset=Rows(),
            callbacks=[Faults(), SteplensCallback(mon)],
        )
        trainer.remove_callback(transformers.PrinterCallback)  # its logs on stdout
        trainer.train()
        mon.shutdown()
    run.kept.clear()
    return transport.records()


def train_lightning(run: Run) -> list:
    """One run through the Lightning Trainer with the callback at its defaults: AdamW and the
    schedule as a per-step LambdaLR, declared at init as the README shows."""
    import lightning as L

    from steplens.producer.integrations.lightning import SteplensCallback

    torch.manual_seed(run.seed)
    gen = torch.Generator().manual_seed(run.seed + run.rank)
    sched = schedule_of(run.schedule, run.steps)

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[torch.Tensor]:
            for step in range(run.steps):
                yield from run.rows(step, gen)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = TinyLM()

        def training_step(self, ids: torch.Tensor, _i: int) -> torch.Tensor:
            return self.net(ids)["loss"]

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            opt = torch.optim.AdamW(self.parameters(), lr=PEAK)
            lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(sched, s) / PEAK)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": lam, "interval": "step"}}

    class Faults(L.Callback):
        """Before the monitor's callback: an lr set outside the scheduler, a leak kept and a
        step's floor slept inside the step (not in its wait for data)."""

        began = 0.0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):  # type: ignore[no-untyped-def]
            if batch_idx % run.accumulate:
                return
            self.began = time.perf_counter()
            if run.blown(trainer.global_step):
                for g in trainer.optimizers[0].param_groups:
                    g["lr"] *= 30.0  # the scheduler sets it back at its next step

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            if (batch_idx + 1) % run.accumulate:
                return
            run.end_step(trainer.global_step - 1, self.began)

    # two ranks: Lightning's ddp in processes started outside it, as torchrun does
    ranks = {"strategy": "ddp", "devices": run.world} if run.world > 1 else {}
    transport = MemoryTransport()
    with tempfile.TemporaryDirectory() as spool:
        mon = monitor(run.name, transport, sched, spool, rank=run.rank, world=run.world)
        trainer = L.Trainer(
            max_steps=run.steps,
            accumulate_grad_batches=run.accumulate,
            gradient_clip_val=1.0,
            **LIGHTNING_CPU,
            **ranks,
            callbacks=[Faults(), SteplensCallback(mon)],
        )
        loader = torch.utils.data.DataLoader(Rows(), batch_size=None)
        trainer.fit(Module(), loader)
        mon.shutdown()
    run.kept.clear()
    return transport.records()


def judge(
    records: list,
) -> tuple[list[tuple[str, int]], list[int], dict[str, list[tuple[int, float]]]]:
    """The incidents opened (lead rule, started step), rank 0's logged points, and the scores
    of every signal whose rule names a cause (rule -> (step, score))."""
    det = RunDetector(records[0].run_id if records else "r")
    pages: list[tuple[str, int]] = []
    points: list[int] = []
    scores: dict[str, list[tuple[int, float]]] = {}
    prefixes = tuple(w for words in CAUSES.values() for w in words)
    resolved: set[str] = set()  # incidents whose resolution was reported
    paged: dict[str, int | None] = {}  # incident -> the start step it paged with
    last = 0
    for rec in records:
        if rec.rank != 0:
            pass
        elif rec.kind in ("step", "step_window") and rec.step is not None:
            points.append(rec.step)
        elif rec.kind == "step_batch":
            points += [e["step"] for e in rec.data["records"]]
        last = max(last, rec.step or 0)
        signals, alerts = det.process(rec)
        for sig in signals:
            rule = f"{sig.name}:{sig.metric}"
            if rule.startswith(prefixes):
                got = scores.setdefault(rule, [])
                got += [  # a signal without a step (a health record's): the latest step
                    (int(st) if st != NO_STEP else last, float(sc))
                    for st, sc in zip(sig.step, sig.score, strict=True)
                ]
        for a in alerts:  # pages, and a page reported again with a better lead
            if a.scope != "incident":
                continue
            step = a.started_step if a.started_step is not None else last
            if a.evidence.get("episode") != 0:  # opened again: news of a page, never a page
                if a.state == "firing" and paged.get(a.fingerprint) == step:
                    pages.append((f"{a.rule} (named when reopened)", step))
                continue
            if a.state == "firing":
                rule = a.rule
                paged.setdefault(a.fingerprint, step)
            elif a.fingerprint not in resolved:
                resolved.add(a.fingerprint)  # its resolution: no news
                continue
            else:
                rule = f"{a.rule} (named when resolved)"
            if all(p != (rule, step) for p in pages):
                pages.append((rule, step))
    return _first_reports(pages), sorted(set(points)), scores


def _first_reports(pages: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """One entry per incident start (a report again with a better lead keeps the better)."""
    out: dict[int, str] = {}
    for rule, step in pages:
        out[step] = rule
    return sorted(((r, s) for s, r in out.items()), key=lambda p: p[1])


def separation(outs: list[Outcome], o: Outcome, tolerance: int) -> str:
    """The event's best score among its cause's rules against the 99.99th percentile of the
    same rule's scores in the path's healthy runs: "0.998 > 0.71 (spike:loss)"."""
    healthy: dict[str, list[float]] = {}
    for h in outs:
        if h.path == o.path and h.incident is None:
            for rule, got in h.scores.items():
                healthy.setdefault(rule, []).extend(sc for _, sc in got if np.isfinite(sc))
    best: tuple[float, float, float, str] | None = None
    for rule, got in o.scores.items():
        if not rule.startswith(CAUSES[o.incident or ""]):
            continue
        inside = [sc for st, sc in got if o.start - 2 <= st <= o.last + tolerance]
        inside = [sc for sc in inside if np.isfinite(sc)]
        if not inside:
            continue
        base = healthy.get(rule) or [0.0]
        top, noise = max(inside), float(np.percentile(base, 99.99))
        if best is None or top - noise > best[0]:
            best = (top - noise, top, noise, rule)
    if best is None:
        return "no score"
    _, top, noise, rule = best
    return f"{top:.4f} {'>' if top > noise else '<='} {noise:.4f} ({rule})"


def split(o: Outcome, tolerance: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    """The pages of the event (from its first step to ``tolerance`` steps after its last), the
    false ones (before or after it, or any in a healthy run), and the run's steps outside it."""
    if o.start is None or o.last is None:
        return [], list(o.pages), o.steps
    lo, hi = o.start - 2, o.last + tolerance
    event = [p for p in o.pages if lo <= p[1] <= hi]
    false = [p for p in o.pages if not lo <= p[1] <= hi]
    return event, false, max(lo, 0) + max(o.steps - hi - 1, 0)


def summarise(outs: list[Outcome], tolerance: int) -> None:
    print(
        f"{'path':<9} {'schedule':<9} {'incident':<11} {'paged':>5} {'delay':>6} "
        f"{'points':>6}  lead rule (names the cause)"
    )
    healthy: dict[str, list[int]] = {}
    for o in outs:
        event, false, quiet = split(o, tolerance)
        got = healthy.setdefault(o.path, [0, 0, 0])
        got[0] += len(false)
        got[1] += quiet
        # a report again of a resolved incident with a better lead is not a page
        again = [p for p in event[1:] if not p[0].endswith(("when resolved)", "when reopened)"))]
        got[2] += len(again)
        extra = f"; false pages {false}" if false else ""
        extra += f"; paged again {again}" if again else ""
        if o.incident is None:
            print(f"{o.path:<9} {o.schedule:<9} {'healthy':<11} pages {len(false)}{extra}")
            continue
        sep = separation(outs, o, tolerance)
        if not event:
            print(f"{o.path:<9} {o.schedule:<9} {o.incident:<11} {'no':>5}  score {sep}{extra}")
            continue
        rule, step = event[0]
        delay = max(0, step - o.start)  # type: ignore[operator]
        pts = sum(1 for s in o.points if o.start <= s <= max(step, o.start))  # type: ignore[operator,type-var]
        named = any(rule.startswith(w) for w in CAUSES[o.incident])
        print(
            f"{o.path:<9} {o.schedule:<9} {o.incident:<11} {'yes':>5} {delay:>6} {pts:>6}  "
            f"{rule} ({'yes' if named else 'NO'}); score {sep}{extra}"
        )
    print()
    for path, (n, steps, again) in healthy.items():
        faulty = [o for o in outs if o.path == path and o.incident]
        caught = sum(1 for o in faulty if split(o, tolerance)[0])
        print(
            f"{path:<9} recall {caught}/{len(faulty)}, pages per 10,000 healthy steps "
            f"{1e4 * n / max(steps, 1):.2f} ({n} in {steps} steps), an event paged again {again}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500, help="steps of a run with an incident")
    ap.add_argument("--healthy", type=int, default=5000, help="steps of a healthy run")
    ap.add_argument("--paths", default="windowed,full,hf1,hf10,hf50,lightning")
    ap.add_argument("--schedules", default="cosine,linear,wsd,constant")
    ap.add_argument("--incidents", default=",".join(INCIDENTS))
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches a step")
    ap.add_argument("--stall-ms", type=float, default=20.0)
    ap.add_argument("--tolerance", type=int, default=150, help="steps (a window is 100)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.getLogger("steplens").setLevel(logging.WARNING)  # each run's list of checks
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    outs: list[Outcome] = []
    t0 = time.perf_counter()
    for path in args.paths.split(","):
        for sched in args.schedules.split(","):
            for incident in [None, *filter(None, args.incidents.split(","))]:
                steps = args.healthy if incident is None else args.steps
                run = Run(
                    path, sched, incident, steps, args.seed, args.stall_ms / 1e3, args.accumulate
                )
                recs, start, last = train(run)
                pages, points, scores = judge(recs)
                outs.append(
                    Outcome(path, sched, incident, steps, start, last, pages, points, scores)
                )
                print(
                    f"  {path} {sched} {incident or 'healthy'}: {len(recs)} records, pages {pages}",
                    flush=True,
                )
    print(f"\n{time.perf_counter() - t0:.0f} s, {args.accumulate} micro-batches a step\n")
    summarise(outs, args.tolerance)


if __name__ == "__main__":
    main()
