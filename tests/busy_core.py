"""Run a command while this process keeps one core busy: the tests on a loaded machine
(`make test-busy`). The load is bounded: it stops when the command ends, after ``--max-s``
seconds, or on Ctrl-C (the command gets the signal too); the command's exit status is returned.

    python tests/busy_core.py [--max-s 7200] -- python -m pytest -q tests
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def spin(seconds: float) -> None:
    """Keep this process's core busy for ``seconds`` (wall clock)."""
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for _ in range(10_000):
            x = (x * 1_103_515_245 + 12_345) & 0xFFFFFFFF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-s", type=float, default=7200.0, help="stop the load after this")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (busy_core.py -- COMMAND ...)")
    t0, cpu0 = time.monotonic(), time.process_time()
    proc = subprocess.Popen(command)
    try:
        while proc.poll() is None and time.monotonic() - t0 < args.max_s:
            spin(0.1)
        rc = proc.wait()
    except KeyboardInterrupt:
        rc = proc.wait()
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    print(f"busy_core: {cpu:.0f} s of CPU over {wall:.0f} s beside the command", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
