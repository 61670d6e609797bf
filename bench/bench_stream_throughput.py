"""Throughput of the detectors without Kafka (the worker against Kafka: bench_stream_worker.py).

Step records/s through ``RunDetector`` (every signal on, ARIMA fits included, run inline and
timed separately, statsmodels imported beforehand), against a decode-only baseline measured in
the same run: one record at a time, in step_batches, and warm step_batches (a long run); then
each signal group alone over the same decoded records (its share of the cost).

With ``--before DIR`` (a checkout of an earlier version, e.g. /work/base) the three detect
figures are measured for that code and this one, each in its own process, alternately
``--repeat`` times; the medians and their ratio (after / before) are printed. Times are the
process's CPU time (the code is single-threaded): on a shared, busy machine wall-clock rates
vary by 2x from one run to the next.

    python bench/bench_stream_throughput.py               # about a minute
    python bench/bench_stream_throughput.py --records 400000
    python bench/bench_stream_throughput.py --before /work/base --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from steplens.schema import Record, decode, encode, make_record
from steplens.stream_jobs.engine import rules
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals import arima
from steplens.stream_jobs.engine.signals.registry import DetectorConfig


def step_records(n: int, runs: int, ranks: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    per = n // (runs * ranks)
    for i in range(per):
        for r in range(runs):
            for k in range(ranks):
                out.append(
                    encode(
                        make_record(
                            "step",
                            {
                                "loss": 3.0 - i * 1e-4 + rng.gauss(0, 0.02),
                                "grad_norm": 1.0 + rng.gauss(0, 0.05),
                                "lr": 3e-4,
                                "step_time_s": 0.1 + rng.gauss(0, 0.002),
                                "tokens_per_s": 1e5 + rng.gauss(0, 500),
                            },
                            run_id=f"bench-{r}",
                            rank=k,
                            step=i,
                            time_ns=time.time_ns(),
                        )
                    )
                )
    return out


def _group_runners(cfg: DetectorConfig) -> dict[str, Callable[[Record], Any]]:
    """One function per signal group, each scoring a step record (a column of one value) with
    its own state."""
    from steplens.stream_jobs.engine.core import Column, Signals
    from steplens.stream_jobs.engine.signals import lr_schedule, ranks, spike, volatility

    spikes: dict[tuple[str, int, str], spike.SpikeState] = {}
    vols: dict[tuple[str, int], volatility.VolatilityState] = {}
    arimas: dict[tuple[str, int, str], arima.ArimaState] = {}
    lrs: dict[tuple[str, int], lr_schedule.LrState] = {}
    rank_states: dict[str, ranks.RanksState] = {}
    rule_states: dict[str, rules.RulesState] = {}
    zero = np.zeros(1, np.int64)

    def col(rec: Record, m: str) -> Column:
        return Column(np.array([rec.data[m]]), np.array([rec.step]), zero, rec.rank)

    def do_spike(rec: Record) -> None:
        for m, c in (("loss", cfg.spike), ("grad_norm", cfg.grad_spike)):
            key = (rec.run_id, rec.rank, m)
            st = spikes.get(key) or spikes.setdefault(key, spike.SpikeState())
            spike.update(st, c, m, col(rec, m))

    def do_volatility(rec: Record) -> None:
        key = (rec.run_id, rec.rank)
        st = vols.get(key) or vols.setdefault(key, volatility.VolatilityState())
        volatility.update(st, cfg.volatility, "loss", col(rec, "loss"))

    def do_arima(rec: Record) -> None:  # updates only: fits are timed by the full run
        for m in ("loss", "grad_norm", "step_time_s", "tokens_per_s"):
            key = (rec.run_id, rec.rank, m)
            st = arimas.get(key) or arimas.setdefault(key, arima.ArimaState())
            arima.update(st, cfg.arima, m, col(rec, m))
            if st.wants_fit:  # a fixed model, so every update runs the recursion
                p = arima.ArimaParams(ar=[0.3], ma=[-0.2], const=0.0, sigma=0.01)
                arima.apply_fit(st, cfg.arima, p if st.params is None else st.params)

    def do_lr(rec: Record) -> None:
        key = (rec.run_id, rec.rank)
        st = lrs.get(key) or lrs.setdefault(key, lr_schedule.LrState())
        lr_schedule.update(st, cfg.lr, "lr", col(rec, "lr"))

    def do_ranks(rec: Record) -> None:
        st = rank_states.get(rec.run_id) or rank_states.setdefault(rec.run_id, ranks.RanksState())
        ranks.step_times(st, cfg.ranks, rec.rank, [(rec.step, rec.data["step_time_s"])], 0, 0)
        ranks.progress(st, rec.rank, rec.step, rec.time_ns)

    def do_rules(rec: Record) -> None:  # one quiet signal per metric, as most steps have
        st = rule_states.get(rec.run_id) or rule_states.setdefault(rec.run_id, rules.RulesState())
        sigs = [
            Signals.of("spike", m, 0, rec.step, v, 0.1, rank=rec.rank).view(0)
            for m, v in rec.data.items()
        ]
        rules.evaluate(st, cfg.rules, rec.run_id, sigs)

    return {
        "spike (loss, grad_norm)": do_spike,
        "volatility (loss)": do_volatility,
        "ARIMA updates (4 series)": do_arima,
        "lr schedule": do_lr,
        "ranks (stragglers)": do_ranks,
        "rules (5 signals)": do_rules,
    }


def bench_groups(recs: list[Record], t_decode: float) -> None:
    """Each signal group alone over the decoded records, against the decode-only baseline."""
    print("  per signal group (alone; records/s, and its time as a share of the decode time)")
    for label, run in _group_runners(DetectorConfig()).items():
        t = time.process_time()
        for rec in recs:
            run(rec)
        took = time.process_time() - t
        rate = len(recs) / took if took > 0 else math.inf
        print(f"    {label:<26} {rate:>10,.0f} records/s ({took / t_decode:.2f}x the decode time)")


def bench_pure(n: int, groups: bool = True) -> dict[str, float]:
    t = time.process_time()
    arima.fit(np.linspace(0.0, 1.0, 64) ** 2, (1, 1, 1), "hannan_rissanen")  # imports statsmodels
    print(f"statsmodels import + first fit: {time.process_time() - t:.2f} s (once per process)")
    wire = step_records(n, runs=4, ranks=8)
    t = time.process_time()
    recs = [decode(w) for w in wire]
    t_decode = time.process_time() - t
    fit_time = 0.0
    fits = 0
    dets: dict[str, RunDetector] = {}
    t = time.process_time()
    for rec in recs:
        det = dets.get(rec.run_id)
        if det is None:
            det = dets[rec.run_id] = RunDetector(rec.run_id, DetectorConfig(), fit_inline=False)
        det.process(rec)
        if det.fits_wanted:
            t_fit = time.process_time()
            for key, values in det.pending_fits():
                det.apply_fit(key, arima.fit(values, (1, 1, 1), "hannan_rissanen"))
                fits += 1
            fit_time += time.process_time() - t_fit
    total = time.process_time() - t
    arima_points = len(recs) * 4
    print(f"pure: {len(recs)} step records, every signal on")
    print(f"  decode only       {len(recs) / t_decode:>10,.0f} records/s (baseline)")
    print(
        f"  decode + detect   {len(recs) / (t_decode + total):>10,.0f} records/s "
        f"({(t_decode + total) / t_decode:.1f}x the decode time)"
    )
    print(
        f"  detect only       {len(recs) / total:>10,.0f} records/s; target 20,000 -> "
        f"{len(recs) / total / 20000:.2f}x"
    )
    print(
        f"  ARIMA fits        {fits} fits, {fit_time / arima_points * 1e6:.1f} us amortised "
        f"per point (target <= 50 us)"
    )
    figures = {"one record at a time": len(recs) / total}
    figures["step_batches of 100"] = bench_batched(recs, len(recs) / total)
    figures["warm step_batches of 80"] = bench_steady(len(recs) / t_decode)
    if groups:
        bench_groups(recs, t_decode)
    return figures


def bench_batched(recs: list[Record], one_by_one: float, size: int = 100) -> float:
    """The same records as step_batch entries, ``size`` consecutive steps of a rank at a time
    (what the producer's full-resolution mode sends), through ``process_entries``."""
    batches: dict[tuple[str, int], list[dict[str, Any]]] = {}
    order: list[tuple[str, int, list[dict[str, Any]]]] = []
    for rec in recs:
        key = (rec.run_id, rec.rank)
        entries = batches.get(key)
        if entries is None or len(entries) >= size:
            entries = batches[key] = []
            order.append((rec.run_id, rec.rank, entries))
        entries.append({"step": rec.step, "time_ns": rec.time_ns, **rec.data})
    dets: dict[str, RunDetector] = {}
    t = time.process_time()
    for run, rank, entries in order:
        det = dets.get(run)
        if det is None:
            det = dets[run] = RunDetector(run, DetectorConfig(), fit_inline=False)
        det.process_entries(rank, entries)
        if det.fits_wanted:
            for key, values in det.pending_fits():
                det.apply_fit(key, arima.fit(values, (1, 1, 1), "hannan_rissanen"))
    rate = len(recs) / (time.process_time() - t)
    print(
        f"  detect, in step_batches of {size} {rate:>10,.0f} records/s = {rate / one_by_one:.1f}x "
        f"one record at a time; target 20,000 -> {rate / 20000:.2f}x"
    )
    return rate


def bench_steady(decode_rate: float, runs: int = 4, ranks: int = 32, size: int = 80) -> float:
    """A long run's cost: step_batches of ``size`` steps (``runs`` x ``ranks``, as the live
    bench sends them) once the baselines are warm (1,100 steps in: fitted, windows full), the
    ARIMA fits timed apart (the worker runs them in a process pool)."""
    rng = np.random.default_rng(1)
    dets = {f"s{r}": RunDetector(f"s{r}", DetectorConfig(), fit_inline=False) for r in range(runs)}

    def batches(first: int, last: int) -> list[tuple[str, int, list[dict[str, Any]]]]:
        out = []
        for b0 in range(first, last, size):
            n = min(size, last - b0)
            for r in range(runs):
                for k in range(ranks):
                    loss = 3.0 - np.arange(b0, b0 + n) * 1e-4 + rng.normal(0, 0.02, n)
                    grad = 1.0 + rng.normal(0, 0.05, n)
                    st = 0.1 + rng.normal(0, 0.002, n)
                    tps = 1e5 + rng.normal(0, 500, n)
                    out.append((f"s{r}", k, [
                        {"step": b0 + i, "time_ns": 0, "loss": float(loss[i]),
                         "grad_norm": float(grad[i]), "lr": 3e-4, "step_time_s": float(st[i]),
                         "tokens_per_s": float(tps[i])}
                        for i in range(n)
                    ]))  # fmt: skip
        return out

    def score(work: list[tuple[str, int, list[dict[str, Any]]]]) -> float:
        fit_time = 0.0
        t = time.process_time()
        for run, rank, entries in work:
            det = dets[run]
            det.process_entries(rank, entries)
            if det.fits_wanted:
                t_fit = time.process_time()
                for key, values in det.pending_fits():
                    det.apply_fit(key, arima.fit(values, (1, 1, 1), "hannan_rissanen"))
                fit_time += time.process_time() - t_fit
        return time.process_time() - t - fit_time

    score(batches(0, 1100))
    steps = 480
    rate = runs * ranks * steps / score(batches(1100, 1100 + steps))
    print(
        f"  detect, warm, in step_batches of {size} ({runs} runs x {ranks} ranks) "
        f"{rate:>8,.0f} records/s = {decode_rate / rate:.2f}x the decode time; "
        f"target 20,000 -> {rate / 20000:.2f}x"
    )
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=64_000)
    ap.add_argument("--before", help="a checkout of the code to compare with (e.g. /work/base)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side with --before")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:  # one side of a comparison: the figures alone
        with contextlib.redirect_stdout(io.StringIO()):
            figures = bench_pure(args.records, groups=False)
        print(json.dumps(figures))
        return
    if args.before:
        compare(args.before, args.records, args.repeat)
        return
    bench_pure(args.records)


def compare(before: str, records: int, repeat: int) -> None:
    """The detect figures of ``before`` and of this checkout, each side in its own process,
    alternately; their medians and ratio."""
    here = Path(__file__).resolve().parents[1]
    sides = {"before": Path(before).resolve(), "after": here}
    got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(repeat):
        for side, root in sides.items():
            got[side].append(run_side(root, records))
    print(f"detect, records/s ({records} step records, median of {repeat} runs each)")
    print(f"  {'':<26} {'before':>10} {'after':>10}  after/before")
    for name in got["after"][0]:
        b = statistics.median(r[name] for r in got["before"])
        a = statistics.median(r[name] for r in got["after"])
        print(f"  {name:<26} {b:>10,.0f} {a:>10,.0f}  {a / b:.2f}x")


def run_side(root: Path, records: int) -> dict[str, float]:
    """The figures of the code under ``root``, measured by that checkout's own copy of this
    bench (each layout imports its modules from their own places), in a process of its own."""
    parts = ("schema", "producer", "stream_jobs", "sinks")
    path = os.pathsep.join(str(root / p / "src") for p in parts if (root / p / "src").is_dir())
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [
            sys.executable,
            str(root / "bench" / Path(__file__).name),
            "--json",
            "--records",
            str(records),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
