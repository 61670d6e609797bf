"""Cost of timing the run's own DDP all-reduce (``ddp_comm.py``), as ratios in the same run.

Two gloo ranks on this machine's CPU train an MLP four ways from the same weights, in
interleaved blocks of steps: plain DDP; DDP with torch's own Python all-reduce hook
(``default_hooks.allreduce_hook``: what any Python communication hook costs); with steplens's
hook timing one step in 100 (the default ``comm_every``); timing every step. Two shapes: DDP's
default 25 MB buckets (8 layers of 512: one 8 MB bucket), and the worst case, tiny buckets (6
layers of 256, a 0.3 MB bucket each). Prints each rank's median step time and the ratios to
plain DDP, on the wall clock and in the process's CPU time per step (gloo's threads included:
the figure that holds on a loaded machine).

    python bench/bench_ddp_comm.py              # about a minute
    python bench/bench_ddp_comm.py --blocks 40
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def rank_main(blocks: int, steps: int, width: int, layers: int, bucket_mb: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import steplens.producer as sl

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    sl.init(transport=sl.MemoryTransport(), hw_interval_s=0, spool_dir=tempfile.mkdtemp())

    def model(every: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        layer = [torch.nn.Linear(width, width) for _ in range(layers)]
        net = DDP(torch.nn.Sequential(*layer), bucket_cap_mb=bucket_mb)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        if every < 0:  # torch's own Python all-reduce hook: the floor of any Python hook
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            net.register_comm_hook(None, default_hooks.allreduce_hook)
        elif every:
            from steplens.producer.instruments.ddp_comm import DdpCommTimer

            DdpCommTimer(sl.get_monitor()._enqueue_comm, every).attach(net)
        return net, opt

    ways = {
        "plain": model(0),
        "python hook": model(-1),
        "every 100": model(100),
        "every 1": model(1),
    }
    x = torch.randn(64, width)
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    for block in range(blocks):
        order = list(ways) if block % 2 == 0 else list(reversed(ways))
        for name in order:
            net, opt = ways[name]
            c0 = time.process_time()
            for _ in range(steps):
                t0 = time.perf_counter()
                net(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                wall[name].append(time.perf_counter() - t0)
            cpu[name].append((time.process_time() - c0) / steps)
    sl.flush(30)
    sl.shutdown()
    dist.destroy_process_group()
    out = {
        "rank": int(os.environ["RANK"]),
        "wall": {k: statistics.median(v) * 1e3 for k, v in wall.items()},
        "cpu": {k: statistics.median(v) * 1e3 for k, v in cpu.items()},
    }
    print(json.dumps(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rank", nargs=3, type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        width, layers, bucket_mb = args.rank
        rank_main(args.blocks, args.steps, int(width), int(layers), bucket_mb)
        return 0
    for shape in ((512, 8, 25.0), (256, 6, 0.3)):
        run_shape(args, *shape)
    return 0


def run_shape(args: argparse.Namespace, width: int, layers: int, bucket_mb: float) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
            "STEPLENS_RUN_ID": "bench-ddp-comm",
        }
        cmd = [
            sys.executable,
            __file__,
            "--rank",
            str(width),
            str(layers),
            str(bucket_mb),
            "--blocks",
            str(args.blocks),
            "--steps",
            str(args.steps),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    print(f"{layers} layers of {width}, {bucket_mb} MB buckets")
    print("rank  clock  plain ms  torch python hook (ratio)  every-100 (ratio)  every-1 (ratio)")
    for p in procs:
        out, _ = p.communicate(timeout=600)
        r = json.loads(out.strip().splitlines()[-1])
        for clock in ("wall", "cpu"):
            m = r[clock]
            base = m["plain"]
            cells = [
                f"{m[k]:8.3f} ({m[k] / base:.3f})" for k in ("python hook", "every 100", "every 1")
            ]
            print(f"{r['rank']:>4}  {clock:>5}  {base:8.3f}  " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
