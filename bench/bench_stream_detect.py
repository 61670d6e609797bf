"""`steplens detect` speed: rows/s scoring a CSV, against reading and writing the same CSV
with the csv module (the I/O floor) in the same run; ARIMA on and off. The first ARIMA run is
cold (it loads statsmodels, about 2 s, and the compiled loops, under 1 s); the warm one is what
a long-lived process sees. The floor and the warm runs are the best of ``--repeat`` runs, so a
busy shared machine shows less.

    python bench/bench_stream_detect.py              # 20,000 rows
    python bench/bench_stream_detect.py --rows 200000 --repeat 1
    python bench/bench_stream_detect.py --before /work/base   # that code too, and the ratio

With ``--before DIR`` the warm ARIMA-on and ARIMA-off rates of that checkout's and this one's
`steplens detect` are measured alternately, each run in a process of its own (CPU time of the
child: the code is single-threaded, and wall-clock rates vary by 2x on a busy machine).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from steplens.stream_jobs.offline.cli import main as detect


def write_csv(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "grad_norm", "lr", "queue_depth"])
        for i in range(rows):
            loss = 3 * math.exp(-i / 5000) + 1 + rng.gauss(0, 0.02)
            w.writerow(
                [
                    i,
                    f"{loss:.6f}",
                    f"{1 + rng.gauss(0, 0.05):.6f}",
                    "0.0003",
                    f"{1e-4 + rng.gauss(0, 1e-6):.9f}",
                ]
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per measure; the best counts")
    ap.add_argument("--before", help="a checkout of the code to compare with (e.g. /work/base)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    src = tmp / "in.csv"
    write_csv(src, args.rows)
    if args.before:
        compare(Path(args.before), src, tmp, args.rows, args.repeat)
        return
    floor = min(_copy(src, tmp / "copy.csv") for _ in range(args.repeat))
    print(f"{args.rows} rows x 4 metrics")
    print(f"  csv read + write      {args.rows / floor:>10,.0f} rows/s (floor)")
    runs = (
        ("ARIMA on, cold", [], 1),  # imports statsmodels on its first fit
        ("ARIMA on, warm", [], args.repeat),
        ("ARIMA off", ["--no-arima"], args.repeat),
    )
    for label, extra, repeat in runs:
        took = min(
            _detect([str(src), "--out", str(tmp / "out.csv"), *extra]) for _ in range(repeat)
        )
        print(
            f"  detect, {label:<15} {args.rows / took:>10,.0f} rows/s = {floor / took:.3f}x the "
            f"floor; target 20,000 -> {args.rows / took / 20000:.2f}x"
        )


def compare(before: Path, src: Path, tmp: Path, rows: int, repeat: int) -> None:
    sides = {"before": before.resolve(), "after": Path(__file__).resolve().parents[1]}
    print(f"steplens detect, rows/s ({rows} rows; best of {repeat} warm runs each, CPU time)")
    print(f"  {'':<12} {'before':>10} {'after':>10}  after/before")
    for label, extra in (("ARIMA on", []), ("ARIMA off", ["--no-arima"])):
        best = dict.fromkeys(sides, math.inf)
        for _ in range(repeat):
            for side, root in sides.items():
                best[side] = min(best[side], _child(root, [str(src), *extra], tmp))
        b, a = rows / best["before"], rows / best["after"]
        print(f"  {label:<12} {b:>10,.0f} {a:>10,.0f}  {a / b:.2f}x")


def _child(root: Path, argv: list[str], tmp: Path) -> float:
    """CPU seconds of one `steplens detect` of the code under ``root`` (its compiled loops
    and statsmodels loaded before the clock starts, as the command does)."""
    code = (
        "import sys, time\n"
        "try:\n"
        "    from steplens.stream_jobs.offline import cli as detect_cli\n"
        "    from steplens.stream_jobs.engine.signals import arima, registry as loops\n"
        "    if not hasattr(loops, 'warm_up'):\n"  # a checkout with kernels.warm_up
        "        from steplens.stream_jobs.engine.signals import kernels as loops\n"
        "except ImportError:\n"  # a checkout from before the layers
        "    from steplens.stream_jobs import detect_cli\n"
        "    from steplens.stream_jobs.signals import arima, kernels as loops\n"
        "loops.warm_up(); arima.warm_up()\n"
        "t = time.process_time()\n"
        "detect_cli.main(sys.argv[1:] + ['--quiet'])\n"
        "print(time.process_time() - t)\n"
    )
    path = os.pathsep.join(str(root / p / "src") for p in ("schema", "producer", "stream_jobs"))
    out = subprocess.run(
        [sys.executable, "-c", code, *argv, "--out", str(tmp / "out.csv")],
        env={**os.environ, "PYTHONPATH": path},
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _copy(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    with src.open(newline="") as f:
        rows = list(csv.DictReader(f))
    with dst.open("w", newline="") as f:
        w = csv.writer(f)
        for r in rows:
            w.writerow(r.values())
    return time.perf_counter() - t


def _detect(argv: list[str]) -> float:
    t = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        detect([*argv, "--quiet"])
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
