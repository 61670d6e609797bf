"""Wire encoding cost: json (stdlib) vs orjson vs msgpack on real steplens records.

Encodes and decodes the records the producer sends most (a step with scalars and watch() fields,
a step_window over 12 metrics, a host+GPU hw sample) with each library and prints microseconds
per record and the ratio to json, measured in the same run. Non-finite floats are replaced by
their wire strings first, as ``steplens.schema.encode`` does, so every library encodes
the same objects. The numbers back the wire choice at the top of ``schema.py``: JSON, with orjson
when it is installed (same bytes on the wire, the cost paid in the producer's worker thread).

A second table is the consumer's side: ``schema.decode`` (parse + validate), which every stream
job and sink runs once per Kafka message, per record kind, as a ratio to the bare parse
(``orjson.loads``, or ``json.loads`` without orjson) timed in the same rounds. Then a
``step_batch`` of 100 typical steps: decode (and decode + ``unbatch``) per entry, against
decoding one typical ``step`` record, and the wire bytes per step of each.

Last, the bytes per step a Monitor puts on the wire for the same logged steps (typical values
with noise) in the default window mode and in full resolution, before Kafka's lz4 compression
and, when the lz4 package is installed, with each record compressed alone.

    python bench/bench_encoding.py          # a few seconds
    python bench/bench_encoding.py --long   # more rounds
    python bench/bench_encoding.py --decode # only the decode tables
    python bench/bench_encoding.py --wire   # only the bytes per step
    python bench/bench_encoding.py --guard  # records sent with lasting level shifts, jitter
    python bench/bench_encoding.py --decode --against /path/to/old/checkout
        # also time that checkout's ``schema.decode`` in the same rounds (a side-by-side ratio)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from steplens.producer.delivery.transport import MemoryTransport
from steplens.producer.monitor import Monitor
from steplens.schema import (
    DecodeError,
    Record,
    decode,
    encode,
    make_record,
    unbatch,
    wire_value,
)

STEP_KINDS = ("step", "step_window", "step_batch")


def sample_records() -> dict[str, dict[str, Any]]:
    env = {"run_id": "bench-run", "rank": 3, "local_rank": 3, "host": "node-07", "pid": 4242}
    step = make_record(
        "step",
        {
            "loss": 2.3142,
            "lr": 2.9e-4,
            "grad_norm": 0.87,
            "tokens": 524288,
            "step_time_s": 0.412,
            "tokens_per_s": 1.27e6,
            "mfu": 0.41,
            "grad_norm_preclip": 1.31,
            "clipped": True,
            "param_norm": 412.7,
            "update_ratio": 0.93,
            "group_lrs": [2.9e-4, 2.9e-4],
            "scalars": {f"s{i}": 0.1 * i for i in range(6)},
            "reason": "sample",
        },
        seq=1000,
        time_ns=1_764_000_000_000_000_000,
        step=1000,
        **env,
    )
    stats = {"count": 100, "mean": 2.3, "min": 2.1, "max": 2.9, "last": 2.2, "nonfinite": 0}
    window = make_record(
        "step_window",
        {
            "step_first": 901,
            "step_last": 1000,
            "count": 100,
            "duration_s": 41.2,
            "metrics": {f"m{i}": dict(stats) for i in range(12)},
        },
        seq=1001,
        time_ns=1_764_000_000_000_000_000,
        step=1000,
        **env,
    )
    gpu = {
        "index": 0,
        "uuid": "GPU-1b2c3d4e",
        "name": "NVIDIA H200",
        "mem_used_bytes": 120_000_000_000,
        "mem_total_bytes": 150_000_000_000,
        "util_gpu": 98.0,
        "util_mem": 61.0,
        "power_w": 650.2,
        "temp_c": 67.0,
        "sm_clock_mhz": 1980.0,
        "throttle_reasons": 0,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "xid_count": 0,
    }
    hw = make_record(
        "hw",
        {
            "mem_available_bytes": 900_000_000_000,
            "mem_total_bytes": 2_000_000_000_000,
            "cpu_percent": 37.5,
            "disks": [{"device": "nvme0n1", "read_mb_s": 12.0, "write_mb_s": 3.1}],
            "nets": [{"iface": "ib0", "rx_mb_s": 9000.0, "tx_mb_s": 8800.0}],
            "gpus": [{**gpu, "index": i} for i in range(8)],
            "gpu_status": "ok",
        },
        seq=1002,
        time_ns=1_764_000_000_000_000_000,
        **env,
    )
    return {"step": step.to_dict(), "step_window": window.to_dict(), "hw": hw.to_dict()}


def typical_step() -> dict[str, Any]:
    """A plain log_step record: core metrics, the producer's timing fields, 5 scalars."""
    return make_record(
        "step",
        {
            "loss": 2.3142,
            "lr": 2.9e-4,
            "grad_norm": 0.87,
            "tokens": 524288,
            "step_time_s": 0.412,
            "data_time_s": 0.013,
            "tokens_per_s": 1.27e6,
            "scalars": {f"aux_{i}": 0.1 * i + 0.01 for i in range(5)},
            "reason": "sample",
        },
        run_id="bench-run",
        rank=3,
        local_rank=3,
        host="node-07",
        pid=4242,
        seq=1000,
        time_ns=1_764_000_000_000_000_000,
        step=1000,
    ).to_dict()


def step_batch_of(step: dict[str, Any], n: int) -> dict[str, Any]:
    """``n`` consecutive copies of a step record's payload in one step_batch record."""
    payload = {k: v for k, v in step["data"].items() if k != "reason"}
    entries = [
        {"step": step["step"] + i, "time_ns": step["time_ns"] + i * 400_000_000, **payload}
        for i in range(n)
    ]
    last = entries[-1]
    return {
        **step,
        "kind": "step_batch",
        "step": last["step"],
        "time_ns": last["time_ns"],
        "data": {"records": entries},
    }


def decode_steps(raw: bytes) -> list[Record]:
    """What a consumer of step records does with every message: decode, then unbatch."""
    rec = decode(raw)
    return unbatch(rec) if isinstance(rec, Record) else []


def bench_batch_decode(
    step: dict[str, Any],
    n_entries: int,
    n: int,
    rounds: int,
    other: Callable[[bytes], Any] | None = None,
) -> None:
    """Decode cost per step_batch entry against one step record, in interleaved rounds."""
    raw_step = encode(step)
    raw_batch = encode(step_batch_of(step, n_entries))
    out = decode(raw_batch)
    assert not isinstance(out, DecodeError), out
    assert len(unbatch(out)) == n_entries
    reps = max(1, n // n_entries)
    one: list[float] = []
    dec: list[float] = []
    both: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):
        one.append(per_record_us(partial(decode, raw_step), n))
        dec.append(per_record_us(partial(decode, raw_batch), reps) / n_entries)
        both.append(per_record_us(partial(decode_steps, raw_batch), reps) / n_entries)
        if other is not None:
            theirs.append(per_record_us(partial(other, raw_batch), reps) / n_entries)
    s, d, b = (statistics.median(x) for x in (one, dec, both))
    print(f"\nstep_batch of {n_entries} typical steps, per step (median of {rounds} rounds)")
    print(f"{'':<26} {'bytes':>6} {'us':>8} vs step")
    print(f"{'step record':<26} {len(raw_step):>6} {s:>8.2f} 1.00x")
    per_entry = len(raw_batch) / n_entries
    print(f"{'step_batch entry, decode':<26} {per_entry:>6.0f} {d:>8.2f} {d / s:.2f}x")
    print(f"{'  + unbatch':<26} {'':>6} {b:>8.2f} {b / s:.2f}x")
    if other is not None:
        o = statistics.median(theirs)
        print(f"{'other checkout, decode':<26} {'':>6} {o:>8.2f} this/other {d / o:.2f}x")


def wire_bytes_per_step(n_steps: int, **config: Any) -> tuple[int, float, float | None]:
    """Step records sent for ``n_steps`` logged steps: count, bytes per step, lz4 bytes per step."""
    rng = random.Random(0)
    tx = MemoryTransport()
    with tempfile.TemporaryDirectory() as spool:
        m = Monitor("bench-wire", transport=tx, hw_interval_s=0, spool_dir=spool, **config)
        for step in range(n_steps):
            m.log_step(
                step,
                loss=2.5 - step * 1e-5 + rng.gauss(0, 0.02),
                lr=3e-4,
                grad_norm=abs(rng.gauss(0.9, 0.1)),
                tokens=524288,
                step_time_s=abs(rng.gauss(0.41, 0.01)),
                **{f"aux_{i}": rng.random() for i in range(5)},
            )
        m.shutdown()
    raws = [v for _, v in tx.messages if getattr(decode(v), "kind", None) in STEP_KINDS]
    total = sum(len(v) for v in raws)
    try:
        import lz4.frame

        packed: float | None = sum(len(lz4.frame.compress(v)) for v in raws) / n_steps
    except ImportError:
        packed = None
    return len(raws), total / n_steps, packed


def bench_wire(n_steps: int) -> None:
    modes = {
        "window (default)": {},
        "full resolution": {"full_resolution": True},
    }
    print(f"\nwire bytes per logged step, {n_steps} steps (step, step_window, step_batch records)")
    print(f"{'mode':<18} {'records':>8} {'bytes/step':>11} {'lz4/step':>9} vs window")
    base = None
    for name, config in modes.items():
        count, per_step, packed = wire_bytes_per_step(n_steps, **config)
        base = base or per_step
        lz4_col = f"{packed:>9.1f}" if packed is not None else f"{'-':>9}"
        print(f"{name:<18} {count:>8} {per_step:>11.1f} {lz4_col} {per_step / base:.1f}x")


def guard_records(n_steps: int, scenario: str, **config: Any) -> tuple[int, int, int]:
    """(step + step_window records, guard-flagged steps, step_batch records) for ``n_steps``:
    ``shift``: an lr step decay at 30 %, a doubled batch at 50 %, steps twice as slow from
    60 %; ``jitter``: 1 ms steps, one in ten preempted for 0.5-5 ms."""
    rng = random.Random(1)
    tx = MemoryTransport()
    with tempfile.TemporaryDirectory() as spool:
        m = Monitor("bench-guard", transport=tx, hw_interval_s=0, spool_dir=spool,
                    queue_max=1 << 20, **config)  # fmt: skip
        for s in range(n_steps):
            if scenario == "shift":
                m.log_step(
                    s,
                    loss=2.5 - s * 1e-5 + rng.gauss(0, 0.01),
                    lr=1e-3 if s < n_steps * 0.3 else 1e-4,
                    grad_norm=abs(rng.gauss(1, 0.05)),
                    tokens=4096 if s < n_steps * 0.5 else 8192,
                    step_time_s=(0.1 if s < n_steps * 0.6 else 0.2) * (1 + rng.gauss(0, 0.01)),
                )
            else:
                late = rng.uniform(0.0005, 0.005) if rng.random() < 0.1 else rng.gauss(0, 3e-5)
                m.log_step(s, loss=2.5 + rng.gauss(0, 0.01), step_time_s=0.001 + late)
        m.shutdown(30)
    recs = tx.records()
    steps = [r for r in recs if r.kind == "step"]
    guarded = sum(1 for r in steps if r.data.get("reason") == "guard")
    windows = sum(1 for r in recs if r.kind == "step_window")
    return len(steps) + windows, guarded, sum(1 for r in recs if r.kind == "step_batch")


def bench_guard() -> None:
    print("records the guard causes (window mode: 100 windows + 100 samples per 10,000 steps)")
    for scenario in ("shift", "jitter"):
        total, guarded, _ = guard_records(10_000, scenario)
        print(f"  {scenario:<6} 10,000 steps: {total} step+window records, {guarded} guard-flagged")
    _, _, batches = guard_records(30_000, "shift", full_resolution=True)
    print(f"  shift  30,000 steps, full resolution: {batches} step_batch records (300 when none)")


def codecs() -> dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]]:
    out: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
        "json": (
            lambda o: json.dumps(o, separators=(",", ":"), allow_nan=False).encode(),
            json.loads,
        )
    }
    try:
        import orjson

        out["orjson"] = (orjson.dumps, orjson.loads)
    except ImportError:
        print("orjson not installed: skipped")
    try:
        import msgpack

        out["msgpack"] = (msgpack.packb, msgpack.unpackb)
    except ImportError:
        print("msgpack not installed: skipped")
    return out


def per_record_us(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1e3


def load_other_decode(checkout: str) -> Callable[[bytes], Any]:
    """``decode`` of another checkout's ``steplens.schema``, loaded beside this one.

    Its package is imported under the same name with this one's modules set aside, then this
    one's are put back; the other's functions keep the modules they were defined in."""
    import importlib.util

    ours = {n: m for n, m in sys.modules.items() if n.split(".")[:2] == ["steplens", "schema"]}
    for name in ours:
        del sys.modules[name]
    where = f"{checkout}/schema/src/steplens/schema"
    spec = importlib.util.spec_from_file_location(
        "steplens.schema", f"{where}/__init__.py", submodule_search_locations=[where]
    )
    assert spec is not None and spec.loader is not None, where
    module = importlib.util.module_from_spec(spec)
    sys.modules["steplens.schema"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        for name in [n for n in sys.modules if n.split(".")[:2] == ["steplens", "schema"]]:
            del sys.modules[name]
        sys.modules.update(ours)
    return module.decode  # type: ignore[no-any-return]


def bench_decode(
    records: dict[str, dict[str, Any]],
    n: int,
    rounds: int,
    other: Callable[[bytes], Any] | None = None,
) -> None:
    """schema.decode per record kind against the bare parse (and ``other``, another checkout's
    decode), in interleaved rounds."""
    try:
        import orjson

        loads: Callable[[bytes], Any] = orjson.loads
        parser = "orjson"
    except ImportError:
        loads, parser = json.loads, "json"
    print(f"decode per record, median of {rounds} interleaved rounds of {n} (us)")
    head = f"{'record':<15} {'bytes':>6} {parser + '.loads':>12} {'decode':>8} ratio"
    print(head + ("   other   this/other" if other else ""))
    for kind, rec in records.items():
        raw = encode(rec)
        out = decode(raw)
        assert not isinstance(out, DecodeError), out
        parse: list[float] = []
        full: list[float] = []
        theirs: list[float] = []
        for _ in range(rounds):
            parse.append(per_record_us(partial(loads, raw), n))
            full.append(per_record_us(partial(decode, raw), n))
            if other is not None:
                theirs.append(per_record_us(partial(other, raw), n))
        p, d = statistics.median(parse), statistics.median(full)
        line = f"{kind:<15} {len(raw):>6} {p:>12.2f} {d:>8.2f} {d / p:.2f}x"
        if other is not None:
            o = statistics.median(theirs)
            line += f" {o:>7.2f} {d / o:>8.2f}x"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", action="store_true", help="more rounds")
    ap.add_argument("--decode", action="store_true", help="only the decode tables")
    ap.add_argument("--wire", action="store_true", help="only the bytes per step")
    ap.add_argument("--guard", action="store_true", help="only the guard's records")
    ap.add_argument("--against", metavar="CHECKOUT", help="also time this checkout's decode")
    args = ap.parse_args()
    if args.wire:
        bench_wire(10_000)
        return 0
    if args.guard:
        bench_guard()
        return 0
    n, rounds = (20_000, 9) if args.long else (2_000, 7)
    records = sample_records()
    # a non-finite window statistic: the free-form metrics are walked to restore it
    window_inf = {**records["step_window"]}
    metrics = {k: dict(v) for k, v in window_inf["data"]["metrics"].items()}
    metrics["m0"]["max"] = math.inf
    window_inf["data"] = {**window_inf["data"], "metrics": metrics}
    decoded = {"step (typical)": typical_step(), **records, "step_window inf": window_inf}
    other = load_other_decode(args.against) if args.against else None
    if args.decode:
        bench_decode(decoded, n, rounds, other)
        bench_batch_decode(decoded["step (typical)"], 100, n, rounds, other)
        return 0
    table = codecs()
    print(f"encode + decode per record, median of {rounds} interleaved rounds of {n} (us)")
    print(
        f"{'record':<12} {'codec':<8} {'bytes':>6} {'encode':>8} {'decode':>8} {'both':>8} vs json"
    )
    for kind, rec in records.items():
        wire = wire_value(rec)
        raws = {name: dumps(wire) for name, (dumps, _) in table.items()}
        for name, (_, loads) in table.items():
            assert loads(raws[name]) == json.loads(raws["json"]), name  # same content
        enc: dict[str, list[float]] = {name: [] for name in table}
        dec: dict[str, list[float]] = {name: [] for name in table}
        full: list[float] = []
        for _ in range(rounds):  # every codec in every round: the machine's noise hits all
            for name, (dumps, loads) in table.items():
                enc[name].append(per_record_us(lambda f=dumps, o=wire: f(o), n))
                dec[name].append(per_record_us(lambda f=loads, b=raws[name]: f(b), n))
            # the full path of steplens: non-finite mapping, encoding, validating decode
            full.append(per_record_us(lambda r=rec: decode(encode(r)), n))
        base = statistics.median(enc["json"]) + statistics.median(dec["json"])
        for name in table:
            e, d = statistics.median(enc[name]), statistics.median(dec[name])
            print(
                f"{kind:<12} {name:<8} {len(raws[name]):>6} {e:>8.2f} {d:>8.2f} {e + d:>8.2f} "
                f"{(e + d) / base:.2f}x"
            )
        print(f"{kind:<12} {'schema':<8} {'':>6} {'':>8} {'':>8} {statistics.median(full):>8.2f}")
    print()
    bench_decode(decoded, n, rounds)
    bench_batch_decode(decoded["step (typical)"], 100, n, rounds)
    bench_wire(10_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
