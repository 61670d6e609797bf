"""A broken producer that invents a run id per step, against the worker's run store.

Each message is one step record of a new run, scored as the detect agent does (admit, ready,
score, checkpoint into a dict standing for the table). The memory the store holds afterwards
(tracemalloc: its detectors and its table values) with the default ``--max-runs`` is printed
against the same store without a limit, measured in the same run. Then what one run of
``--ranks`` ranks holds once its windows are full (``--steps`` steps a rank, ARIMA on; the
fits left pending, as the worker's pool holds them), against a one-step run: what to size
``--max-runs`` by.

    python bench/bench_run_limits.py               # 20,000 runs, about two minutes
    python bench/bench_run_limits.py --runs 50000 --ranks 64
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from types import SimpleNamespace

from steplens.schema import make_record
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.worker.run_limits import RunLimits
from steplens.stream_jobs.worker.settings import LimitSettings
from steplens.stream_jobs.worker.store import RunStore


def flood(runs: int, max_runs: int) -> tuple[float, int, float]:
    """MiB held by the store after ``runs`` one-step runs, runs kept, seconds taken."""
    gc.collect()
    tracemalloc.start()
    table: dict[bytes, bytes] = {}
    limits = RunLimits(LimitSettings(max_runs=max_runs), table.keys)
    store = RunStore(table, DetectorConfig(arima_enabled=False), 0.0, limits=limits)
    msg = SimpleNamespace(value=b"[]x", message=SimpleNamespace(partition=0))
    t0 = time.perf_counter()
    for i in range(runs):
        run = f"junk-{i}"
        if not store.admit(run, msg):
            continue
        store.ready(run, msg)
        rec = make_record("step", {"loss": 2.0, "grad_norm": 1.0}, run_id=run, rank=0, step=i)
        store.cache[run].process(rec)
        store.checkpoint(run)
    took = time.perf_counter() - t0
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    kept = len(store.limits.known)
    del store, table, limits
    return held, kept, took


def wide_run_kib(runs: int, ranks: int, steps: int) -> tuple[float, float]:
    """KiB a run of ``ranks`` ranks and ``steps`` steps a rank holds: in memory (its detector)
    and in the table (its checkpoint values), the mean over ``runs`` runs."""
    gc.collect()
    tracemalloc.start()
    table: dict[bytes, bytes] = {}
    store = RunStore(table, DetectorConfig(), 0.0)
    msg = SimpleNamespace(value=b"[]x", message=SimpleNamespace(partition=0))
    for i in range(runs):
        run = f"wide-{i}"
        store.admit(run, msg)
        store.ready(run, msg)
        det = store.cache[run]
        for rank in range(ranks):
            recs = [
                make_record(
                    "step",
                    {"loss": 2.0 + 0.01 * (s % 7), "grad_norm": 1.0 + 0.02 * (s % 5)},
                    run_id=run,
                    rank=rank,
                    step=s,
                    time_ns=1_700_000_000_000_000_000 + s * 10**8,
                )
                for s in range(steps)
            ]
            det.process_steps(recs)
        store.checkpoint(run)
        del recs, det  # the run's own state only
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] / 1024 / runs
    tracemalloc.stop()
    stored = sum(len(v) for v in table.values()) / 1024 / runs
    return held, stored


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--ranks", type=int, default=8, help="ranks of a wide run")
    ap.add_argument("--steps", type=int, default=600, help="steps a rank of a wide run")
    args = ap.parse_args()
    default = LimitSettings.max_runs
    flood(200, 10**9)  # compile the detectors first
    base_mib, base_kept, base_s = flood(args.runs, 10**9)
    lim_mib, lim_kept, lim_s = flood(args.runs, default)
    print(f"{args.runs:,} runs of one step each, one per message")
    print(
        f"  no limit              {base_mib:8.1f} MiB held, {base_kept:,} runs kept "
        f"({base_s:.1f} s)"
    )
    print(
        f"  --max-runs {default:<10,} {lim_mib:8.1f} MiB held, {lim_kept:,} runs kept "
        f"({lim_s:.1f} s)"
    )
    print(f"  held with the limit / without: {lim_mib / base_mib:.2f}x")
    per_run = base_mib * 1024 / max(base_kept, 1)
    print(f"  per run kept: {per_run:.1f} KiB")
    wide_held, wide_stored = wide_run_kib(20, args.ranks, args.steps)
    at_limit = wide_held * default / 2**20
    print(
        f"a run of {args.ranks} ranks x {args.steps} steps, ARIMA on: {wide_held:,.0f} KiB held "
        f"(its table values {wide_stored:,.0f} KiB of it), {wide_held / per_run:.0f}x a "
        f"one-step run; {default:,} such runs: {at_limit:.1f} GiB"
    )


if __name__ == "__main__":
    main()
