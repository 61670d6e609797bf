"""One training rank for the multi-process Kafka test: gloo process group, 10,000 steps."""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    import torch.distributed as dist

    import steplens.producer as sl

    steps = int(sys.argv[1])
    dist.init_process_group("gloo")
    m = sl.init(sample_rate=1.0, hw_interval_s=0.5, spool_dir=os.environ["SPOOL_DIR"])
    sl.probe_comm(every=1000)
    for step in range(steps):
        sl.log_step(step, loss=2.0 + 1e-4 * step, lr=1e-3, tokens=2048, extra=float(step % 7))
    ok = sl.flush(60)
    stats = m.stats()
    sl.shutdown()
    dist.destroy_process_group()
    print(json.dumps({**stats, "rank": m.rank, "flushed": ok, "seq": m.stats()["seq"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
