"""`steplens demo`: the whole product on one machine, with incidents to catch.

Starts the local stack, a stream worker and both sinks as subprocesses (and the Alertmanager
output while the stack's Alertmanager runs; and the MLflow mirror, whose run page, printed
first, is the live view), trains a small transformer LM as 2 CPU ranks
under torchrun (``demo_train``) with scripted incidents, waits for the stream jobs to catch
up, prints what steplens caught next to what was injected, and writes the report (``steplens
report``). The stack stays up; `steplens stack down` stops it.

With ``--act`` it proves the remedies instead (``demo_act``): four scenarios (a one-batch
blip, an lr blow-up that diverges, a bad shard that recurs, a healthy run), each trained from
one seed with the remedies and without, and a scorecard of what the remedies did, what they
cost and how each run ended (``demo_recovery``); a broken promise exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from steplens.stack.demo_children import (
    Children,
    free_port,
    port_or_free,
    wait_file,
    wait_port,
)
from steplens.stack.demo_incidents import (
    estimate_steps,
    format_scorecard,
    load_plan,
    load_starts,
    score,
)
from steplens.stack.private_files import UMASK, open_private, private_dir

QUICK_STEPS = 240
HANG_AFTER_S = 60.0  # the stream jobs' default: a stall must last longer to be a hang
QUICK_HANG_AFTER_S = 20.0
# Prometheus ports of the worker and the sinks (docs/architecture.md); taken ones are replaced
DEFAULT_PORTS = {"worker": 9464, "sink-influx": 9465, "sink-s3": 9466, "sink-alertmanager": 9469}


def say(line: str) -> None:
    print(line, flush=True)


def run_training(
    args: argparse.Namespace,
    env: dict[str, str],
    plan_file: Path,
    log_dir: Path,
    children: Children,
    *,
    run_id: str | None = None,
    script: list[str] | None = None,
) -> int:
    """torchrun with 2 ranks; its lines are shown as they come (they carry the progress).
    ``run_id`` (default: the demo's); ``script``: the training script's arguments (default:
    the demo's run with its incident plan)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(args.ranks),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "steplens.stack.demo_train",
        "--run-id",
        run_id or args.run_id,
        *(
            script
            if script is not None
            else [
                "--steps",
                str(args.steps),
                "--stall-s",
                str(args.stall_s),
                "--slow-s",
                str(args.slow_s),
                "--incidents-file",
                str(plan_file),
            ]
        ),
    ]
    train_env = {**env, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    log = open_private(log_dir / f"train-{run_id}.log" if run_id else log_dir / "train.log")
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=train_env,
        text=True,
        start_new_session=True,
        umask=UMASK,  # the incident plan and anything else the ranks write: private
    )
    deadline = time.monotonic() + args.train_timeout_s
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.write(line)
            if line.startswith("[demo]"):
                say(line.rstrip())
            if time.monotonic() > deadline:
                say(f"[demo] training ran past {args.train_timeout_s:.0f} s; stopping it")
                os.killpg(proc.pid, signal.SIGTERM)
                break
            dead = children.check()
            if dead is not None:
                say(f"[demo] {dead.name} exited during training; stopping:\n{dead.tail()}")
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
                return 1
        return proc.wait(timeout=30)
    finally:
        log.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def parse_args(argv: list[str], prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument(
        "--steps", type=int, default=None, help="training steps (default 500; --act: 300 a run)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_STEPS} steps and a 35 s stall (about 3 minutes in all; --act: 200 a run)",
    )
    p.add_argument("--run-id", default="", help="default: demo-<random>")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="stream worker processes")
    p.add_argument(
        "--stall-s",
        type=float,
        default=None,
        help="stall length (default: the worker's hang threshold + 15 s)",
    )
    p.add_argument("--slow-s", type=float, default=0.5, help="straggler delay per step")
    p.add_argument("--out", type=Path, default=None, help="report folder")
    p.add_argument(
        "--isolated",
        action="store_true",
        help="topics of its own (steplens.<run>.*), so other runs on the stack are not read",
    )
    p.add_argument("--no-report", action="store_true")
    p.add_argument(
        "--act",
        action="store_true",
        help="prove the remedies: each scenario trained with them and without (docs/demo.md)",
    )
    p.add_argument(
        "--scenario",
        action="append",
        default=None,
        help="--act: only this scenario (repeatable; default: all four)",
    )
    p.add_argument(
        "--settle-s",
        type=float,
        default=120.0,
        help="longest wait for the stream jobs after training",
    )
    p.add_argument("--train-timeout-s", type=float, default=900.0)
    args = p.parse_args(argv)
    args.steps_given = args.steps is not None
    if args.steps is None:
        args.steps = 500
    if args.quick:
        args.steps = min(args.steps, QUICK_STEPS)
    args.hang_after_s = QUICK_HANG_AFTER_S if args.quick else HANG_AFTER_S
    if args.stall_s is None:
        args.stall_s = args.hang_after_s + 15.0
    args.run_id = args.run_id or f"demo-{uuid.uuid4().hex[:8]}"
    return args


def main(argv: list[str], prog: str = "steplens demo") -> int:
    args = parse_args(argv, prog)
    import steplens.stack
    from steplens.schema.topics import Topics, ensure_topics

    say("[demo] starting the local stack (the first start builds it: this can take a while)")
    try:
        stack_env = steplens.stack.up(progress=lambda line: say(f"[stack] {line}"))
    except steplens.stack.StackError as exc:
        say(f"[demo] the local stack did not start: {exc}")
        return 1
    env = {
        **os.environ,
        **stack_env,
        "STEPLENS_RUN_ID": args.run_id,
    }
    if args.isolated:
        prefix = f"steplens.{args.run_id}"
        for key, name in (
            ("RAW", "raw"),
            ("SIGNALS", "signals"),
            ("ALERTS", "alerts"),
            ("ADVICE", "advice"),
        ):
            env[f"STEPLENS_TOPIC_{key}"] = f"{prefix}.{name}"
        env["STEPLENS_TOPIC_DEADLETTER"] = f"{prefix}.deadletter"
    d = Topics.from_env()
    topics = Topics(
        raw=env.get("STEPLENS_TOPIC_RAW", d.raw),
        signals=env.get("STEPLENS_TOPIC_SIGNALS", d.signals),
        alerts=env.get("STEPLENS_TOPIC_ALERTS", d.alerts),
        dead_letters=env.get("STEPLENS_TOPIC_DEADLETTER", d.dead_letters),
        advice=env.get("STEPLENS_TOPIC_ADVICE", d.advice),
        raw_partitions=d.raw_partitions,
        other_partitions=d.other_partitions,
    )
    ensure_topics(stack_env["STEPLENS_KAFKA_BOOTSTRAP"], topics)
    home = Path(env.get("STEPLENS_HOME", Path.home() / ".local/state/steplens"))
    run_dir = home / "demo" / args.run_id
    private_dir(home / "demo")  # made before as 0755, or as a parent by mkdir -p
    private_dir(run_dir)
    out = args.out or run_dir / "report"
    say(f"[demo] run {args.run_id}; logs in {run_dir}")

    children = Children(run_dir, env)
    try:
        return _run(args, env, topics, run_dir, out=out, children=children)
    finally:
        say("[demo] stopping the worker and sinks (the stack stays up: `steplens stack down`)")
        children.stop_all()


def _run(
    args: argparse.Namespace,
    env: dict[str, str],
    topics: Any,
    run_dir: Path,
    *,
    out: Path,
    children: Children,
) -> int:
    from steplens.stack.demo_kafka import RunTail, alert_rows

    ports = {name: port_or_free(port) for name, port in DEFAULT_PORTS.items()}
    # every 5th step's quiet signal is published too, so the report draws the ARIMA band
    hang = ["--hang-after", str(args.hang_after_s), "--signal-every", "5", "--signal-interval", "0"]
    if args.act:
        from steplens.stack.demo_act import ACT_WORKER_ARGS

        hang += ACT_WORKER_ARGS
    commands = [
        ("worker", ["worker", *hang, "--state-dir", str(run_dir / "worker-0")]),
        ("sink-influx", ["sink", "influx"]),
        ("sink-s3", ["sink", "s3"]),
    ]
    if env.get("STEPLENS_ALERTMANAGER_URL"):  # the stack's Alertmanager runs: notify it
        commands.append(("sink-alertmanager", ["sink", "alertmanager"]))
    commands += [
        (f"worker-{i}", ["worker", *hang, "--state-dir", str(run_dir / f"worker-{i}")])
        for i in range(1, args.workers)
    ]
    started = []
    for name, cmd in commands:
        port = ports.get(name) or free_port()
        flag = "--web-port" if cmd[0] == "worker" else "--metrics-port"
        extra = [flag, str(port)]
        if args.isolated:  # consumer groups of its own too
            key = "--app-id" if cmd[0] == "worker" else "--group"
            extra += [key, f"steplens-demo-{args.run_id}-{cmd[-1] if cmd[0] == 'sink' else 'w'}"]
        started.append((children.start(name, [*cmd, *extra]), port))
    live = None
    if env.get("MLFLOW_TRACKING_URI"):  # the stack's MLflow server: the live view
        live = run_dir / "live-view.url"
        live.unlink(missing_ok=True)
        group = f"steplens-demo-{args.run_id}-mlflow"
        mirror = ["mlflow", "--run", args.run_id, "--group", group, "--url-file", str(live)]
        live_child = children.start("mlflow", mirror)
    for child, port in started:
        wait_port(port, child, 120.0, say)
    if live is not None:
        say(f"[demo] live view: {wait_file(live, live_child, 120.0)}")
    say("[demo] worker and sinks are up; training starts")
    if args.act:
        from steplens.stack.demo_act import run_scenarios

        def train(run_id: str, script: list[str], train_env: dict[str, str]) -> int:
            plan = run_dir / f"incidents-{run_id}.json"
            return run_training(
                args, train_env, plan, run_dir, children, run_id=run_id, script=script
            )

        return run_scenarios(args, env, topics.advice, run_dir, train, say=say)

    tail = RunTail(env["STEPLENS_KAFKA_BOOTSTRAP"], [topics.signals, topics.alerts], args.run_id)
    plan_file = run_dir / "incidents.json"
    t0 = time.monotonic()
    rc = run_training(args, env, plan_file, run_dir, children)
    say(f"[demo] training finished in {time.monotonic() - t0:.0f} s (exit {rc})")
    if rc != 0:
        say(f"[demo] training failed; see {run_dir / 'train.log'}")
        return 1
    tail.settle(quiet_s=8.0, timeout_s=args.settle_s, progress=say)
    alerts = alert_rows(tail.of_kind("alert"))
    signals = tail.of_kind("signal")
    n_signals = len(signals)
    estimate_steps(alerts, [(r.time_ns, r.step) for r in signals if r.step is not None])
    tail.close()
    plan = load_plan(plan_file)
    starts = load_starts(plan_file.with_suffix(".starts.jsonl"))
    card = score(plan, alerts, slack=max(10, args.steps // 40), started_ns=starts)
    say(format_scorecard(plan, card))
    say(f"({n_signals} signal records, {len(alerts)} alert records for this run)")

    if args.no_report:
        return 0
    say("[demo] writing the report from the stored data ...")
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "steplens.schema.command",
            "report",
            "--run",
            args.run_id,
            "--out",
            str(out),
            "--wait-for-step",
            str(args.steps - 1),
            "--wait-s",
            "90",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=600,
        check=False,
    )
    if report.returncode != 0:
        say(f"[demo] the report failed (exit {report.returncode})")
        return 1
    say(f"[demo] report: {out / 'index.html'}")
    return 0
