"""The `steplens` command: the subcommands the installed parts register in the entry-point
group ``steplens.commands``, each imported only when it runs.

It comes with the wire contract (steplens-schema), which every part depends on, so `pip install
steplens-stream-jobs` alone gives `steplens worker` and `pip install steplens-sinks` the sink
commands. A part registers each command as ``name = "package.module:main"``; that
``main(argv: list[str], prog: str) -> int`` parses its own arguments, so `steplens CMD --help`
works for each. Commands are found through the entry points only; ``KNOWN`` names the
distribution and a line of help of steplens's own commands (never their modules), so that the
listing describes them and a command of a part that is not installed says what to install.
"""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint, entry_points

GROUP = "steplens.commands"

# name -> (distribution that registers it, one-line help): the listing's order
KNOWN: dict[str, tuple[str, str]] = {
    "stack": ("steplens-stack", "start, stop and inspect the local stack"),
    "topics": ("steplens-stack", "create the Kafka topics"),
    "worker": ("steplens-stream-jobs", "run a Faust worker: signals and alerts"),
    "detect": ("steplens-stream-jobs", "score a CSV offline with the same detectors"),
    "sink": ("steplens-sinks", "run a sink or an output: influx, s3, webhook, alertmanager"),
    "query": ("steplens-sinks", "one series across InfluxDB and S3"),
    "replay": ("steplens-sinks", "re-stream cold records into Kafka"),
    "spool": ("steplens-producer", "send a producer's disk spool"),
    "report": ("steplens-sinks", "PNG figures and an HTML page for a run"),
    "mlflow": ("steplens-sinks", "mirror evaluations, incidents and a run summary into MLflow"),
    "demo": ("steplens-stack", "the end-to-end demo: stack, workers, sinks, training"),
}


def registered() -> dict[str, EntryPoint]:
    """The installed parts' commands: name -> entry point."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _usage(installed: dict[str, EntryPoint]) -> str:
    lines = ["usage: steplens COMMAND [ARGS...]", "", "commands:"]
    for name in [*KNOWN, *sorted(set(installed) - set(KNOWN))]:
        dist, help_ = KNOWN.get(name, ("", ""))
        described = help_ if name in installed else f"(pip install {dist})"
        lines.append(f"  {name:<8} {described}".rstrip())
    lines += ["", "`steplens COMMAND --help` describes each command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    installed = registered()
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage(installed))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in installed:
        if name not in KNOWN:
            print(f"steplens: unknown command {name!r}\n\n{_usage(installed)}", file=sys.stderr)
            return 2
        dist = KNOWN[name][0]
        print(
            f"steplens {name}: this command comes with {dist}; install it "
            f"(pip install {dist}, or `pip install -e .` in its folder)",
            file=sys.stderr,
        )
        return 3
    command = installed[name].load()
    try:
        return int(command(rest, prog=f"steplens {name}") or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
