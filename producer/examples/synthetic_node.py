"""A training-shaped loop without a model, for trying the pipeline and the node exporter.

    STEPLENS_EXPORTER_PORT=9467 python producer/examples/synthetic_node.py --steps 1000

Steps at a steady pace with a slowly falling, noisy loss; the hardware sampler and, with
STEPLENS_EXPORTER_PORT set, the node exporter run as in a real job. Needs only the producer
(no torch, no GPU): the compose file's ``trainer`` service runs it. The last line it prints is
the producer's counters as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import threading

import steplens.producer as sl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="0: until stopped")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per step")
    parser.add_argument("--run-id", default=None, help="default: STEPLENS_RUN_ID or a new id")
    args = parser.parse_args(argv)

    stop = threading.Event()  # SIGTERM (docker stop) ends the loop; shutdown flushes
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(0)
    monitor = sl.init(args.run_id)
    step = 0
    try:
        while not stop.is_set() and (not args.steps or step < args.steps):
            loss = 2.0 + 8.0 * math.exp(-step / 2000) + rng.gauss(0.0, 0.05)
            sl.log_step(step, loss=loss, lr=3e-4, tokens=4096)
            step += 1
            stop.wait(args.step_s)
    except KeyboardInterrupt:
        pass
    sl.shutdown()
    print(json.dumps(monitor.stats()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
