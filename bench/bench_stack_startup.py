"""Start-up cost of the local stack's services, as ratios to a no-op `up` in the same run.

For each service in a private stack (own folder, free ports): the first start (storage format,
setup), a no-op `up` while it runs (the baseline), a restart (stop + start). The first start of
a fresh *home* reuses the cached jars/binaries; it does not measure downloads or builds.

    python bench/bench_stack_startup.py               # one round, about a minute
    python bench/bench_stack_startup.py --rounds 3 --kafka-java-opts "-XX:TieredStopAtLevel=1"
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from steplens.stack import Stack
from steplens.stack.process import free_ports


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(stack: Stack, name: str, out: dict[str, list[float]]) -> None:
    out["first"].append(timed(lambda: stack.up([name])))
    out["noop"].append(timed(lambda: stack.up([name])))
    out["restart"].append(timed(lambda: (stack.stop(name), stack.start(name))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--services", default="s3,influxdb,kafka")
    parser.add_argument("--kafka-java-opts", default="", help="extra JVM flags for Kafka")
    args = parser.parse_args()
    if args.kafka_java_opts:
        os.environ["STEPLENS_KAFKA_JAVA_OPTS"] = args.kafka_java_opts
    services = args.services.split(",")
    rows: dict[str, dict[str, list[float]]] = {
        s: {"first": [], "noop": [], "restart": []} for s in services
    }
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="steplens-bench-") as tmp:
            ports = dict(
                zip(("kafka", "kafka_controller", "influxdb", "s3"), free_ports(4), strict=True)
            )
            stack = Stack(home=Path(tmp), ports=ports, progress=lambda _line: None)
            try:
                for name in services:
                    measure(stack, name, rows[name])
            finally:
                stack.down()
    print(f"{'service':<9} {'no-op up':>9} {'first start':>12} {'restart':>9}   ratios to no-op")
    for name, r in rows.items():
        noop, first, restart = (statistics.median(r[k]) for k in ("noop", "first", "restart"))
        print(
            f"{name:<9} {noop:>8.3f}s {first:>11.2f}s {restart:>8.2f}s   "
            f"first x{first / noop:,.0f}, restart x{restart / noop:,.0f}"
        )


if __name__ == "__main__":
    main()
