"""`steplens` entry point: a table of subcommands, each imported only when it runs.

Every subcommand module exposes ``main(argv: list[str], prog: str) -> int`` and parses its own
arguments, so `steplens CMD --help` works for each and a missing part gives a clear message.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, distribution that provides it, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "stack": (
        "steplens.stack.commands",
        "steplens-stack",
        "start, stop and inspect the local stack",
    ),
    "topics": ("steplens.stack.commands_topics", "steplens-stack", "create the Kafka topics"),
    "worker": (
        "steplens.stream_jobs.cli",
        "steplens-stream-jobs",
        "run a Faust worker: signals and alerts",
    ),
    "detect": (
        "steplens.stream_jobs.detect_cli",
        "steplens-stream-jobs",
        "score a CSV offline with the same detectors",
    ),
    "sink": ("steplens.sinks.cli", "steplens-sinks", "run a sink: influx (hot) or s3 (cold)"),
    "query": ("steplens.sinks.query_cli", "steplens-sinks", "one series across InfluxDB and S3"),
    "replay": ("steplens.sinks.replay_cli", "steplens-sinks", "re-stream cold records into Kafka"),
    "report": ("steplens.sinks.report", "steplens-sinks", "PNG figures and an HTML page for a run"),
    "mlflow": (
        "steplens.sinks.mlflow_mirror",
        "steplens-sinks",
        "mirror evaluation metrics and alerts into MLflow",
    ),
    "demo": (
        "steplens.stack.demo",
        "steplens-stack",
        "the end-to-end demo: stack, workers, sinks, training",
    ),
}


def _usage() -> str:
    lines = ["usage: steplens COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`steplens COMMAND --help` describes each command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"steplens: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, dist, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name.startswith(exc.name) or exc.name == module_name):
            print(
                f"steplens {name}: this command comes with {dist}; install it "
                f"(pip install {dist}, or `pip install -e .` in its folder)",
                file=sys.stderr,
            )
            return 3
        raise
    try:
        return int(module.main(rest, prog=f"steplens {name}") or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
