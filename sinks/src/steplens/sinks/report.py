"""`steplens report --run RUN`: PNG figures and one HTML page for a run, from stored data.

``report_data`` reads the run through the query layer into a ``RunData``; ``report_figures``
draws it (pure functions, testable without a stack); ``report_page`` writes the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from steplens.sinks.query import StoreRefused
from steplens.sinks.report_data import load_run, wait_for_steps
from steplens.sinks.report_page import write_report


def main(argv: list[str], prog: str = "steplens report") -> int:
    p = argparse.ArgumentParser(prog=prog, description="PNG figures and an HTML page for a run")
    p.add_argument("--run", required=True, help="run id")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder (default ./steplens-report-RUN); made readable by its owner only",
    )
    p.add_argument(
        "--wait-for-step",
        type=int,
        default=None,
        help="first wait until every rank stored this step, raw or as a window's last "
        "(bounded by --wait-s)",
    )
    p.add_argument("--wait-s", type=float, default=60.0)
    args = p.parse_args(argv)
    try:
        missing = (
            None
            if args.wait_for_step is None
            else wait_for_steps(args.run, args.wait_for_step, args.wait_s)
        )
        if missing is not None:
            print(
                f"{prog}: step {args.wait_for_step} not stored after {args.wait_s:.0f} s "
                f"({missing}); reporting what is there",
                file=sys.stderr,
            )
        data = load_run(args.run)
    except StoreRefused as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if data.steps.empty:
        print(f"{prog}: no steps stored for run {args.run!r}", file=sys.stderr)
        return 1
    out = args.out or Path(f"steplens-report-{args.run}")
    index = write_report(data, out)
    print(f"report written: {index.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
