"""What one worker pays for a run as its ranks multiply, without Kafka: the records of N
simulated ranks (``sim_ranks.py``, the producer's own code, into a ``MemoryTransport``, steps
as fast as they can be made) scored by one ``RunDetector`` as the worker's ``detect`` does,
with its checkpoint (``dump`` of the ranks touched) every ``--checkpoint-steps`` steps (the
worker: every 5 s, so 5 steps of 1 s), or as the worker spaces a slow one (``store``'s
``CHECKPOINT_SPACING``: forty times its time, a step a simulated second).

Prints, per N: records, scoring µs per record, CPU seconds per simulated second, the
checkpoint's size and time (and its head's: the run-wide states) and the checkpoints' CPU
seconds per simulated second, and the process's peak RSS. With several ``--series-ranks``
(the ranks whose own metrics keep series) each N's records are scored once under each. The
first N and the first ``--series-ranks`` are the baseline of the ratios.

    python bench/bench_rank_state.py --ranks 64 256 1024 --steps 60
    python bench/bench_rank_state.py --ranks 4096 --steps 60 --series-ranks 4096 1024 256
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from sim_ranks import Fleet, parse
from steplens.schema import Record, decode
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals.registry import SERIES_RANKS, DetectorConfig
from steplens.stream_jobs.worker.store import CHECKPOINT_SPACING, SLOW_CHECKPOINT_S


def fleet_records(n: int, steps: int) -> list[Record]:
    args = parse(["--ranks", str(n), "--steps", str(steps), "--pace-s", "0.000001",
                  "--run-id", f"state-{n}", "--bootstrap", "memory"])  # fmt: skip
    fleet = Fleet(args)
    fleet.run()
    raw = [v for _, v in fleet.tx.inner.messages]  # type: ignore[attr-defined]
    recs = [r for r in map(decode, raw) if isinstance(r, Record)]
    # the fleet and its records are the bench's, not the worker's: kept out of the collector's
    # full passes, which at 16,384 ranks would otherwise walk gigabytes of them
    gc.freeze()
    return recs


def measure(recs: list[Record], steps: int, every: int, series_ranks: int) -> dict[str, Any]:
    det = RunDetector(recs[0].run_id, DetectorConfig(series_ranks=series_ranks), fit_inline=False)
    score_s = dump_s = 0.0
    by_kind: dict[str, list[float]] = {}
    dumps: list[int] = []
    heads: list[int] = []
    last_ck, wait = 0, every
    for rec in recs:
        t = time.process_time()
        with contextlib.suppress(ValueError):
            det.process(rec)
        dt = time.process_time() - t
        score_s += dt
        kind = f"{rec.kind}{'/node' if rec.kind == 'hw' and 'nets' in rec.data else ''}"
        got = by_kind.setdefault(kind, [0, 0.0])
        got[0] += 1
        got[1] += dt
        step = rec.step if rec.kind in ("step", "step_window") else None
        if step is not None and step >= last_ck + wait:
            last_ck = step
            t = time.process_time()
            head, ranks = det.dump(det.take_touched())
            took = time.process_time() - t
            dump_s += took
            wait = max(every, CHECKPOINT_SPACING * took if took >= SLOW_CHECKPOINT_S else 0)
            dumps.append(len(head) + sum(len(b) for b in ranks.values()))
            heads.append(len(head))
    return {
        "records": len(recs),
        "records_per_step": len(recs) / steps,
        "score_us": 1e6 * score_s / len(recs),
        "score_cpu_per_step_s": score_s / steps,
        "checkpoints": len(dumps),
        "checkpoint_mb": max(dumps, default=0) / 2**20,
        "checkpoint_s": dump_s / max(1, len(dumps)),
        "checkpoint_cpu_per_step_s": dump_s / steps,
        "head_mb": max(heads, default=0) / 2**20,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "unfollowed": det.run.unfollowed,
        "by_kind": {k: f"{n} x {1e6 * t / n:.0f} µs" for k, (n, t) in by_kind.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint-steps", type=int, default=5)
    ap.add_argument(
        "--series-ranks",
        type=int,
        nargs="+",
        default=[SERIES_RANKS],
        help="the detectors' series_ranks, each over the same records of each N",
    )
    a = ap.parse_args()
    base = None
    for n in a.ranks:
        recs = fleet_records(n, a.steps)
        for k in a.series_ranks:
            m = measure(recs, a.steps, a.checkpoint_steps, k)
            base = base or m
            print(
                f"ranks {n:>6}, series_ranks {k}: {m['records_per_step']:8.0f} records/step, "
                f"scoring {m['score_us']:6.1f} µs/record = {m['score_cpu_per_step_s']:.3f} CPU "
                f"s per step ({m['score_cpu_per_step_s'] / base['score_cpu_per_step_s']:.2f}x); "
                f"checkpoint {m['checkpoint_mb']:.2f} MB in {m['checkpoint_s'] * 1000:.0f} ms "
                f"({m['checkpoint_s'] / max(base['checkpoint_s'], 1e-9):.2f}x), "
                f"{m['checkpoints']} checkpoints ({m['checkpoint_cpu_per_step_s']:.3f} CPU s "
                f"per step), head {m['head_mb']:.2f} MB; rows without series "
                f"{m['unfollowed']}; peak RSS so far {m['rss_mb']:.0f} MB",
                flush=True,
            )
            print(f"  by kind: {m['by_kind']}", flush=True)
        del recs
        gc.unfreeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
