"""What the live view draws from a run's records: MLflow metric points and parameters (pure;
no MLflow here).

Metric points, ``(key, value, timestamp ms, step)``, finite values only:

- training, from rank 0's ``step`` records and ``step_batch`` entries (the other ranks' are
  the same run's steps): ``train/<field>`` for the loss, lr, gradient norms, step and data
  time, tokens/s, MFU, parameter norm, update ratio, and ``train/<name>`` for its scalars. A
  ``step_batch`` gives at most ``MAX_BATCH_ENTRIES`` of its entries, evenly spaced, the last
  included; the windows' maxima still show a spike between them;
- windows, from rank 0's ``step_window``: ``window/<metric>`` (the mean) at its last step,
  and ``window/<metric>_max`` for the loss, the gradient norm and the step time;
- evaluations: ``<split>/<metric>``;
- hardware, from ``hw`` records: per GPU ``hw/<host>/gpu<index>/util``, ``.../mem_used_gb``,
  ``.../temp_c``, ``.../power_w``; per host ``hw/<host>/mem_used_gb`` and ``.../cpu_percent``
  (a record without a step is drawn at ``step``, the run's last step seen);
- data quality: ``data/batch_over_length_share`` from rank 0's ``batch`` records, and
  ``data/<metric>`` from the stream jobs' ``data`` signals (over-length share, duplicate and
  repeat rates, supervised share: all ranks together);
- incidents: ``alert/<rule>``, the severity (1 info, 2 warning, 3 critical; 0 resolved).

Parameters, from rank 0's ``run_meta``: ``world_size``, ``peak_flops``, ``baseline_run``,
``remedies``, ``hosts``, ``check.<name>`` (its state) and one level of ``model.``,
``optimizer.``, ``lr_schedule.``, ``config.`` and ``lineage.``; at most ``MAX_PARAMS``, values
cut to ``MAX_PARAM_LEN`` characters.

Keys are made valid for MLflow (letters, digits, ``_ - . / : space``; at most 250 characters).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from steplens.schema import Record

Point = tuple[str, float, int, int]  # key, value, timestamp (ms), step
Found = tuple[str, Any, int, int]  # a point whose value is not checked yet (``_finite``)

SEVERITY_LEVEL: Final = {"info": 1.0, "warning": 2.0, "critical": 3.0}
STEP_FIELDS: Final = (
    "loss",
    "lr",
    "grad_norm",
    "grad_norm_preclip",
    "step_time_s",
    "data_time_s",
    "tokens_per_s",
    "mfu",
    "param_norm",
    "update_ratio",
)
WINDOW_MAX: Final = ("loss", "grad_norm", "step_time_s")
EVAL_FIELDS: Final = ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")
GPU_FIELDS: Final = (("util_gpu", "util"), ("temp_c", "temp_c"), ("power_w", "power_w"))
DATA_SIGNAL: Final = "data"  # the stream jobs' data-quality signals
MAX_BATCH_ENTRIES: Final = 256
MAX_PARAMS: Final = 100
MAX_PARAM_LEN: Final = 500
MAX_KEY_LEN: Final = 250
GB: Final = 1e9
_INVALID = re.compile(r"[^\w.\- :/]")


def key(name: str) -> str:
    """``name`` as a valid MLflow metric or parameter key."""
    cleaned = _INVALID.sub("_", name).replace("..", "_.")
    return cleaned[:MAX_KEY_LEN] or "_"


def points(rec: Record, step: int = 0) -> list[Point]:
    """The metric points of ``rec``; ``step`` for a record without one."""
    at = rec.step if rec.step is not None else step
    ts = rec.time_ns // 1_000_000
    d = rec.data
    kind = rec.kind
    if kind == "eval":
        split = str(d.get("split", "val"))
        values = {k: d.get(k) for k in EVAL_FIELDS} | dict(d.get("extra") or {})
        return _finite([(key(f"{split}/{k}"), v, ts, at) for k, v in values.items()])
    if kind == "alert":
        level = 0.0 if d["state"] == "resolved" else SEVERITY_LEVEL.get(d["severity"], 1.0)
        return [(key(f"alert/{d['rule']}"), level, ts, at)]
    if kind == "hw":
        return _finite(_hardware(d, rec.host, ts, at))
    if kind == "signal" and d.get("name") == DATA_SIGNAL:
        return _finite([(key(f"data/{d.get('metric')}"), d.get("value"), ts, at)])
    if rec.rank != 0:
        return []
    if kind == "step":
        return _finite(_step(d, ts, at))
    if kind == "step_batch":
        entries = d.get("records") or []
        steps: list[Found] = []
        for entry in _spread(entries, MAX_BATCH_ENTRIES):
            steps += _step(entry, int(entry["time_ns"]) // 1_000_000, int(entry["step"]))
        return _finite(steps)
    if kind == "step_window":
        last = int(d.get("step_last", at))
        out: list[Found] = []
        for name, agg in (d.get("metrics") or {}).items():
            if isinstance(agg, dict):
                out.append((key(f"window/{name}"), agg.get("mean"), ts, last))
                if name in WINDOW_MAX:
                    out.append((key(f"window/{name}_max"), agg.get("max"), ts, last))
        return _finite(out)
    if kind == "batch":
        n, over = d.get("n_samples"), d.get("over_length")
        if isinstance(n, int) and n > 0 and isinstance(over, int):
            return [("data/batch_over_length_share", over / n, ts, at)]
    return []


def _step(d: dict[str, Any], ts: int, at: int) -> list[Found]:
    out = [(f"train/{f}", d.get(f), ts, at) for f in STEP_FIELDS]
    out += [(key(f"train/{k}"), v, ts, at) for k, v in (d.get("scalars") or {}).items()]
    return out


def _hardware(d: dict[str, Any], host: str, ts: int, at: int) -> list[Found]:
    where = f"hw/{host}"
    out: list[Found] = []
    total, free = d.get("mem_total_bytes"), d.get("mem_available_bytes")
    if isinstance(total, int) and isinstance(free, int):
        out.append((key(f"{where}/mem_used_gb"), (total - free) / GB, ts, at))
    out.append((key(f"{where}/cpu_percent"), d.get("cpu_percent"), ts, at))
    for gpu in d.get("gpus") or []:
        gpu_at = f"{where}/gpu{gpu.get('index', '?')}"
        for field, name in GPU_FIELDS:
            out.append((key(f"{gpu_at}/{name}"), gpu.get(field), ts, at))
        used = gpu.get("mem_used_bytes")
        if isinstance(used, (int, float)) and not isinstance(used, bool):
            out.append((key(f"{gpu_at}/mem_used_gb"), used / GB, ts, at))
    return out


def _spread(items: list[Any], most: int) -> list[Any]:
    """At most ``most`` of ``items``, evenly spaced, the last always among them."""
    if len(items) <= most:
        return items
    stride = len(items) / most
    return [items[len(items) - 1 - int(i * stride)] for i in reversed(range(most))]


def _finite(found: list[Found]) -> list[Point]:
    return [
        (k, float(v), ts, step)
        for k, v, ts, step in found
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]


def params(rec: Record) -> dict[str, str]:
    """The MLflow parameters of rank 0's ``run_meta`` record (none of another's)."""
    if rec.kind != "run_meta" or rec.rank != 0:
        return {}
    d = rec.data
    found: dict[str, Any] = {
        "world_size": d.get("world_size"),
        "peak_flops": d.get("peak_flops"),
        "baseline_run": d.get("baseline_run"),
    }
    if d.get("remedies") is not None:
        found["remedies"] = ", ".join(d["remedies"]) or "none"
    hosts = d.get("hosts") or []
    if hosts:
        found["hosts"] = f"{len(hosts)}: {', '.join(hosts)}"
    for group in ("model", "optimizer", "lr_schedule", "config", "lineage"):
        for k, v in (d.get(group) or {}).items():
            found[f"{group}.{k}"] = v
    for check in d.get("checks") or []:
        found[f"check.{check.get('check')}"] = check.get("state")
    out: dict[str, str] = {}
    for k, v in found.items():
        if v is None:
            continue
        if len(out) == MAX_PARAMS:
            break
        text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        out[key(k)] = text[:MAX_PARAM_LEN]
    return out
