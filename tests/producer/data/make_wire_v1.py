"""Writes ``wire_v1.jsonl``: wire records of every kind as the producer of schema v1 wrote them.

Run once with the code that wrote v1 on the path (it was run against the commit before the
codec moved to msgspec); ``test_wire_v1_fixtures.py`` then holds every later codec to these
bytes. Each line: the wire bytes (as text), the decoded record in a type-strict form, and whether
encoding the decoded record gave the same bytes again.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from steplens.producer.delivery.transport import MemoryTransport
from steplens.producer.monitor import Monitor
from steplens.schema import Record, decode, encode, make_record

ENV = {"run_id": "fixture-run", "rank": 3, "local_rank": 1, "host": "node-07", "pid": 4242}


def canon(x: Any) -> Any:
    """JSON-able, type-strict form: floats tagged (NaN and infinities kept), ints plain."""
    if type(x) is float:
        return {"f": "nan" if math.isnan(x) else repr(x)}
    if isinstance(x, dict):
        return {"d": [[k, canon(v)] for k, v in x.items()]}
    if isinstance(x, list):
        return {"l": [canon(v) for v in x]}
    return x


def record_canon(rec: Record) -> dict[str, Any]:
    return {name: canon(getattr(rec, name)) for name in (
        "kind", "run_id", "rank", "local_rank", "host", "pid", "seq", "time_ns", "data", "step", "v"
    )}  # fmt: skip


def made() -> list[Record]:
    nf = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf}
    t = 1_764_000_000_123_456_789
    return [
        make_record("run_meta", {"world_size": 8, "hosts": ["n1", "nœud-2"], "model": {
            "name": "llama-ünï", "n_params": 7_000_000_000, "flops_per_token": 4.2e10,
            "bad": math.nan, "list": [1, "Infinity", {"deep": -math.inf}]},
            "lr_schedule": {"kind": "cosine", "peak_lr": 3e-4, "min_lr": 3e-5,
                            "warmup_steps": 2000, "total_steps": 100_000},
            "peak_flops": 989e12, "config": {"sample_rate": 0.01, "spool_dir": "/tmp/x"}},
            seq=0, time_ns=t, **ENV),
        make_record("step", {"loss": 2.5, "lr": 1e-7, "grad_norm": math.inf, "tokens": 524288,
                             "step_time_s": 0.412, "data_time_s": 1e-5, "tokens_per_s": 1.27e6,
                             "mfu": 0.41, "grad_norm_preclip": 1.31, "clipped": True,
                             "param_norm": 412.7, "update_ratio": 0.93,
                             "group_lrs": [2.9e-4, math.nan, 1e20],
                             "scalars": {"acc": 0.5, "x": -math.inf, "日本語": 1.0, "é🙂": 2,
                                         "big": 1.7976931348623157e308, "tiny": 5e-324,
                                         "e16": 1e16, "e22": 1.234e22},
                             "reason": "guard"}, seq=1, time_ns=t + 1, step=100, **ENV),
        make_record("step", {"loss": math.nan}, seq=2, time_ns=t + 2, step=0, **ENV),
        make_record("step", {"scalars": dict(nf), "tokens": (1 << 63) - 1},
                    seq=3, time_ns=-t, step=(1 << 63) - 1, **ENV),
        make_record("step_batch", {"records": [
            {"step": 10, "time_ns": t, "loss": 2.0, "lr": 3e-4, "scalars": {"a": 1.0}},
            {"step": 11, "time_ns": t + 5, "loss": math.nan, "reason": "guard"},
            {"step": 12, "time_ns": t + 9, "grad_norm": 1e300, "group_lrs": [1.0, -math.inf],
             "tokens": 7, "clipped": False, "scalars": {"ünï": 0.25}},
        ]}, seq=4, time_ns=t + 9, step=12, **ENV),
        make_record("step_window", {"step_first": 1, "step_last": 100, "count": 100,
                                    "duration_s": 41.2, "metrics": {
                                        "loss": {"count": 99, "mean": 2.3, "min": 2.1,
                                                 "max": 2.9, "last": math.nan, "nonfinite": 1},
                                        "ø": {"count": 0, "mean": math.nan, "min": math.nan,
                                              "max": math.nan, "last": math.inf,
                                              "nonfinite": 100}}},
                    seq=5, time_ns=t, step=100, **ENV),
        make_record("eval", {"split": "validación", "loss": 1.5, "perplexity": math.exp(1.5),
                             "accuracy": 0.7, "f1": math.nan, "bleu": 0.0, "rouge": 1,
                             "extra": {"em": 0.2, "ñ": math.inf}}, seq=6, time_ns=t, step=3,
                    **ENV),
        make_record("batch", {"n_samples": 2, "length_edges": [0, 8, 16], "length_counts": [1, 1],
                              "length_mean": 7.5, "length_max": 12, "max_len": 16,
                              "over_length": 0, "label_counts": {"0": 1, "чи": 1},
                              "sample_hashes": ["0123abcd", "ffee0011"]},
                    seq=7, time_ns=t, step=3, **ENV),
        make_record("hw", {"mem_available_bytes": 900_000_000_000, "mem_total_bytes": 2 << 40,
                           "cpu_percent": 37.5,
                           "disks": [{"device": "nvme0n1", "read_mb_s": 12.0, "write_mb_s": 3.1,
                                      "io_latency_ms": math.nan}],
                           "nets": [{"iface": "ib0", "rx_mb_s": 9000.0, "tx_mb_s": None}],
                           "gpus": [{"index": 0, "uuid": "GPU-1b2c", "name": "NVIDIA H200",
                                     "mem_used_bytes": 120_000_000_000, "util_gpu": 98.0,
                                     "power_w": math.inf, "throttle_reasons": 0, "ok": True}],
                           "gpu_status": "ok"}, seq=8, time_ns=t, **ENV),
        make_record("comm", {"op": "all_reduce", "peer": 4, "latency_ms": math.nan,
                             "bytes": 4096, "backend": "nccl"}, seq=9, time_ns=t, step=5, **ENV),
        make_record("health", {"dropped": {"queue_full": 3}, "sent": 100, "spooled": 0,
                               "spool_bytes": 0, "replayed": 0, "errors": {"bad_value": 1},
                               "queue_len": 0}, seq=10, time_ns=t, **ENV),
        make_record("signal", {"name": "spike", "metric": "loss", "value": math.inf,
                               "score": 0.99, "expected": 2.3, "lower": -math.inf, "upper": 2.9,
                               "detail": {"z": 12.5, "note": "NaN", "why": "résumé"}},
                    run_id="fixture-run", rank=-1, seq=11, time_ns=t, step=100),
        make_record("alert", {"rule": "loss_spike", "severity": "critical", "state": "firing",
                              "scope": "rank:3", "hint": "lower the lr ⚠", "summary": "loss x10",
                              "fingerprint": "abc123", "started_step": 99,
                              "evidence": {"values": [1.0, math.nan], "ranks": [3]}},
                    run_id="fixture-run", rank=-1, seq=12, time_ns=t, step=100),
        make_record("dead_letter", {"reason": "data.loss: expected a number", "source_topic":
                                    "steplens.raw", "partition": 2, "offset": 99,
                                    "consumer": "influx", "payload": '{"v":1,"kind":"step"}\n'},
                    run_id="unknown", rank=-1, seq=13, time_ns=t),
    ]  # fmt: skip


def from_monitor() -> list[bytes]:
    """What a Monitor really sends, in window mode and in full resolution."""
    raws: list[bytes] = []
    for config in (
        {"sample_rate": 0.1, "window_steps": 20},
        {"full_resolution": True, "batch_steps": 16},
    ):
        tx = MemoryTransport()
        with tempfile.TemporaryDirectory() as spool:
            m = Monitor(
                "fixture-monitor",
                transport=tx,
                hw_interval_s=0,
                spool_dir=spool,
                rank=1,
                local_rank=1,
                world_size=2,
                **config,
            )  # type: ignore[arg-type]
            for step in range(40):
                loss = math.nan if step == 25 else 2.0 - step * 0.01
                m.log_step(
                    step,
                    loss=loss,
                    lr=3e-4,
                    grad_norm=0.5,
                    tokens=4096,
                    step_time_s=0.25,
                    acc=0.5,
                    ü=float(step),
                )
            m.log_eval(40, split="val", loss=1.9, em=0.3)
            m.log_batch(40, [[1, 2, 3, 0]], attention_mask=[[1, 1, 1, 0]], labels=[1])
            m.shutdown()
        raws += [v for _, v in tx.messages]
    return raws


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("wire_v1.jsonl"))
    raws = [encode(r) for r in made()] + from_monitor()
    with out.open("w", encoding="utf-8") as f:
        for raw in raws:
            rec = decode(raw)
            assert isinstance(rec, Record), rec
            line = {
                "wire": raw.decode("utf-8"),
                "decoded": record_canon(rec),
                "reencodes_same": encode(rec) == raw,
            }
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"{len(raws)} records -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
