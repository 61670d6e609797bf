"""Labelled incident suite: real tiny torch training runs with injected faults, scored by the
worker's detectors (``RunDetector``, the code `steplens worker` runs).

Each run trains an MLP on CPU as ``--ranks`` data-parallel replicas (one shard each, stepped in
turn) and emits the records the producer would: run_meta (declared cosine schedule), step
(loss, grad_norm, lr, step_time_s, data_time_s, param_norm, update_ratio: the share of
elements updated by more than 1e-3 of their size, measured), batch
(sample hashes) and hw (GPU memory: bytes of live tensors against a declared budget, since the
runs are on CPU). Faults start at a random step: lr blow-up, corrupted batch, NaN, slow rank,
memory growth, duplicated data, stalled rank. Clean runs measure false alarms.

A fault is detected when an alert fires between its first step and ``--tolerance`` steps
later. Alerts after the fault started are true positives (faults persist to the end of the
run, except the one corrupted batch, which counts for ``--tolerance`` steps); any other alert
is a false positive. Step and data times are CPU times of the training thread, so other load
on a shared machine does not make a healthy rank look slow. Prints precision, recall and
detection delay
(steps) per fault and per alert rule, and the cost per record against a decode-only baseline.

    python bench/bench_stream_incidents.py            # about a minute
    python bench/bench_stream_incidents.py --seeds 5  # more runs
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from steplens.schema import decode, encode, make_record
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals.registry import DetectorConfig

FAULTS = (
    "lr_blowup",
    "corrupt_batch",
    "nan",
    "slow_rank",
    "memory_growth",
    "duplicate_data",
    "stalled_rank",
)
HANG_AFTER_S = 0.5  # steps here take milliseconds, not seconds


@dataclass
class Run:
    fault: str | None
    start: int | None
    records: list = field(default_factory=list)


def make_data(seed: int, n: int = 32768, dim: int = 32, classes: int = 8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, classes, generator=g)
    y = (x @ w + 3.0 * torch.randn(n, classes, generator=g)).argmax(1)  # noisy labels
    return x, y


def train_run(fault: str | None, seed: int, steps: int, ranks: int, start: int) -> Run:
    torch.manual_seed(seed)
    x, y = make_data(seed)
    peak, warm = 0.05, 20
    sched = {
        "kind": "cosine",
        "peak_lr": peak,
        "min_lr": peak * 0.1,
        "warmup_steps": warm,
        "total_steps": steps,
    }
    models = []
    base = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    for _ in range(ranks):
        m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
        m.load_state_dict(base.state_dict())
        models.append((m, torch.optim.SGD(m.parameters(), lr=peak, momentum=0.9)))
    run_id = f"{fault or 'clean'}-{seed}"
    run = Run(fault, start if fault else None)
    t0 = time.time_ns()
    run.records.append(
        make_record(
            "run_meta", {"world_size": ranks, "lr_schedule": sched}, run_id=run_id, time_ns=t0
        )
    )
    leak: list[torch.Tensor] = []
    param_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    budget = 40 * param_bytes * ranks  # the "device": generous for a healthy run
    batch = 256
    shard_len = len(x) // ranks
    g = torch.Generator().manual_seed(seed + 1)
    orders = [torch.randperm(shard_len, generator=g) for _ in range(ranks)]
    stalled = False
    for step in range(steps):
        on = fault is not None and step >= start
        lr = (
            peak * min(1.0, (step + 1) / warm)
            if step < warm
            else (
                sched["min_lr"]
                + (peak - sched["min_lr"])
                * 0.5
                * (1 + math.cos(math.pi * (step - warm) / (steps - warm)))
            )
        )
        if fault == "lr_blowup" and on:
            lr *= 100.0
        if stalled:
            break
        for rank, (m, opt) in enumerate(models):
            if fault == "stalled_rank" and on and rank == ranks - 1:
                stalled = True  # stuck in a collective: the others finish this step, then wait
                continue
            t_start = time.thread_time()  # CPU time: other load on the machine does not count
            shard = rank if not (fault == "duplicate_data" and on and rank == 1) else 0
            pos = (step * batch) % shard_len
            idx = orders[shard][pos : pos + batch] + shard * shard_len
            xb, yb = x[idx].clone(), y[idx]
            if fault == "corrupt_batch" and step == start:
                xb = xb * 50.0
                yb = torch.randint(0, 8, (batch,), generator=g)
            if fault == "nan" and step == start:
                xb[0, 0] = float("nan")
            data_t = time.thread_time() - t_start
            for group in opt.param_groups:
                group["lr"] = lr
            out = m(xb)
            loss = nn.functional.cross_entropy(out, yb)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.norm(torch.stack([p.grad.norm() for p in m.parameters()])))
            before = [p.detach().clone() for p in m.parameters()]
            opt.step()
            # the share of elements updated by more than 1e-3 of their magnitude (watch's),
            # not counted in the step's time
            t_share = time.thread_time()
            moved = sum(
                int(((p.detach() - b).abs() > 1e-3 * b.abs()).sum())
                for p, b in zip(m.parameters(), before, strict=True)
            )
            upd = moved / sum(b.numel() for b in before)
            t_start += time.thread_time() - t_share
            if fault == "memory_growth" and on and rank == 0:
                leak.append(torch.zeros(param_bytes // 2))  # a leak: twice the model a step
            if fault == "slow_rank" and on and rank == 2:  # a degraded device: extra work
                for _ in range(4):
                    m(xb).sum().backward()
                opt.zero_grad()
            pn = float(torch.norm(torch.stack([p.detach().norm() for p in m.parameters()])))
            st = time.thread_time() - t_start
            now = time.time_ns()
            run.records.append(
                make_record(
                    "step",
                    {
                        "loss": float(loss.detach()),
                        "grad_norm": gn,
                        "lr": lr,
                        "step_time_s": st,
                        "data_time_s": data_t,
                        "param_norm": pn,
                        "update_ratio": upd,
                        "tokens": batch,
                    },
                    run_id=run_id,
                    rank=rank,
                    step=step,
                    time_ns=now,
                )
            )
            hashes = [hashlib.md5(str(int(i)).encode()).hexdigest()[:16] for i in idx]
            run.records.append(
                make_record(
                    "batch",
                    {"n_samples": batch, "sample_hashes": hashes},
                    run_id=run_id,
                    rank=rank,
                    step=step,
                    time_ns=now,
                )
            )
        if step % 2 == 0:
            used = param_bytes * 3 * ranks + sum(t.numel() * 4 for t in leak)
            run.records.append(
                make_record(
                    "hw",
                    {
                        "gpus": [
                            {
                                "index": 0,
                                "mem_used_bytes": used,
                                "mem_total_bytes": budget,
                                "util_gpu": 95.0,
                            }
                        ]
                    },
                    run_id=run_id,
                    time_ns=time.time_ns(),
                )
            )
    if stalled:  # the job is stuck: hardware samples keep coming, no steps
        for _ in range(int(2 * HANG_AFTER_S / 0.05) + 2):
            time.sleep(0.05)
            run.records.append(
                make_record(
                    "hw",
                    {
                        "gpus": [
                            {
                                "index": 0,
                                "mem_used_bytes": param_bytes * 3 * ranks,
                                "mem_total_bytes": budget,
                                "util_gpu": 95.0,
                            }
                        ]
                    },
                    run_id=run_id,
                    time_ns=time.time_ns(),
                )
            )
    return run


def score(run: Run, cfg: DetectorConfig, tolerance: int) -> tuple[list, float]:
    det = RunDetector(run.records[0].run_id, cfg, fit_inline=True)
    wire = [encode(r) for r in run.records]
    fired = []
    t = time.perf_counter()
    last_step = 0
    for raw in wire:
        rec = decode(raw)
        last_step = max(last_step, rec.step or 0)
        _, alerts = det.process(rec)
        fired += [
            (a.rule, a.step if a.step is not None else last_step)
            for a in alerts
            if a.state == "firing"
        ]
    return fired, (time.perf_counter() - t) / len(wire)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--clean", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--tolerance", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = DetectorConfig()
    cfg.ranks.hang_after_s = HANG_AFTER_S
    cfg.ranks.check_every_s = 0.02
    t0 = time.perf_counter()
    runs = [train_run(None, 1000 + s, args.steps, args.ranks, 0) for s in range(args.clean)]
    for f in FAULTS:
        for s in range(args.seeds):
            start = 100 + 23 * s
            runs.append(
                train_run(f, 2000 + s * 17 + FAULTS.index(f), args.steps, args.ranks, start)
            )
    t_train = time.perf_counter() - t0
    # decode-only baseline for the cost per record
    all_wire = [encode(r) for run in runs for r in run.records]
    t = time.perf_counter()
    for raw in all_wire:
        decode(raw)
    t_decode = (time.perf_counter() - t) / len(all_wire)

    hits: dict[str, list[int]] = defaultdict(list)
    missed: dict[str, int] = defaultdict(int)
    rule_tp: dict[str, int] = defaultdict(int)
    rule_fp: dict[str, int] = defaultdict(int)
    rule_delay: dict[str, list[int]] = defaultdict(list)
    costs = []
    for run in runs:
        fired, cost = score(run, cfg, args.tolerance)
        costs.append(cost)
        detected = None
        for rule, step in fired:
            family = rule.split(":")[0] if rule.startswith("correlation") else rule
            end = run.start + args.tolerance if run.fault == "corrupt_batch" else args.steps
            inside = run.start is not None and run.start <= step <= end
            if run.fault == "stalled_rank" and rule.startswith("hang"):
                inside = True  # a hang has no step of its own: it is reported at the last one
            if inside:
                rule_tp[family] += 1
                rule_delay[family].append(max(0, step - run.start))
                if step <= run.start + args.tolerance:
                    detected = step if detected is None else min(detected, step)
            else:
                rule_fp[family] += 1
                print(f"  false positive: {run.records[0].run_id} {rule} at step {step}")
        if run.fault:
            if detected is None:
                missed[run.fault] += 1
                print(f"  missed: {run.records[0].run_id} (fault at step {run.start})")
            else:
                hits[run.fault].append(max(0, detected - run.start))
    tp = sum(rule_tp.values())
    fp = sum(rule_fp.values())
    n_faults = sum(len(v) for v in hits.values()) + sum(missed.values())
    recall = sum(len(v) for v in hits.values()) / max(n_faults, 1)
    precision = tp / max(tp + fp, 1)
    delays = [d for v in hits.values() for d in v]
    print(
        f"\n{len(runs)} runs ({args.clean} clean), {args.ranks} ranks x {args.steps} steps, "
        f"trained in {t_train:.1f} s"
    )
    print(f"{'fault':<16} {'recall':>7} {'median delay':>13}")
    for f in FAULTS:
        n = len(hits[f]) + missed[f]
        med = statistics.median(hits[f]) if hits[f] else float("nan")
        print(f"{f:<16} {len(hits[f]) / max(n, 1):>7.2f} {med:>13.1f}")
    print(f"\n{'alert rule':<32} {'tp':>4} {'fp':>4} {'precision':>9} {'median delay':>13}")
    for rule in sorted(set(rule_tp) | set(rule_fp)):
        p = rule_tp[rule] / max(rule_tp[rule] + rule_fp[rule], 1)
        d = statistics.median(rule_delay[rule]) if rule_delay[rule] else float("nan")
        print(f"{rule:<32} {rule_tp[rule]:>4} {rule_fp[rule]:>4} {p:>9.2f} {d:>13.1f}")
    print(
        f"\nrecall {recall:.3f} (target >= 0.95)   precision {precision:.3f} (target >= 0.95)"
        f"   median delay {statistics.median(delays) if delays else float('nan'):.1f} steps "
        f"(target <= 1)"
    )
    c = statistics.median(costs)
    print(
        f"detector cost per record {c * 1e6:.1f} us = {c / t_decode:.1f}x the decode-only "
        f"baseline ({t_decode * 1e6:.1f} us)"
    )


if __name__ == "__main__":
    main()
