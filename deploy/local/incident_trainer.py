"""The compose check's trainer: a steady, noisy loss falling slowly, and a non-finite loss every
``CHECK_INCIDENT_EVERY`` steps (default 150) of ``CHECK_STEP_S`` seconds (default 0.1: every
15 s) after a clean first 200 steps, so that every run keeps raising incidents a check can
wait for. The run id is ``check-<container hostname>``: the check finds each replica's run from
its container id.
"""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import threading

import steplens.producer as sl


def main() -> int:
    every = int(os.environ.get("CHECK_INCIDENT_EVERY", "150"))
    step_s = float(os.environ.get("CHECK_STEP_S", "0.1"))
    stop = threading.Event()  # SIGTERM (docker stop) ends the loop; shutdown flushes
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random()
    sl.init(f"check-{socket.gethostname()}")
    step = 0
    while not stop.is_set():
        loss = 2.0 + 8.0 * math.exp(-step / 2000) + rng.gauss(0.0, 0.05)
        if step >= 200 and step % every == 0:
            loss = math.nan
        sl.log_step(step, loss=loss, lr=3e-4, tokens=4096)
        step += 1
        stop.wait(step_s)
    sl.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
