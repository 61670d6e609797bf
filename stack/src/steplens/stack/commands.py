"""`steplens stack up|down|status|logs|env`: the local stack from the command line."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from steplens.stack.config import ALL_SERVICES, OPTIONAL_SERVICES, SERVICES
from steplens.stack.errors import StackError
from steplens.stack.stack import Stack, tail


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Kafka, InfluxDB 2, an S3 server and the MLflow UI (and, when asked, "
        "Alertmanager) on 127.0.0.1, without Docker. "
        "State lives in $STEPLENS_HOME (default ~/.local/state/steplens), downloads and "
        "builds in $STEPLENS_CACHE (default ~/.cache/steplens).",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="start what is not running and wait until it is healthy")
    up.add_argument(
        "services",
        nargs="*",
        choices=[[], *ALL_SERVICES],
        metavar="SERVICE",
        help=f"some of {', '.join(ALL_SERVICES)} (default: {', '.join(SERVICES)})",
    )
    up.add_argument(
        "--with",
        dest="extra",
        action="append",
        default=[],
        choices=OPTIONAL_SERVICES,
        metavar="SERVICE",
        help=f"start an optional service too: {', '.join(OPTIONAL_SERVICES)} (also "
        "STEPLENS_STACK_WITH=alertmanager)",
    )
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for health")
    sub.add_parser("down", help="stop the services this stack started")
    status = sub.add_parser("status", help="address, pid and health of each service")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    logs = sub.add_parser("logs", help="the last lines of a service's log")
    logs.add_argument(
        "service",
        nargs="?",
        choices=ALL_SERVICES,
        metavar="SERVICE",
        help=f"one of {', '.join(ALL_SERVICES)} (default: all)",
    )
    logs.add_argument("-n", type=int, default=40, help="number of lines (default 40)")
    sub.add_parser("env", help='shell exports for the stack: eval "$(steplens stack env)"')
    return parser


def _wanted(named: list[str], extra: list[str]) -> list[str]:
    """The services named (default: the default ones), plus ``--with`` and
    STEPLENS_STACK_WITH (comma-separated optional services)."""
    env = [s.strip() for s in os.environ.get("STEPLENS_STACK_WITH", "").split(",") if s.strip()]
    unknown = sorted(set(env) - set(OPTIONAL_SERVICES))
    if unknown:
        raise StackError(
            f"STEPLENS_STACK_WITH names {', '.join(unknown)}; optional services: "
            f"{', '.join(OPTIONAL_SERVICES)}"
        )
    return list(dict.fromkeys([*(named or SERVICES), *extra, *env]))


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str], prog: str = "steplens stack") -> int:
    args = _parser(prog).parse_args(argv)
    stack = Stack(progress=_progress)
    try:
        return _run(stack, args)
    except StackError as exc:
        print(f"{prog} {args.action}: {exc}", file=sys.stderr)
        return exc.exit_code


def _run(stack: Stack, args: argparse.Namespace) -> int:
    if args.action == "up":
        stack.up(_wanted(args.services, args.extra), timeout_s=args.timeout)
        for st in stack.status():
            if st.running:
                print(f"{st.name:<12} {st.address:<22} {'healthy' if st.healthy else st.detail}")
        live = stack.env().get("MLFLOW_TRACKING_URI")
        if live:
            print(f"live view: {live} (MLflow; `steplens mlflow` follows the runs into it)")
        print(f'use it from a shell: eval "$(steplens stack env)"  (state: {stack.home})')
        return 0
    if args.action == "down":
        stopped = stack.down()
        print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
        return 0
    if args.action == "status":
        statuses = stack.status()
        if args.json:
            print(json.dumps([st.as_dict() for st in statuses], indent=2))
        else:
            for st in statuses:
                state = "healthy" if st.healthy else st.detail
                pid = f"pid {st.pid}" if st.pid else ""
                print(f"{st.name:<12} {st.address:<22} {pid:<11} {state}")
        return 0 if all(st.healthy for st in statuses if st.running) else 1
    if args.action == "logs":
        for name in [args.service] if args.service else stack.listed():
            path = stack.cfg.log_path(name)
            if not args.service:
                print(f"==> {path} <==")
            print("\n".join(tail(path, args.n)))
        return 0
    if args.action == "env":
        for key, value in stack.env().items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    raise AssertionError(args.action)
