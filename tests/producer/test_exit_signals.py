"""The end of a run loses nothing: SIGTERM, SIGINT, a handler of the program's own.

Each case runs a training-like child process (signals act on a whole process); the child
reports what it saw as JSON, or leaves its records in its spool when it dies by the signal.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from steplens.producer.delivery.live_or_spool import Delivery
from steplens.producer.delivery.spool import Spool, iter_frames
from steplens.producer.delivery.transport import MemoryTransport
from steplens.schema import Record, decode

STEPS = 537  # not a multiple of the window: the last window is partial

SPOOLING_RUN = textwrap.dedent(
    """
    import sys, time
    from steplens.producer.monitor import Monitor
    run_id, spool, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    m = Monitor(run_id, kafka_bootstrap="127.0.0.1:1", topic="unreachable.raw", spool_dir=spool,
                hw_interval_s=0, delivery_timeout_s=1, shutdown_timeout_s=60, rank=0,
                local_rank=0, world_size=1)
    for step in range(steps):
        m.log_step(step, loss=2.0 - step / 1000)
    print("logged", flush=True)
    time.sleep(120)
    """
)


def _spooled(folder: Path) -> list[Record]:
    out = []
    for seg in sorted(folder.rglob("*.seg")):
        for _key, value in iter_frames(str(seg)):
            rec = decode(value)
            assert isinstance(rec, Record)
            out.append(rec)
    return out


@pytest.fixture(autouse=True)
def default_signals():
    """Children start with SIGINT and SIGTERM at their defaults, as under a terminal or
    torchrun, whatever this process inherited: a shell's background job ignores SIGINT, an
    ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt
    handler. A handled one becomes the default in the child."""
    before = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    for n, h in before.items():
        if h == signal.SIG_IGN:
            signal.signal(n, signal.default_int_handler if n == signal.SIGINT else signal.SIG_DFL)
    yield
    for n, h in before.items():
        signal.signal(n, h)


def test_sigterm_sends_the_last_window_then_ends_by_sigterm(tmp_path: Path) -> None:
    """Kafka away: the last partial window reaches the spool, the process dies by SIGTERM, and
    it does not wait its whole shutdown deadline (60 s) for a broker that does not answer."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SPOOLING_RUN,
            f"t-{uuid.uuid4().hex[:8]}",
            str(tmp_path),
            str(STEPS),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "logged"
        t0 = time.monotonic()
        child.send_signal(signal.SIGTERM)
        rc = child.wait(60)
        took = time.monotonic() - t0
    finally:
        child.kill()
    assert rc == -signal.SIGTERM
    assert took < 30, took  # a probe that gets no answer ends the wait, not the 60 s deadline
    windows = [r for r in _spooled(tmp_path) if r.kind == "step_window"]
    assert max(r.data["step_last"] for r in windows) == STEPS - 1
    assert sum(r.data["count"] for r in windows) == STEPS  # every step in exactly one window


HANDLED_RUN = textwrap.dedent(
    """
    import json, os, signal, sys, threading
    from steplens.producer.monitor import Monitor
    from steplens.producer.delivery.transport import MemoryTransport

    steps = int(sys.argv[1])
    seen = {}

    def last_window(tx):
        return max((r.data["step_last"] for r in tx.records("step_window")), default=None)

    def theirs(signum, frame):  # a program's own handler: stop after this step
        seen["theirs_saw_window_to"] = last_window(tx)

    signal.signal(signal.SIGTERM, theirs)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    tx = MemoryTransport()
    m = Monitor("handled", transport=tx, hw_interval_s=0, rank=0, local_rank=0, world_size=1,
                exit_signals=["SIGTERM", "SIGINT", "SIGHUP"])
    seen["hup_still_ignored"] = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    for step in range(steps):
        m.log_step(step, loss=1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    for step in range(steps, steps + 5):  # the Monitor goes on after a flush
        m.log_step(step, loss=1.0)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        seen["interrupted"] = False
    except KeyboardInterrupt:
        seen["interrupted"] = True
        seen["at_interrupt_window_to"] = last_window(tx)
    m.shutdown()
    seen["final_window_to"] = last_window(tx)

    found = {}
    def in_thread():
        found["m"] = Monitor("thread", transport=MemoryTransport(), hw_interval_s=0,
                             exit_signals=["SIGHUP"])
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    t = threading.Thread(target=in_thread); t.start(); t.join()
    seen["thread_left_hup"] = signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    found["m"].shutdown()
    print(json.dumps(seen))
    """
)


def test_a_handler_already_there_runs_after_a_flush_and_the_monitor_goes_on() -> None:
    out = subprocess.run(
        [sys.executable, "-c", HANDLED_RUN, str(STEPS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["theirs_saw_window_to"] == STEPS - 1  # flushed before their handler ran
    assert seen["interrupted"] is True  # SIGINT still raises KeyboardInterrupt
    assert seen["at_interrupt_window_to"] == STEPS + 4
    assert seen["final_window_to"] == STEPS + 4
    assert seen["hup_still_ignored"] is True  # an ignored signal stays ignored
    assert seen["thread_left_hup"] is True  # no handler from a thread other than the main one


def test_exit_signals_none_leaves_every_signal_alone() -> None:
    code = (
        "import signal; from steplens.producer.monitor import Monitor;"
        "from steplens.producer.delivery.transport import MemoryTransport;"
        "m = Monitor('none', transport=MemoryTransport(), hw_interval_s=0, exit_signals=[]);"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,"
        " signal.getsignal(signal.SIGINT) is signal.default_int_handler); m.shutdown()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["True", "True"]


FORKED_RUN = textwrap.dedent(
    """
    import ctypes, json, os, signal, sys, time
    from steplens.producer.monitor import Monitor
    run_id, spool = sys.argv[1], sys.argv[2]
    m = Monitor(run_id, kafka_bootstrap="127.0.0.1:1", topic="unreachable.raw", spool_dir=spool,
                hw_interval_s=0, delivery_timeout_s=1, shutdown_timeout_s=60, rank=0,
                local_rank=0, world_size=1)
    m.log_step(0, loss=1.0)

    def child(logs):
        if logs:  # a forked child that logs: its last window leaves at the signal
            for step in range(100, 137):
                m.log_step(step, loss=1.0)
            os.write(w, b"x")
            time.sleep(120)
        else:  # a DataLoader worker stuck in C code (a lock held at the fork): never back
            os.write(w, b"x")
            libc = ctypes.CDLL(None, use_errno=True)
            mutex = ctypes.create_string_buffer(64)  # zeros: a default pthread mutex
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)
        os._exit(0)

    seen = {}
    for logs in (False, True):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child(logs)
        os.read(r, 1)
        time.sleep(0.3)
        os.kill(pid, signal.SIGTERM)
        deadline, status = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = None
        died = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
        seen["logs" if logs else "stuck"] = {"pid": pid, "died_by": died}
    m.shutdown(5)
    print(json.dumps(seen))
    """
)


def test_a_forked_child_dies_by_sigterm_and_flushes_only_if_it_logs(tmp_path: Path) -> None:
    """Forked children of a rank: one stuck in C code (a DataLoader worker on a lock taken at
    the fork) still dies by SIGTERM at once, where a Python handler would never run; one that
    logs sends its last window before it dies by the signal."""
    out = subprocess.run(
        [sys.executable, "-c", FORKED_RUN, f"f-{uuid.uuid4().hex[:8]}", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["stuck"]["died_by"] == signal.SIGTERM, seen
    assert seen["logs"]["died_by"] == signal.SIGTERM, seen
    windows = [
        r for r in _spooled(tmp_path) if r.kind == "step_window" and r.pid == seen["logs"]["pid"]
    ]
    assert windows and max(r.data["step_last"] for r in windows) == 136, seen


def test_an_ending_flush_with_kafka_away_stops_at_the_first_unanswered_probe(
    tmp_path: Path,
) -> None:
    """At the end of a process nothing can move while the transport does not answer: the
    records stay in the spool and the flush returns, without waiting for its deadline or for
    the next probe. A flush while the run goes on waits for Kafka until its deadline."""
    tx = MemoryTransport()
    tx.available = False
    delivery = Delivery(lambda: tx, Spool(str(tmp_path / "spool"), 1 << 20), probe_interval_s=60)
    for i in range(10):
        delivery.send(b"k", b"record %d" % i)
    t0 = time.monotonic()
    assert delivery.flush(0.5) == 10
    assert time.monotonic() - t0 >= 0.5  # not ending: it waited its deadline
    t0 = time.monotonic()
    left = delivery.flush(120, ending=True)
    assert time.monotonic() - t0 < 30
    assert left == 10 and delivery.spool.records == 10 and delivery.state == "down"
    tx.available = True  # back: the next ending flush delivers everything
    assert delivery.flush(120, ending=True) == 0
    assert sorted(v for _, v in tx.messages) == sorted(b"record %d" % i for i in range(10))
