"""Rollups after a burst of metric names: do they keep up, and what does influxd hold?

A private InfluxDB (temporary folder, free port, the stack's memory ceiling). One run's
producer sends ``--names`` distinct scalar names in its first minute (``--per-step`` new names a
step, through the influx sink's own export and name limits, which cap and count them), then
keeps logging a few metrics every second, as a run does, for ``--minutes``. Meanwhile the sink's
rollup loop (``rollup_loop.RollupLoop``) makes its runs. Prints each run's duration, the coverage
lag sampled every 10 s (max and last), influxd's RSS before, at its peak and at the end, and the
names the limits left out.

The target (issue figures): coverage never more than 2 minutes behind, influxd within its
compose limit (3 GiB), no two runs at once (one thread makes them).

    python bench/bench_rollup_burst.py                 # 20,000 names, 10 minutes
    python bench/bench_rollup_burst.py --minutes 4     # shorter
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from steplens.schema import make_record
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.rollup import ensure_buckets
from steplens.sinks.rollup_loop import RollupLoop, covered_lag_s, until_next
from steplens.sinks.settings import InfluxSettings
from steplens.sinks.text_fields import TextFields
from steplens.stack import Stack
from steplens.stack.process import free_ports


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=20_000)
    ap.add_argument("--per-step", type=int, default=500)
    ap.add_argument("--minutes", type=float, default=10.0)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="steplens-rollup-burst-"))
    (port,) = free_ports(1)
    stack = Stack(home=root / "stack", ports={"influxdb": port}, progress=lambda _l: None)
    stack.up(services=("influxdb",))
    try:
        return run(stack, a)
    finally:
        stack.down(deadline_s=15)


def run(stack: Stack, a: argparse.Namespace) -> int:
    env = stack.env()
    s = InfluxSettings(
        url=env["STEPLENS_INFLUX_URL"],
        org=env["STEPLENS_INFLUX_ORG"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        timeout_ms=120_000,
    )
    influxd = psutil.Process(stack.pid("influxdb") or 0)
    rss = [influxd.memory_info().rss]
    client = make_client(s)
    ensure_buckets(client, s)
    fields = TextFields()
    sink = InfluxSink(client, s, text_fields=fields)
    runs: list[float] = []
    lags: list[float] = []
    stop = threading.Event()

    loop = RollupLoop(client, s, fields)

    def rollups() -> None:  # the sink's loop (one thread, 5 s past each minute), timed here
        while not stop.wait(until_next(time.time())):
            t0 = time.monotonic()
            ok = loop.run_now()
            runs.append(time.monotonic() - t0)
            print(
                f"rollup run {len(runs)}: {runs[-1]:.1f} s{'' if ok else ' (failed)'}", flush=True
            )

    thread = threading.Thread(target=rollups, daemon=True)
    thread.start()
    t_end = time.time() + a.minutes * 60
    step, sent = 0, 0
    trimmed = 0
    while time.time() < t_end:
        data: dict[str, object] = {"loss": 2.0 + 0.01 * (step % 7), "tokens_per_s": 5e3}
        if sent < a.names:
            new = min(a.per_step, a.names - sent)
            data["scalars"] = {f"burst_{sent + i}": float(i) for i in range(new)}
            sent += new
        rec = make_record("step", data, run_id="burst", seq=step, step=step, time_ns=time.time_ns())
        result = sink.export([rec])
        trimmed += len(result.rejected)  # stored in part: names over a limit left out
        step += 1
        if step % 10 == 0:
            rss.append(influxd.memory_info().rss)
            lag = covered_lag_s(client, s)
            if lag is not None:
                lags.append(lag)
        time.sleep(1.0 if sent >= a.names else 0.1)
    stop.set()
    thread.join(300)
    rss.append(influxd.memory_info().rss)
    mb = [r / 2**20 for r in rss]
    print(
        f"names sent {sent}, steps {step}, records stored in part {trimmed}\n"
        f"rollup runs {len(runs)}: max {max(runs, default=0):.1f} s, "
        f"mean {sum(runs) / max(len(runs), 1):.1f} s\n"
        f"coverage lag: max {max(lags, default=float('nan')):.0f} s, "
        f"last {lags[-1] if lags else float('nan'):.0f} s (target: at most 120 s)\n"
        f"influxd RSS: before {mb[0]:.0f} MB, peak {max(mb):.0f} MB, end {mb[-1]:.0f} MB",
        flush=True,
    )
    client.close()
    return 0 if lags and max(lags) <= 120 else 1


if __name__ == "__main__":
    sys.exit(main())
