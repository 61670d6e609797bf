"""Alerts judged on every client path: real CPU training of a tiny next-token model
(``tests/producer/tiny_lm.py``) through the plain loop (``timed`` over its batches,
``log_step`` each step; paths ``windowed`` and ``full``) or the Hugging Face Trainer with
``SteplensCallback`` (``hf1``, ``hf10``, ``hf50``: its ``logging_steps``, so the loss it logs
is the mean of that many steps), its records as the producer makes them (``Monitor`` with an
in-memory transport: windows, raw samples and guard flags at the defaults, or every step with
``full_resolution``), scored by the worker's detectors in-process (``RunDetector``, the pure
engine, as ``bench_stream_incidents.py`` does).

Schedules: cosine to zero at the last step (after a warmup), and constant; both declared in
``run_meta``. Incidents, each from a step in the run's second half: one corrupted batch
(random tokens), an lr blow-up (x30 for 4 steps; in the Trainer set on the optimizer outside
its scheduler, as a bug would), a data stall (each batch waits ``--stall-ms`` for 40 steps);
and healthy runs of ``--healthy`` steps.

Printed per path, schedule and incident: whether it was paged (an incident that opened from
its first step to ``--tolerance`` steps after its last), the delay in steps and in logged
points (the records of its rank with a step in between: windows and raw steps, or steps), and
whether the incident's lead rule names the cause; per path, the pages per 10,000 healthy
steps (every incident opened in a healthy run, or before the fault in a faulty one).

    python bench/bench_client_paths.py                      # a few minutes on 2 cores
    python bench/bench_client_paths.py --healthy 2000 --steps 800   # quicker
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "producer"))
from tiny_lm import VOCAB, TinyLM, clean_rows, corrupted_rows

from steplens.producer import MemoryTransport
from steplens.producer.monitor import Monitor
from steplens.stream_jobs.engine.detector import RunDetector

PEAK, WARMUP, BATCH = 0.05, 50, 32
NOISE = 0.2  # share of a healthy batch's tokens drawn at random
# the words a lead rule of each cause has
CAUSES = {
    "bad_batch": ("spike:loss", "correlation:loss_grad", "data:", "nonfinite"),
    "lr_blowup": ("lr_schedule", "spike:", "correlation:loss_grad", "nonfinite"),
    "data_stall": ("threshold:data_wait_share", "correlation:data_bottleneck"),
}
INCIDENTS = ("bad_batch", "lr_blowup", "data_stall")


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


def noisy_rows(n: int, gen: torch.Generator) -> torch.Tensor:
    """Clean rows with ``NOISE`` of their tokens random: the loss settles at the noise's
    entropy (not at 0, where any wobble is a large relative rise) and no two rows repeat."""
    rows = clean_rows(n, gen)
    swap = torch.rand(rows.shape, generator=gen) < NOISE
    return torch.where(swap, torch.randint(0, VOCAB, rows.shape, generator=gen), rows)


def schedule_of(kind: str, steps: int) -> dict:
    if kind == "cosine":
        return {"kind": "cosine", "peak_lr": PEAK, "warmup_steps": WARMUP, "total_steps": steps}
    return {"kind": "constant", "peak_lr": PEAK}


def lr_at(sched: dict, step: int) -> float:
    from steplens.stream_jobs.engine.signals.lr_schedule import expected_lr

    return float(expected_lr(sched, step) or 0.0)


def monitor(
    name: str, transport: MemoryTransport, sched: dict, spool: str, full_resolution: bool = False
) -> Monitor:
    """Rank 0 of a one-rank run at the producer's defaults, its records kept in memory."""
    return Monitor(
        name,
        transport=transport,
        rank=0,
        local_rank=0,
        world_size=1,
        hw_interval_s=0,
        remedies=None,
        lr_schedule=sched,
        spool_dir=spool,
        full_resolution=full_resolution,
        health_interval_s=3600.0,
    )


def train(path: str, sched_kind: str, incident: str | None, steps: int, seed: int, stall_s: float):
    """One run: its records, and the fault's first and last step."""
    if path.startswith("hf"):
        return train_hf(int(path[2:]), sched_kind, incident, steps, seed, stall_s)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    start = steps * 3 // 5 if incident else None
    last = None if start is None else start + {"bad_batch": 0, "lr_blowup": 3}.get(incident, 39)
    sched = schedule_of(sched_kind, steps)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK)
    transport = MemoryTransport()
    with tempfile.TemporaryDirectory() as spool:
        name = f"{path}-{sched_kind}-{incident or 'healthy'}"
        mon = monitor(name, transport, sched, spool, full_resolution=path == "full")

        def batches() -> Iterator[torch.Tensor]:
            for step in range(steps):
                if incident == "data_stall" and start <= step <= last:
                    time.sleep(stall_s)
                if incident == "bad_batch" and step == start:
                    yield corrupted_rows(BATCH, gen)
                else:
                    yield noisy_rows(BATCH, gen)

        for step, ids in enumerate(mon.timed(batches())):
            lr = lr_at(sched, step)
            if incident == "lr_blowup" and start <= step <= last:
                lr *= 30.0
            for g in opt.param_groups:
                g["lr"] = lr
            loss = model(ids)["loss"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            opt.step()
            mon.log_step(step, loss=loss.detach(), lr=lr, grad_norm=grad, tokens=ids.numel())
        mon.shutdown()
    return transport.records(), start, last


def train_hf(
    logging_steps: int, sched_kind: str, incident: str | None, steps: int, seed: int, stall_s: float
):
    """One run through the Hugging Face Trainer at its defaults (AdamW, clipping at 1.0, its own
    cosine or constant schedule, declared to the callback), logging every ``logging_steps``."""
    import transformers

    from steplens.producer.integrations.hf import SteplensCallback

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    start = steps * 3 // 5 if incident else None
    last = None if start is None else start + {"bad_batch": 0, "lr_blowup": 3}.get(incident, 39)

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[dict]:
            for step in range(steps):
                if incident == "data_stall" and start <= step <= last:
                    time.sleep(stall_s)
                bad = incident == "bad_batch" and step == start
                for row in corrupted_rows(BATCH, gen) if bad else noisy_rows(BATCH, gen):
                    yield {"input_ids": row}

    class Blowup(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kw):  # type: ignore[no-untyped-def]
            if incident == "lr_blowup" and start <= state.global_step <= last:
                for g in optimizer.param_groups:
                    g["lr"] *= 30.0  # the scheduler sets it back at its next step

    transport = MemoryTransport()
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as spool:
        name = f"hf{logging_steps}-{sched_kind}-{incident or 'healthy'}"
        mon = monitor(name, transport, schedule_of(sched_kind, steps), spool)
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=BATCH,
            learning_rate=PEAK,
            lr_scheduler_type="cosine" if sched_kind == "cosine" else "constant",
            warmup_steps=WARMUP if sched_kind == "cosine" else 0,
            logging_steps=logging_steps,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            seed=seed,
        )
        trainer = transformers.Trainer(
            model=TinyLM(),
            args=args,
            train_dataset=Rows(),
            callbacks=[SteplensCallback(mon), Blowup()],
        )
        trainer.train()
        mon.shutdown()
    return transport.records(), start, last


def judge(records: list) -> tuple[list[tuple[str, int]], list[int]]:
    """The incidents opened (lead rule, started step) and rank 0's logged points."""
    det = RunDetector(records[0].run_id if records else "r")
    pages: list[tuple[str, int]] = []
    points: list[int] = []
    last = 0
    for rec in records:
        if rec.kind in ("step", "step_window") and rec.step is not None:
            points.append(rec.step)
        elif rec.kind == "step_batch":
            points += [e["step"] for e in rec.data["records"]]
        last = max(last, rec.step or 0)
        _, alerts = det.process(rec)
        for a in alerts:
            if a.scope == "incident" and a.state == "firing" and a.evidence.get("episode") == 0:
                step = a.started_step if a.started_step is not None else last
                if all(p[1] != step or p[0] != a.rule for p in pages):
                    pages.append((a.rule, step))
    return _first_reports(pages), sorted(set(points))


def _first_reports(pages: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """One entry per incident start (a report again with a better lead keeps the better)."""
    out: dict[int, str] = {}
    for rule, step in pages:
        out[step] = rule
    return sorted(((r, s) for s, r in out.items()), key=lambda p: p[1])


def summarise(outs: list[Outcome], tolerance: int) -> None:
    print(
        f"{'path':<9} {'schedule':<9} {'incident':<11} {'paged':>5} {'delay':>6} "
        f"{'points':>6}  lead rule (names the cause)"
    )
    healthy: dict[str, list[int]] = {}
    for o in outs:
        lo = o.start if o.start is not None else o.steps
        before = [p for p in o.pages if p[1] < lo - 2]
        got = healthy.setdefault(o.path, [0, 0])
        got[0] += len(before)
        got[1] += lo
        if o.incident is None:
            print(f"{o.path:<9} {o.schedule:<9} {'healthy':<11} pages {len(before)}")
            continue
        hit = [p for p in o.pages if o.start - 2 <= p[1] <= o.last + tolerance]
        if not hit:
            print(f"{o.path:<9} {o.schedule:<9} {o.incident:<11} {'no':>5}")
            continue
        rule, step = hit[0]
        delay = max(0, step - o.start)
        pts = sum(1 for s in o.points if o.start <= s <= max(step, o.start))
        named = any(rule.startswith(w) for w in CAUSES[o.incident])
        print(
            f"{o.path:<9} {o.schedule:<9} {o.incident:<11} {'yes':>5} {delay:>6} {pts:>6}  "
            f"{rule} ({'yes' if named else 'NO'})"
        )
    print()
    for path, (n, steps) in healthy.items():
        faulty = [o for o in outs if o.path == path and o.incident]
        caught = sum(
            1 for o in faulty if any(o.start - 2 <= p[1] <= o.last + tolerance for p in o.pages)
        )
        print(
            f"{path:<9} recall {caught}/{len(faulty)}, pages per 10,000 healthy steps "
            f"{1e4 * n / max(steps, 1):.2f} ({n} in {steps} steps)"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500, help="steps of a run with an incident")
    ap.add_argument("--healthy", type=int, default=5000, help="steps of a healthy run")
    ap.add_argument("--paths", default="windowed,full,hf1,hf10,hf50")
    ap.add_argument("--schedules", default="cosine,constant")
    ap.add_argument("--incidents", default=",".join(INCIDENTS))
    ap.add_argument("--stall-ms", type=float, default=20.0)
    ap.add_argument("--tolerance", type=int, default=150, help="steps (a window is 100)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.getLogger("steplens").setLevel(logging.WARNING)  # each run's list of checks
    outs: list[Outcome] = []
    t0 = time.perf_counter()
    for path in args.paths.split(","):
        for sched in args.schedules.split(","):
            for incident in [None, *filter(None, args.incidents.split(","))]:
                steps = args.healthy if incident is None else args.steps
                recs, start, last = train(
                    path, sched, incident, steps, args.seed, args.stall_ms / 1e3
                )
                pages, points = judge(recs)
                outs.append(Outcome(path, sched, incident, steps, start, last, pages, points))
                print(
                    f"  {path} {sched} {incident or 'healthy'}: {len(recs)} records, pages {pages}",
                    flush=True,
                )
    print(f"\n{time.perf_counter() - t0:.0f} s\n")
    summarise(outs, args.tolerance)


if __name__ == "__main__":
    main()
