"""What ``sl.act(step)`` costs a training step with nothing pending, on 2 and 4 gloo ranks.

Each rank (a process started as torchrun starts one: RANK, WORLD_SIZE, MASTER_ADDR) trains a
tiny MLP on the CPU with a steplens Monitor whose remedies are all on (its advice consumer
reading an in-memory advice topic that stays empty), in interleaved blocks of steps (the
ways in an order shuffled per block, the same on every rank), four ways: (a) a no-op call
after the step (the baseline); (b) ``sl.advice()``; (c) ``sl.act(step)``; (d) what ``act``
cost before: one gloo all-reduce of one integer per step (every rank waits for the slowest).
``torch.distributed``'s collectives are wrapped, in this bench only, to count the calls each
way makes. Prints the slowest rank's median step time of each way and its ratio to (a), on
the wall clock and in the process's CPU time (gloo's threads included: the figure that holds
on a loaded machine), per world size; and the calls alone (one rank, no training) in ns.

    python bench/bench_act_overhead.py             # 2 and 4 ranks, about 2 minutes on 2 cores
    python bench/bench_act_overhead.py --worlds 2 --blocks 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from steplens.stack.demo_children import free_port

WAYS = ("a no-op", "b advice()", "c act(step)", "d all-reduce")
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "barrier", "reduce", "gather")


def rank_main(blocks: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    import steplens.producer as sl

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    calls = {"n": 0}
    for name in COLLECTIVES:  # count every collective the process makes
        real = getattr(dist, name)

        def counted(*a: object, _real: object = real, **k: object) -> object:
            calls["n"] += 1
            return _real(*a, **k)  # type: ignore[operator]

        setattr(dist, name, counted)
    sl.init(
        transport=sl.MemoryTransport(),
        hw_interval_s=0,
        spool_dir=tempfile.mkdtemp(),
        remedies=["profile", "skip_samples", "rewind", "lower_lr"],
    )
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    sl.watch(net, opt, every=10**9)  # act's targets exist (the watched model and optimizer)
    x = torch.randn(16, 64)
    one = torch.zeros(1, dtype=torch.int64)

    def noop(step: int) -> None:
        return None

    def advice(step: int) -> None:
        sl.advice()

    def act(step: int) -> None:
        sl.act(step)

    def agree(step: int) -> None:  # the old act: the smallest count over the ranks
        one.fill_(0)
        dist.all_reduce(one, op=dist.ReduceOp.MIN)

    ways = dict(zip(WAYS, (noop, advice, act, agree), strict=True))
    per_step: dict[str, list[float]] = {k: [] for k in WAYS}
    cpu: dict[str, list[float]] = {k: [] for k in WAYS}
    collectives = dict.fromkeys(WAYS, 0)
    step = 0
    for block in range(-1, blocks):  # block -1: warm-up, not counted
        order = list(WAYS)
        random.Random(block).shuffle(order)  # the same order on every rank
        for name in order:
            call = ways[name]
            before = calls["n"]
            c0 = time.process_time()
            t0 = time.perf_counter()
            for _ in range(steps):
                net(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                call(step)
                step += 1
            if block >= 0:
                per_step[name].append((time.perf_counter() - t0) / steps)
                cpu[name].append((time.process_time() - c0) / steps)
                collectives[name] += calls["n"] - before
    out = {
        "rank": int(os.environ["RANK"]),
        "us": {k: statistics.median(v) * 1e6 for k, v in per_step.items()},
        "cpu_us": {k: statistics.median(v) * 1e6 for k, v in cpu.items()},
        "collectives": collectives,
        "steps": blocks * steps,
    }
    if out["rank"] == 0:  # the calls alone, no training, no other rank in step
        out["ns"] = calls_alone(sl)
    sl.shutdown(2)
    dist.destroy_process_group()
    print(json.dumps(out))


def calls_alone(sl: object, n: int = 100_000) -> dict[str, float]:
    """ns per call of each way's call alone (the median of 5 runs)."""

    def noop(step: int) -> None:
        return None

    advice = sl.advice  # type: ignore[attr-defined]
    act = sl.act  # type: ignore[attr-defined]
    out = {}
    for name, fn in (("a no-op", noop), ("b advice()", lambda s: advice()), ("c act(step)", act)):
        runs = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for i in range(n):
                fn(i)
            runs.append((time.perf_counter_ns() - t0) / n)
        out[name] = statistics.median(runs)
    return out


def run_world(world: int, blocks: int, steps: int) -> list[dict[str, Any]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
            "STEPLENS_RUN_ID": f"bench-act-{world}",
        }
        cmd = [sys.executable, __file__, "--rank", "--blocks", str(blocks), "--steps", str(steps)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    got = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        got.append(json.loads(out.strip().splitlines()[-1]))
    return got


def report(world: int, got: list[dict[str, Any]], seconds: float) -> None:
    steps = got[0]["steps"]
    print(f"{world} gloo ranks ({seconds:.0f} s; {steps} steps each way per rank)")
    print(
        "  way             wall us/step  ratio to (a)   CPU us/step  ratio to (a)  collectives/step"
    )
    wall = {w: max(r["us"][w] for r in got) for w in WAYS}  # the slowest rank's median
    cpu = {w: max(r["cpu_us"][w] for r in got) for w in WAYS}
    for w in WAYS:
        n = max(r["collectives"][w] for r in got) / steps
        print(
            f"  {w:<14} {wall[w]:>13.1f} {wall[w] / wall[WAYS[0]]:>13.3f}"
            f" {cpu[w]:>13.1f} {cpu[w] / cpu[WAYS[0]]:>13.3f} {n:>17.2f}"
        )
    ns = next((r["ns"] for r in got if "ns" in r), None)
    if ns:
        cells = ", ".join(f"{w} {v:.0f} ns" for w, v in ns.items())
        print(f"  the call alone (rank 0, no training): {cells}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        rank_main(args.blocks, args.steps)
        return 0
    for world in args.worlds:
        t0 = time.monotonic()
        got = run_world(world, args.blocks, args.steps)
        report(world, got, time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
