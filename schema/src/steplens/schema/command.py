"""The `steplens` command: subcommands registered by each installed part, imported only when
one runs.

It lives in the producer, which every other part depends on, so `pip install
steplens-stream-jobs` alone gives `steplens worker` and `pip install steplens-sinks` the sink
commands. A part registers its subcommands in the entry-point group ``steplens.commands``
(``worker = "steplens.stream_jobs.worker.cli:main"``); each ``main(argv: list[str], prog: str) ->
int`` parses its own arguments, so `steplens CMD --help` works for each. A command of a part
that is not installed says which distribution to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

GROUP = "steplens.commands"

# name -> (distribution, module, one-line help) of the commands steplens's own parts provide:
# the help lists them, and a missing one names its distribution. The module is used only
# where the part's metadata lacks the entry point (a source tree put on PYTHONPATH, an
# editable install made before the group existed); tests hold it equal to the entry points.
BUILTIN: dict[str, tuple[str, str, str]] = {
    "stack": (
        "steplens-stack",
        "steplens.stack.commands",
        "start, stop and inspect the local stack",
    ),
    "topics": ("steplens-stack", "steplens.stack.commands_topics", "create the Kafka topics"),
    "worker": (
        "steplens-stream-jobs",
        "steplens.stream_jobs.worker.cli",
        "run a Faust worker: signals and alerts",
    ),
    "detect": (
        "steplens-stream-jobs",
        "steplens.stream_jobs.offline.cli",
        "score a CSV offline with the same detectors",
    ),
    "sink": ("steplens-sinks", "steplens.sinks.cli", "run a sink: influx (hot) or s3 (cold)"),
    "query": ("steplens-sinks", "steplens.sinks.query_cli", "one series across InfluxDB and S3"),
    "replay": ("steplens-sinks", "steplens.sinks.replay_cli", "re-stream cold records into Kafka"),
    "spool": ("steplens-producer", "steplens.producer.spool_cli", "send a producer's disk spool"),
    "report": ("steplens-sinks", "steplens.sinks.report", "PNG figures and an HTML page for a run"),
    "mlflow": (
        "steplens-sinks",
        "steplens.sinks.mlflow_mirror",
        "mirror evaluations, incidents and a run summary into MLflow",
    ),
    "demo": (
        "steplens-stack",
        "steplens.stack.demo",
        "the end-to-end demo: stack, workers, sinks, training",
    ),
}

Main = Callable[..., Any]


def registered() -> dict[str, Any]:
    """The installed parts' commands: name -> entry point."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _usage(installed: dict[str, Any]) -> str:
    lines = ["usage: steplens COMMAND [ARGS...]", "", "commands:"]
    for name in [*BUILTIN, *sorted(set(installed) - set(BUILTIN))]:
        dist, _, help_ = BUILTIN.get(name, ("", "", ""))
        if name in installed or _importable(name):
            lines.append(f"  {name:<8} {help_}")
        else:
            lines.append(f"  {name:<8} (pip install {dist})")
    lines += ["", "`steplens COMMAND --help` describes each command."]
    return "\n".join(lines)


def _importable(name: str) -> bool:
    """A built-in command whose part is importable without metadata (see ``BUILTIN``)."""
    if name not in BUILTIN:
        return False
    package = BUILTIN[name][1].rsplit(".", 1)[0]
    try:
        return importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:
        return False


def _load(name: str, installed: dict[str, Any]) -> Main | None:
    """The command's ``main``; None when its part is not installed."""
    if name in installed:
        return installed[name].load()
    module_name = BUILTIN[name][1]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None
        raise
    return module.main


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    installed = registered()
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage(installed))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in installed and name not in BUILTIN:
        print(f"steplens: unknown command {name!r}\n\n{_usage(installed)}", file=sys.stderr)
        return 2
    command = _load(name, installed)
    if command is None:
        dist = BUILTIN[name][0]
        print(
            f"steplens {name}: this command comes with {dist}; install it "
            f"(pip install {dist}, or `pip install -e .` in its folder)",
            file=sys.stderr,
        )
        return 3
    try:
        return int(command(rest, prog=f"steplens {name}") or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
