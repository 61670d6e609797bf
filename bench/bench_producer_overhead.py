"""Cost of steplens in the training loop, as ratios measured in the same run.

1. ``log_step`` with 10 values in a tight loop (caller's thread, the producer's worker thread
   running): p50/p99 against the floor (building a dict of the same values and appending it to
   a ``collections.deque``) and against ``wandb.log`` in offline mode.
2. A small torch model training on CPU with ``watch(every=1)``, the hardware sampler and
   ``log_step`` every step, against the same loop without steplens: many short A/B/B/A
   quartets, median ratio and its interquartile range.
3. Import time of ``steplens.producer`` and resident memory added by ``init`` (fresh processes).

    python bench/bench_producer_overhead.py            # about a minute
    python bench/bench_producer_overhead.py --long     # more rounds
    python bench/bench_producer_overhead.py --calls    # only table 1 (seconds)
    python bench/bench_producer_overhead.py --watch-against OLD_CHECKOUT
        # watch(every=10) and watch(every=1): this watcher against OLD_CHECKOUT's, A/B/B/A in
        # one process (the old watcher.py loaded from its file)
    python bench/bench_producer_overhead.py --advice-against OLD_CHECKOUT
        # the advice channel's cost: log_step here (the default remedies, and skip_samples:
        # the worker thread polls for advice) against OLD_CHECKOUT's producer (its default),
        # each in child processes,
        # alternated; and an empty sl.advice() against a no-op call
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

SCALARS = {f"s{i}": 0.1 * i for i in range(6)}  # + loss, lr, grad_norm, tokens = 10 values


def percentiles(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return s[len(s) // 2], s[int(len(s) * 0.99)]


def time_calls(call: Callable[[int], Any], n: int) -> tuple[float, float]:
    clock = time.perf_counter_ns
    samples = []
    for i in range(n):
        t0 = clock()
        call(i)
        samples.append(clock() - t0)
    return percentiles([x / 1e3 for x in samples])


def bench_log_step(rounds: int, n: int) -> None:
    import steplens.producer as sl
    from steplens.producer import MemoryTransport

    spool = tempfile.mkdtemp()
    sl.init("bench", transport=MemoryTransport(), hw_interval_s=0, spool_dir=spool)
    q: collections.deque[Any] = collections.deque(maxlen=65536)

    def floor(i: int) -> None:
        q.append({"step": i, "loss": 1.0, "lr": 1e-4, "grad_norm": 0.5, "tokens": 4096, **SCALARS})

    def steplens_call(i: int) -> None:
        sl.log_step(i, loss=1.0, lr=1e-4, grad_norm=0.5, tokens=4096, **SCALARS)

    results: dict[str, list[tuple[float, float]]] = {"dict + deque.append": [], "sl.log_step": []}
    wandb_run = None
    try:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        wandb_run = wandb.init(project="steplens-bench", dir=tempfile.mkdtemp(), mode="offline")
        results["wandb.log (offline)"] = []
    except Exception as exc:
        print(f"wandb not available ({exc}); the ANCHORS figure is 149 us p50 / 605 us p99")

    def wandb_call(i: int) -> None:
        assert wandb_run is not None
        wandb_run.log(
            {"loss": 1.0, "lr": 1e-4, "grad_norm": 0.5, "tokens": 4096, **SCALARS}, step=i
        )

    for r in range(rounds):
        results["dict + deque.append"].append(time_calls(floor, n))
        q.clear()
        results["sl.log_step"].append(time_calls(lambda i, r=r: steplens_call(r * n + i), n))
        if wandb_run is not None:
            results["wandb.log (offline)"].append(
                time_calls(lambda i, r=r: wandb_call(r * n + i), n // 10)
            )
    sl.shutdown()
    if wandb_run is not None:
        wandb_run.finish()
    med = {
        k: (statistics.median(p for p, _ in v), statistics.median(p for _, p in v))
        for k, v in results.items()
    }
    print(
        f"\n1) one call with 10 values, medians of {rounds} rounds (us, perf_counter_ns included)"
    )
    for name, (p50, p99) in med.items():
        print(f"   {name:<22} p50 {p50:8.2f}  p99 {p99:8.2f}")
    base = med["sl.log_step"]
    print(
        f"   log_step / (dict + deque.append): p50 {base[0] / med['dict + deque.append'][0]:.1f}x"
    )
    if "wandb.log (offline)" in med:
        w = med["wandb.log (offline)"]
        print(f"   wandb.log / log_step:    p50 {w[0] / base[0]:.0f}x  p99 {w[1] / base[1]:.0f}x")


def bench_training(quartets: int, steps: int) -> None:

    import steplens.producer as sl
    from steplens.producer import MemoryTransport

    model, opt, run = _mlp_loop()

    def loop(with_steplens: bool) -> float:
        return run(steps, with_steplens)

    loop(False)  # warm-up
    spool = tempfile.mkdtemp()
    m = sl.init(
        "bench-train",
        transport=MemoryTransport(),
        hw_interval_s=1.0,
        spool_dir=spool,
        sample_rate=0.01,
    )

    def block(watch_every: int | None) -> float:
        """``None``: plain loop; 0: log_step + hw sampler; N: also watch(every=N)."""
        if watch_every is None:
            return loop(False)
        if watch_every:
            sl.watch(model, opt, every=watch_every)
        try:
            return loop(True)
        finally:
            m._watching.remove()
            m._watching.watchers.clear()
            m._update_plain_path()

    loop(True)  # warm-up of the steplens path
    print(
        f"\n2) CPU training step (MLP 256-512-512-10, batch 64, 1 thread), {quartets} A/B/B/A "
        f"quartets of {steps} steps per variant; ratio = step time with / without steplens"
    )
    # Short A/B/B/A quartets: a slow phase of a noisy machine hits both sides of a quartet alike,
    # and the order inside each quartet cancels a linear drift.
    for label, every in (
        ("log_step + hw sampler", 0),
        ("  + watch(every=10)", 10),
        ("  + watch(every=1)", 1),
    ):
        ratios, plain, traced = [], [], []
        for _ in range(quartets):
            a1, b1, b2, a2 = block(None), block(every), block(every), block(None)
            plain.append((a1 + a2) / 2)
            traced.append((b1 + b2) / 2)
            ratios.append((b1 + b2) / (a1 + a2))
        q1, med, q3 = statistics.quantiles(ratios, n=4)
        p, t = statistics.median(plain), statistics.median(traced)
        print(
            f"   {label:<22} {p * 1e3:7.2f} ms -> {t * 1e3:7.2f} ms   ratio median {med:.4f} "
            f"IQR {q1:.4f}-{q3:.4f}"
        )
    sl.shutdown()


def _mlp_loop() -> tuple[Any, Any, Callable[..., float]]:
    import torch

    import steplens.producer as sl

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def loop(steps: int, with_steplens: bool = True) -> float:
        t0 = time.perf_counter()
        for step in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if with_steplens:
                sl.log_step(step, loss=loss, lr=1e-3, grad_norm=gn, tokens=64)
        return (time.perf_counter() - t0) / steps

    return model, opt, loop


def _hook_cost(cls: Any, m: Any, model: Any, opt: Any, n: int = 200) -> float:
    """Median microseconds of a watcher's three hooks on one watched step (gradients kept)."""
    import torch

    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    w = cls(_results_for(cls, m), model, opt, None, every=1, sample_size=4096)
    samples = []
    try:
        for _ in range(n):
            t0 = time.perf_counter_ns()
            w._end_of_backward()
            w._before_step(opt, (), {})
            w._publish()
            samples.append(time.perf_counter_ns() - t0)
            w._preclip = w._postclip = w._before = w._probe_before = w._clipped = None
    finally:
        w.remove()
    return statistics.median(samples) / 1e3


class _MonitorSide:
    """What a Watcher from before the Monitor's parts called on its monitor, forwarded to the
    Monitor's ``Watching`` part."""

    def __init__(self, watching: Any) -> None:
        self.counts = watching.counts
        self._watch_result = watching.result
        self._watch_between = watching.between


def _results_for(cls: Any, m: Any) -> Any:
    """Where a Watcher class sends its figures: the Watching part, or for an older class that
    takes the monitor, the same through ``_MonitorSide``."""
    import inspect

    first = next(iter(inspect.signature(cls).parameters))
    return _MonitorSide(m._watching) if first == "monitor" else m._watching


def bench_watch_against(old_root: str, quartets: int, steps: int) -> None:
    """This watcher against another checkout's, same model, same Monitor, A/B/B/A."""
    import importlib.util

    import steplens.producer as sl
    from steplens.producer import MemoryTransport
    from steplens.producer.instruments.watcher import Watcher

    src = os.path.join(old_root, "producer", "src", "steplens", "producer")
    path = os.path.join(src, "instruments", "watcher.py")
    if not os.path.exists(path):  # a checkout before the producer's sub-packages
        path = os.path.join(src, "watcher.py")
    spec = importlib.util.spec_from_file_location("steplens_old_watcher", path)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    model, opt, loop = _mlp_loop()
    m = sl.init(
        "bench-watch",
        transport=MemoryTransport(),
        hw_interval_s=0,
        sample_rate=0.01,
        spool_dir=tempfile.mkdtemp(),
    )

    def block(cls: Any, every: int) -> float:
        w = cls(_results_for(cls, m), model, opt, None, every=every, sample_size=4096)
        m._watching.watchers.append(w)
        m._update_plain_path()
        try:
            return loop(steps)
        finally:
            w.remove()
            m._watching.watchers.clear()
            m._update_plain_path()

    for cls in (old.Watcher, Watcher):
        block(cls, 1)  # warm-up
    hooks = {"old": [], "new": []}
    for _ in range(5):
        for name, cls in (("old", old.Watcher), ("new", Watcher)):
            hooks[name].append(_hook_cost(cls, m, model, opt))
    cost = {k: statistics.median(v) for k, v in hooks.items()}
    print(
        f"\nwatch hooks of one watched step (end of backward, before and after the optimizer "
        f"step), medians: old {cost['old']:.1f} us, new {cost['new']:.1f} us, "
        f"ratio {cost['new'] / cost['old']:.3f}"
    )
    print(
        f"\nwatch against {old_root}: MLP 256-512-512-10, {quartets} A/B/B/A quartets of "
        f"{steps} steps; ratio = step time with this watcher / with the old one"
    )
    for every in (10, 1):
        ratios, before, after = [], [], []
        for _ in range(quartets):
            a1, b1, b2, a2 = (block(c, every) for c in (old.Watcher, Watcher, Watcher, old.Watcher))
            before.append((a1 + a2) / 2)
            after.append((b1 + b2) / 2)
            ratios.append((b1 + b2) / (a1 + a2))
        q1, med, q3 = statistics.quantiles(ratios, n=4)
        print(
            f"   watch(every={every:<2})  old {statistics.median(before) * 1e3:7.3f} ms  "
            f"new {statistics.median(after) * 1e3:7.3f} ms  ratio median {med:.4f} "
            f"IQR {q1:.4f}-{q3:.4f}"
        )
    sl.shutdown()


def bench_import_and_memory() -> None:
    code_import = (
        "import time; t=time.perf_counter(); import steplens.producer; print(time.perf_counter()-t)"
    )
    code_rss = (
        "import os, tempfile, time\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "before = rss()\n"
        "import steplens.producer as sl\n"
        "sl.init('rss', hw_interval_s=1.0, spool_dir=tempfile.mkdtemp(),"
        " kafka_bootstrap='127.0.0.1:1')\n"
        "for i in range(2000): sl.log_step(i, loss=1.0, lr=1e-4)\n"
        "time.sleep(1.5)\n"
        "print(rss() - before)\n"
        "sl.shutdown(0)\n"
    )
    times = [
        float(subprocess.check_output([sys.executable, "-c", code_import]).decode())
        for _ in range(5)
    ]
    out = subprocess.check_output([sys.executable, "-c", code_rss], stderr=subprocess.DEVNULL)
    added = int(out.decode().split()[0])
    print("\n3) fresh processes")
    print(
        f"   import steplens.producer: median {statistics.median(times) * 1e3:.1f} ms "
        f"(wandb: 450 ms per ANCHORS)"
    )
    print(
        f"   resident memory added by import + init + 2,000 steps + sampler: "
        f"{added / 1e6:.1f} MB (wandb: 82 MB per ANCHORS)"
    )


def log_step_child(rounds: int, n: int, remedies: bool) -> None:
    """One checkout's ``log_step`` per-call p50/p99 (medians of ``rounds``), as JSON."""
    import json

    import steplens.producer as sl
    from steplens.producer import MemoryTransport

    extra = {"remedies": ["skip_samples"]} if remedies else {}
    sl.init("bench", transport=MemoryTransport(), hw_interval_s=0, spool_dir=tempfile.mkdtemp(),
            **extra)  # fmt: skip

    def call(i: int) -> None:
        sl.log_step(i, loss=1.0, lr=1e-4, grad_norm=0.5, tokens=4096, **SCALARS)

    got = [time_calls(lambda i, r=r: call(r * n + i), n) for r in range(rounds)]
    sl.shutdown()
    print(json.dumps([statistics.median(p for p, _ in got), statistics.median(q for _, q in got)]))


def bench_advice_against(old_root: str, quartets: int, rounds: int, n: int) -> None:
    """``log_step`` of this checkout (its default remedies, skip_samples) against
    ``old_root``'s default, in children alternated A/B/C/C/B/A; then an empty
    ``sl.advice()`` against a no-op call."""
    import json

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def child(root: str, remedies: bool) -> tuple[float, float]:
        path = os.pathsep.join(os.path.join(root, p, "src") for p in ("schema", "producer"))
        argv = [sys.executable, __file__, "--log-step-child", str(rounds), str(n)]
        out = subprocess.run(
            [*argv, *(["--remedies"] if remedies else [])],
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        p50, p99 = json.loads(out.strip().splitlines()[-1])
        return float(p50), float(p99)

    names = ("before (OLD_CHECKOUT)", "after, default", "after, skip_samples")
    runs = ((old_root, False), (here, False), (here, True))
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    for q in range(quartets):
        order = list(zip(names, runs, strict=True))
        for name, (root, rem) in order if q % 2 == 0 else order[::-1]:
            got[name].append(child(root, rem))
    med = {k: (statistics.median(p for p, _ in v), statistics.median(p for _, p in v)) for k, v in
           got.items()}  # fmt: skip
    print(f"\nlog_step with 10 values, medians of {quartets} child runs x {rounds} rounds (us)")
    base = med[names[0]]
    for name, (p50, p99) in med.items():
        print(f"   {name:<22} p50 {p50:7.3f}  p99 {p99:7.3f}   x{p50 / base[0]:.2f} p50, "
              f"x{p99 / base[1]:.2f} p99 vs before")  # fmt: skip

    import steplens.producer as sl
    from steplens.producer import MemoryTransport

    sl.init("bench", transport=MemoryTransport(), hw_interval_s=0, spool_dir=tempfile.mkdtemp(),
            remedies=["skip_samples"])  # fmt: skip

    def noop() -> tuple[()]:
        return ()

    calls = {"no-op call": noop, "sl.advice(), empty": sl.advice}
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            res[name].append(time_calls(lambda i, fn=fn: fn(), n))
    sl.shutdown()
    print(f"\nper call at a step boundary, medians of {rounds} rounds (us, perf_counter_ns in)")
    ref = statistics.median(p for p, _ in res["no-op call"])
    for name, v in res.items():
        p50, p99 = statistics.median(p for p, _ in v), statistics.median(q for _, q in v)
        print(f"   {name:<22} p50 {p50:7.3f}  p99 {p99:7.3f}   x{p50 / ref:.2f} p50 vs no-op")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", action="store_true", help="more rounds and steps")
    ap.add_argument("--calls", action="store_true", help="only the per-call table (1)")
    ap.add_argument("--watch-against", metavar="CHECKOUT", help="only watch(): this against that")
    ap.add_argument("--advice-against", metavar="CHECKOUT", help="only the advice channel's cost")
    ap.add_argument("--log-step-child", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--remedies", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.log_step_child:
        log_step_child(*args.log_step_child, remedies=args.remedies)
        return 0
    if args.advice_against:
        bench_advice_against(args.advice_against, 6 if args.long else 4, 5, 20_000)
        return 0
    if args.watch_against:
        bench_watch_against(args.watch_against, 60 if args.long else 24, 20 if args.long else 10)
        return 0
    rounds = 9 if args.long else 5
    bench_log_step(rounds, 200_000 if args.long else 20_000)
    if args.calls:
        return 0
    bench_training(60 if args.long else 16, 20 if args.long else 5)
    bench_import_and_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
