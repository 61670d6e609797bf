"""One rank of the DDP test: gloo, a small model in many gradient buckets, trained twice from
the same weights on the same batches, with steplens timing its all-reduce and without."""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import steplens.producer as sl

    steps, every = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        net = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(6)))
        return DDP(net, bucket_cap_mb=0.02)  # about one layer a bucket

    timed, plain = model(), model()
    tx = sl.MemoryTransport()
    m = sl.init(transport=tx, hw_interval_s=0, comm_every=every, spool_dir=sys.argv[3])
    opt_t = torch.optim.SGD(timed.parameters(), lr=0.1)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.1)
    sl.watch(timed, opt_t, every=1000)
    gen = torch.Generator().manual_seed(rank)
    seconds = {"timed": 0.0, "plain": 0.0}
    for step in range(steps):
        x = torch.randn(32, 64, generator=gen)
        for name, net, opt in (("timed", timed, opt_t), ("plain", plain, opt_p)):
            t0 = time.perf_counter()
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            seconds[name] += time.perf_counter() - t0
        sl.log_step(step, loss=float(loss.detach()))
    ok = sl.flush(30)
    comm = [r.data for r in tx.records("comm")]
    diff = max(
        float((a - b).abs().max())
        for a, b in zip(timed.parameters(), plain.parameters(), strict=True)
    )
    checksum = float(sum(p.double().sum() for p in timed.parameters()))
    sl.shutdown()
    dist.destroy_process_group()
    out = {"rank": rank, "flushed": ok, "comm": comm, "diff": diff, "checksum": checksum}
    print(json.dumps({**out, "seconds": seconds, "errors": m.stats()["caller_errors"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
