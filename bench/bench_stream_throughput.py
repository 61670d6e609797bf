"""Throughput and latency of the stream jobs.

1. Pure: step records/s through ``RunDetector`` (every signal on, ARIMA fits included, run
   inline and timed separately), against a decode-only baseline measured in the same run; then
   each signal group alone over the same decoded records (its share of the cost).
2. Worker: one `steplens worker` process against the real Kafka (``STEPLENS_KAFKA_BOOTSTRAP``,
   default 127.0.0.1:19092): records/s from a pre-filled raw topic, against a plain
   confluent-kafka consumer reading the same topic (the floor), and the time from a record's
   ``time_ns`` (set when it is produced, like ``log_step``) to its alert on the alerts topic,
   p50/p99, while the worker is loaded.

    python bench/bench_stream_throughput.py               # about a minute
    python bench/bench_stream_throughput.py --records 400000 --no-worker
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from steplens.producer.schema import Record, decode, encode, make_record
from steplens.stream_jobs import rules
from steplens.stream_jobs.config import DetectorConfig
from steplens.stream_jobs.core import Signal
from steplens.stream_jobs.detector import RunDetector
from steplens.stream_jobs.signals import arima, lr_schedule, ranks, spike, volatility


def step_records(n: int, runs: int, ranks: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    per = n // (runs * ranks)
    for i in range(per):
        for r in range(runs):
            for k in range(ranks):
                out.append(
                    encode(
                        make_record(
                            "step",
                            {
                                "loss": 3.0 - i * 1e-4 + rng.gauss(0, 0.02),
                                "grad_norm": 1.0 + rng.gauss(0, 0.05),
                                "lr": 3e-4,
                                "step_time_s": 0.1 + rng.gauss(0, 0.002),
                                "tokens_per_s": 1e5 + rng.gauss(0, 500),
                            },
                            run_id=f"bench-{r}",
                            rank=k,
                            step=i,
                            time_ns=time.time_ns(),
                        )
                    )
                )
    return out


def _group_runners(cfg: DetectorConfig) -> dict[str, Callable[[Record], Any]]:
    """One function per signal group, each scoring a step record with its own state."""
    spikes: dict[tuple[str, int, str], spike.SpikeState] = {}
    vols: dict[tuple[str, int], volatility.VolatilityState] = {}
    arimas: dict[tuple[str, int, str], arima.ArimaState] = {}
    lrs: dict[tuple[str, int], lr_schedule.LrState] = {}
    rank_states: dict[str, ranks.RanksState] = {}
    rule_states: dict[str, rules.RulesState] = {}

    def do_spike(rec: Record) -> None:
        for m, c in (("loss", cfg.spike), ("grad_norm", cfg.grad_spike)):
            key = (rec.run_id, rec.rank, m)
            st = spikes.get(key) or spikes.setdefault(key, spike.SpikeState())
            spike.update(st, c, m, rec.data[m], rec.step, rec.rank)

    def do_volatility(rec: Record) -> None:
        key = (rec.run_id, rec.rank)
        st = vols.get(key) or vols.setdefault(key, volatility.VolatilityState())
        volatility.update(st, cfg.volatility, "loss", rec.data["loss"], rec.step)

    def do_arima(rec: Record) -> None:  # updates only: fits are timed by the full run
        for m in ("loss", "grad_norm", "step_time_s", "tokens_per_s"):
            key = (rec.run_id, rec.rank, m)
            st = arimas.get(key) or arimas.setdefault(key, arima.ArimaState())
            arima.update(st, cfg.arima, m, rec.data[m], rec.step, rec.rank)
            if st.wants_fit:  # a fixed model, so every update runs the recursion
                p = arima.ArimaParams(ar=[0.3], ma=[-0.2], const=0.0, sigma=0.01)
                arima.apply_fit(st, cfg.arima, p if st.params is None else st.params)

    def do_lr(rec: Record) -> None:
        key = (rec.run_id, rec.rank)
        st = lrs.get(key) or lrs.setdefault(key, lr_schedule.LrState())
        lr_schedule.update(st, cfg.lr, rec.data["lr"], rec.step, rec.rank)

    def do_ranks(rec: Record) -> None:
        st = rank_states.get(rec.run_id) or rank_states.setdefault(rec.run_id, ranks.RanksState())
        ranks.step_time(st, cfg.ranks, rec.rank, rec.step, rec.data["step_time_s"])
        ranks.progress(st, rec.rank, rec.step, rec.time_ns)

    def do_rules(rec: Record) -> None:  # one quiet signal per metric, as most steps have
        st = rule_states.get(rec.run_id) or rule_states.setdefault(rec.run_id, rules.RulesState())
        sigs = [Signal("spike", m, rec.step, v, 0.1, rec.rank) for m, v in rec.data.items()]
        rules.evaluate(st, cfg.rules, rec.run_id, sigs)

    return {
        "spike (loss, grad_norm)": do_spike,
        "volatility (loss)": do_volatility,
        "ARIMA updates (4 series)": do_arima,
        "lr schedule": do_lr,
        "ranks (stragglers)": do_ranks,
        "rules (5 signals)": do_rules,
    }


def bench_groups(recs: list[Record], t_decode: float) -> None:
    """Each signal group alone over the decoded records, against the decode-only baseline."""
    print("  per signal group (alone; records/s, and its time as a share of the decode time)")
    for label, run in _group_runners(DetectorConfig()).items():
        t = time.perf_counter()
        for rec in recs:
            run(rec)
        took = time.perf_counter() - t
        rate = len(recs) / took if took > 0 else math.inf
        print(f"    {label:<26} {rate:>10,.0f} records/s ({took / t_decode:.2f}x the decode time)")


def bench_pure(n: int) -> None:
    wire = step_records(n, runs=4, ranks=8)
    t = time.perf_counter()
    recs = [decode(w) for w in wire]
    t_decode = time.perf_counter() - t
    fit_time = 0.0
    fits = 0
    dets: dict[str, RunDetector] = {}
    t = time.perf_counter()
    for rec in recs:
        det = dets.get(rec.run_id)
        if det is None:
            det = dets[rec.run_id] = RunDetector(rec.run_id, DetectorConfig(), fit_inline=False)
        det.process(rec)
        if det.fits_wanted:
            t_fit = time.perf_counter()
            for key, values in det.pending_fits():
                det.apply_fit(key, arima.fit(values, (1, 1, 1), "hannan_rissanen"))
                fits += 1
            fit_time += time.perf_counter() - t_fit
    total = time.perf_counter() - t
    arima_points = len(recs) * 4
    print(f"pure: {len(recs)} step records, every signal on")
    print(f"  decode only       {len(recs) / t_decode:>10,.0f} records/s (baseline)")
    print(
        f"  decode + detect   {len(recs) / (t_decode + total):>10,.0f} records/s "
        f"({(t_decode + total) / t_decode:.1f}x the decode time)"
    )
    print(
        f"  detect only       {len(recs) / total:>10,.0f} records/s; target 20,000 -> "
        f"{len(recs) / total / 20000:.2f}x"
    )
    print(
        f"  ARIMA fits        {fits} fits, {fit_time / arima_points * 1e6:.1f} us amortised "
        f"per point (target <= 50 us)"
    )
    bench_groups(recs, t_decode)


def bench_worker(n: int, seconds: float) -> None:
    from confluent_kafka import Consumer, Producer

    from steplens.producer.topics import Topics, ensure_topics

    boot = os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        raw=f"bench.{tag}.raw",
        signals=f"bench.{tag}.signals",
        alerts=f"bench.{tag}.alerts",
        dead_letters=f"bench.{tag}.dead",
    )
    ensure_topics(boot, topics)
    p = Producer(
        {"bootstrap.servers": boot, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000}
    )
    wire = step_records(n, runs=8, ranks=8, seed=1)
    for w in wire:
        rec = decode(w)
        p.produce(topics.raw, w, key=rec.key)
        p.poll(0)
    p.flush(60)
    # floor: a plain consumer reading the same records
    c = Consumer(
        {"bootstrap.servers": boot, "group.id": f"floor-{tag}", "auto.offset.reset": "earliest"}
    )
    c.subscribe([topics.raw])
    got = 0
    t = time.perf_counter()
    deadline = t + 60
    while got < len(wire) and time.perf_counter() < deadline:
        msgs = c.consume(1000, 0.5)
        got += sum(1 for m in msgs if not m.error())
    floor = got / (time.perf_counter() - t)
    c.close()
    env = {
        **os.environ,
        "STEPLENS_KAFKA_BOOTSTRAP": boot,
        "STEPLENS_TOPIC_RAW": topics.raw,
        "STEPLENS_TOPIC_SIGNALS": topics.signals,
        "STEPLENS_TOPIC_ALERTS": topics.alerts,
        "STEPLENS_TOPIC_DEADLETTER": topics.dead_letters,
    }
    state = tempfile.mkdtemp(prefix="bench-worker-")
    port = 19464 + random.randrange(500)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "steplens.stack.cli",
            "worker",
            "--app-id",
            f"bench-{tag}",
            "--state-dir",
            state,
            "--web-port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import urllib.request

        def consumed() -> float:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return 0.0
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("steplens_worker_records_total{")
            )

        deadline = time.monotonic() + 120
        while consumed() == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        t0, n0 = time.monotonic(), consumed()
        while consumed() < len(wire) and time.monotonic() < deadline:
            time.sleep(0.2)
        rate = (consumed() - n0) / (time.monotonic() - t0)
        print(f"worker: {len(wire)} step records, 8 runs x 8 ranks, every signal on")
        print(f"  plain consumer    {floor:>10,.0f} records/s (floor)")
        print(
            f"  steplens worker   {rate:>10,.0f} records/s = {rate / floor:.2f}x the floor; "
            f"target 20,000 -> {rate / 20000:.2f}x"
        )
        # latency under load: background steps at a fixed rate, spikes timed end to end
        ac = Consumer(
            {"bootstrap.servers": boot, "group.id": f"lat-{tag}", "auto.offset.reset": "latest"}
        )
        ac.subscribe([topics.alerts])
        ac.poll(2.0)
        lat: list[float] = []
        sent_at: dict[int, float] = {}
        rng = random.Random(2)
        step = 10_000
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            step += 1
            spike = step % 50 == 0
            for r in range(8):
                loss = 80.0 if spike and r == 0 else 2.0 + rng.gauss(0, 0.01)
                rec = make_record(
                    "step",
                    {"loss": loss, "grad_norm": 1.0, "step_time_s": 0.1},
                    run_id="bench-lat",
                    rank=r,
                    step=step,
                    time_ns=time.time_ns(),
                )
                p.produce(topics.raw, encode(rec), key=rec.key)
            if spike:
                sent_at[step] = time.time()
            p.poll(0)
            for m in ac.consume(100, 0.005):
                if m.error():
                    continue
                a = decode(m.value())
                if (
                    a.data.get("state") == "firing"
                    and a.data["rule"] == "spike:loss"
                    and a.step in sent_at
                ):
                    lat.append(time.time() - sent_at[a.step])
        ac.close()
        if lat:
            lat.sort()
            p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            print(
                f"  log_step -> alert  p50 {statistics.median(lat):.3f} s, p99 {p99:.3f} s "
                f"over {len(lat)} alerts (target p99 <= 2 s)"
            )
        else:
            print("  log_step -> alert: no alert timing collected")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=64_000)
    ap.add_argument("--latency-seconds", type=float, default=15.0)
    ap.add_argument("--no-worker", action="store_true")
    args = ap.parse_args()
    bench_pure(args.records)
    if not args.no_worker:
        bench_worker(args.records, args.latency_seconds)


if __name__ == "__main__":
    main()
