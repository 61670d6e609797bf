"""Records to InfluxDB points (pure; see docs/architecture.md, "InfluxDB layout").

Escaping is influxdb-client's (``Point``). Line protocol cannot carry a backslash or a control
character (newline, tab, ...) in a tag value, tag key or field key unchanged, so records with
such names are rejected with the reason (they stay in S3, and go to the dead-letter topic).
String field values may hold anything: quotes and backslashes are escaped, newlines are kept.
Non-finite numbers, which line protocol cannot hold, are stored as a string field
``<name>_nonfinite`` ("NaN", "Infinity", "-Infinity").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from influxdb_client import Point

from steplens import schema
from steplens.schema import Record
from steplens.schema.store_layout import CHECK, DEVICE_LISTS, HOST, LAYER, MEASUREMENT, RANK, RUN
from steplens.sinks.point_builder import (
    MAX_STRING_FIELD,
    PointBuilder,
    UnwritableRecord,
    check_name,
)

__all__ = [
    "MAX_STRING_FIELD",
    "PointBuilder",
    "UnwritableRecord",
    "check_name",
    "record_builders",
    "record_lines",
    "record_points",
]

STEP_FLOATS: Final = (
    "loss",
    "lr",
    "grad_norm",
    "step_time_s",
    "data_time_s",
    "tokens_per_s",
    "mfu",
    "grad_norm_preclip",
    "param_norm",
    "update_ratio",
)
EVAL_FLOATS: Final = ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")
SIGNAL_FLOATS: Final = ("value", "score", "expected", "lower", "upper")
HEALTH_INTS: Final = ("sent", "spooled", "spool_bytes", "replayed", "queue_len", "rss_bytes")
WINDOW_INTS: Final = ("count", "nonfinite")
WINDOW_FLOATS: Final = ("mean", "std", "min", "max", "last")

LENGTH_BIN: Final = "len_lt_"  # batch: samples shorter than the bin's upper edge (and not shorter
# than the previous edge), one integer field per bin: len_lt_1, len_lt_2, len_lt_4, ...


def _by_name(
    b: PointBuilder, values: Mapping[str, Any], reserved: Iterable[str], prefix: str
) -> None:
    """Free-form metrics by name; a name taken by a fixed field gets ``prefix``."""
    taken = set(reserved)
    for name, value in values.items():
        b.num(prefix + name if name in taken else name, value)


def _step(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = (
        PointBuilder(MEASUREMENT["step"], rec)
        .tag(RUN, rec.run_id)
        .tag(RANK, rec.rank)
        .tag(HOST, rec.host)
    )
    b.integer("step", rec.step)
    for name in STEP_FLOATS:
        b.num(name, d.get(name))
    b.integer("tokens", d.get("tokens")).flag("clipped", d.get("clipped")).text(
        "reason", d.get("reason")
    )
    for i, lr in enumerate(d.get("group_lrs") or []):
        b.num(f"lr_group{i}", lr)
    fixed = {*STEP_FLOATS, "step", "tokens", "clipped", "reason", "seq"}
    _by_name(b, d.get("scalars") or {}, fixed, "scalar_")
    return [b, *_layers(rec)]


def _layers(rec: Record) -> list[PointBuilder]:
    """One ``layer`` point per layer of a step's per-layer norms; layer names are limited
    like metric names (``name_tag``)."""
    d = rec.data
    grads = d.get("layer_grad_norms") or {}
    params = d.get("layer_param_norms") or {}
    points = []
    for layer in dict.fromkeys([*grads, *params]):
        b = PointBuilder(LAYER, rec, name_tag="layer").tag(RUN, rec.run_id)
        b.tag(RANK, rec.rank).tag("layer", layer).integer("step", rec.step)
        b.num("grad_norm", grads.get(layer)).num("param_norm", params.get(layer))
        points.append(b)
    return points


def _step_batch(rec: Record) -> list[PointBuilder]:
    """Exactly the points of the step records the batch stands for."""
    return [p for step in schema.unbatch(rec) for p in _step(step)]


def _step_window(rec: Record) -> list[PointBuilder]:
    d = rec.data
    points: list[PointBuilder] = []
    for metric, stats in d["metrics"].items():
        if not isinstance(stats, dict):
            raise UnwritableRecord(f"step_window metric {metric[:80]!r} is not an object")
        b = (
            PointBuilder(MEASUREMENT["step_window"], rec, name_tag="metric")
            .tag(RUN, rec.run_id)
            .tag(RANK, rec.rank)
        )
        b.tag(HOST, rec.host).tag("metric", metric)
        b.integer("step_first", d["step_first"]).integer("step_last", d["step_last"])
        b.num("duration_s", d.get("duration_s"))
        for name in WINDOW_INTS:
            value = stats.get(name)
            b.integer(
                name, int(value) if isinstance(value, float) and value.is_integer() else value
            )
        for name in WINDOW_FLOATS:
            b.num(name, stats.get(name))
        points.append(b)
    return points


def _eval(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["eval"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.tag("split", d["split"]).integer("step", rec.step)
    for name in EVAL_FLOATS:
        b.num(name, d.get(name))
    _by_name(b, d.get("extra") or {}, {*EVAL_FLOATS, "step", "seq"}, "extra_")
    return [b]


def _batch(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["batch"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.integer("step", rec.step).integer("n_samples", d["n_samples"]).num(
        "length_mean", d.get("length_mean")
    )
    b.integer("length_max", d.get("length_max")).integer("max_len", d.get("max_len"))
    b.integer("over_length", d.get("over_length")).integer("epoch", d.get("epoch"))
    if d.get("over_length") is not None and d["n_samples"] > 0:
        b.num("over_length_share", d["over_length"] / d["n_samples"])
    b.num("supervised_share", d.get("supervised_share"))
    edges, counts = d.get("length_edges") or [], d.get("length_counts") or []
    if len(edges) == len(counts) + 1:
        for upper, count in zip(edges[1:], counts, strict=True):
            b.integer(f"{LENGTH_BIN}{upper}", count)
    for name in ("sample_hashes", "sample_ids"):
        if d.get(name):
            b.text(name, json_list(d[name]))
    for label, count in (d.get("label_counts") or {}).items():
        b.integer(f"label_{label}", count)
    return [b]


def json_list(values: list[Any], limit: int = MAX_STRING_FIELD) -> str:
    """A JSON list of the first ``values`` that fit in ``limit`` characters (whole items, so
    the text stays valid JSON)."""
    out: list[Any] = []
    size = 2
    for v in values:
        size += len(json.dumps(v)) + 2
        if size > limit:
            break
        out.append(v)
    return json.dumps(out)


def _stacks(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["stacks"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.tag(HOST, rec.host).integer("step", rec.step).num("stalled_s", d["stalled_s"])
    b.integer("last_step", d.get("last_step")).integer("n_threads", len(d["threads"]))
    text = "\n".join(
        f"--- thread {t.get('name')} ({t.get('id')})\n{t.get('stack', '')}" for t in d["threads"]
    )
    return [b.text("text", text)]


def _flat_points(
    rec: Record, measurement: str, tag: str, key: str, items: list[dict[str, Any]]
) -> list[PointBuilder]:
    points: list[PointBuilder] = []
    for i, item in enumerate(items):
        b = PointBuilder(measurement, rec).tag(RUN, rec.run_id).tag(HOST, rec.host)
        b.tag(tag, item.get(key, i))
        for name, value in item.items():
            if name != key:
                b.any(name, value)
        points.append(b)
    return points


def _hw(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["hw"], rec).tag(RUN, rec.run_id).tag(HOST, rec.host)
    b.integer("mem_available_bytes", d.get("mem_available_bytes"))
    b.integer("mem_total_bytes", d.get("mem_total_bytes")).num("cpu_percent", d.get("cpu_percent"))
    b.text("gpu_status", d.get("gpu_status"))
    return [
        b,
        *(
            p
            for name, (measurement, tag, key) in DEVICE_LISTS.items()
            for p in _flat_points(rec, measurement, tag, key, d.get(name) or [])
        ),
    ]


def _comm(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["comm"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.tag("op", d["op"]).tag("peer", d.get("peer"))
    b.num("latency_ms", d["latency_ms"]).integer("bytes", d.get("bytes"))
    b.text("backend", d.get("backend")).integer("step", rec.step)
    return [b]


def _health(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["health"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.tag(HOST, rec.host)
    for name in HEALTH_INTS:
        b.integer(name, d.get(name))
    for reason, n in (d.get("dropped") or {}).items():
        b.integer(f"dropped_{reason}", n)
    for reason, n in (d.get("errors") or {}).items():
        b.integer(f"error_{reason}", n)
    return [b]


def _signal(rec: Record) -> list[PointBuilder]:
    d = rec.data
    detail = d.get("detail") or {}
    scope = detail.get("scope", "run") if isinstance(detail, dict) else "run"
    # the scope is a tag: signals of one record (one per GPU of a host) share its time
    b = PointBuilder(MEASUREMENT["signal"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.tag("name", d["name"]).tag("metric", d["metric"]).tag("scope", scope)
    b.integer("step", rec.step)
    for name in SIGNAL_FLOATS:
        b.num(name, d.get(name))
    b.text("detail", d.get("detail"))
    return [b]


def _alert(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["alert"], rec).tag(RUN, rec.run_id).tag("rule", d["rule"])
    b.tag("severity", d["severity"]).tag("state", d["state"]).tag("scope", d["scope"])
    b.integer("step", rec.step).integer("rank", rec.rank).text("hint", d["hint"])
    b.text("summary", d.get("summary")).text("fingerprint", d["fingerprint"])
    b.integer("started_step", d.get("started_step")).text("evidence", d.get("evidence"))
    return [b]


def _run_meta(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["run_meta"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.integer("world_size", d["world_size"]).num("peak_flops", d.get("peak_flops"))
    for name in ("hosts", "model", "optimizer", "lr_schedule", "config", "checks", "remedies"):
        b.text(name, d.get(name))
    return [b, *_checks(rec)]


MAX_CHECKS: Final = 64  # check points of one run_meta (the design has about 25)


def _checks(rec: Record) -> list[PointBuilder]:
    """One ``check`` point per check the rank reports (run_meta's ``checks``), for the boards:
    ``on`` 1 (on, or on once its call is made) or 0 (off), which the rollups keep, and the
    words (state, what feeds it or why it is off, the line that turns it on)."""
    found = rec.data.get("checks")
    points = []
    for c in found[:MAX_CHECKS] if isinstance(found, list) else []:
        if not isinstance(c, dict) or not isinstance(c.get("check"), str) or not c["check"]:
            continue
        b = PointBuilder(CHECK, rec, name_tag="check").tag(RUN, rec.run_id)
        b.tag(RANK, rec.rank).tag("check", c["check"]).text("state", c.get("state"))
        b.integer("on", int(c.get("state") != "off"))
        for name in ("needs", "why", "enable"):
            b.text(name, c.get(name))
        points.append(b)
    return points


def _advice(rec: Record) -> list[PointBuilder]:
    """Advice to a run's ranks (``rank`` -1: every rank); the incident's fingerprint is a tag:
    two incidents may advise the same action in one report."""
    d = rec.data
    b = PointBuilder(MEASUREMENT["advice"], rec).tag(RUN, rec.run_id).tag("action", d["action"])
    b.tag("fingerprint", d["fingerprint"]).integer("rank", rec.rank).integer("step", rec.step)
    b.text("rule", d.get("rule")).text("reason", d.get("reason"))
    b.integer("onset_step", d.get("onset_step")).text("checkpoint", d.get("checkpoint"))
    b.integer("checkpoint_step", d.get("checkpoint_step"))
    b.integer("skip_batches", d.get("skip_batches")).num("lr_factor", d.get("lr_factor"))
    b.num("duration_s", d.get("duration_s")).integer("at_step", d.get("at_step"))
    b.integer("steps_lost", d.get("steps_lost"))
    b.integer("batches_skipped", d.get("batches_skipped")).text("evidence", d.get("evidence"))
    for name in ("sample_ids", "sample_hashes"):
        if d.get(name):
            b.integer(f"n_{name}", len(d[name])).text(name, json_list(d[name]))
    return [b]


def _acted(rec: Record) -> list[PointBuilder]:
    """What a rank did with a piece of advice."""
    d = rec.data
    b = PointBuilder(MEASUREMENT["acted"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    b.tag("action", d["action"]).tag("outcome", d["outcome"]).integer("step", rec.step)
    b.text("fingerprint", d["fingerprint"]).text("detail", d.get("detail"))
    return [b]


def _checkpoint(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder(MEASUREMENT["checkpoint"], rec).tag(RUN, rec.run_id).tag(RANK, rec.rank)
    return [b.integer("step", rec.step).text("path", d["path"])]


_BUILDERS: Final = {
    "step": _step,
    "step_batch": _step_batch,
    "step_window": _step_window,
    "eval": _eval,
    "batch": _batch,
    "hw": _hw,
    "comm": _comm,
    "health": _health,
    "signal": _signal,
    "alert": _alert,
    "run_meta": _run_meta,
    "stacks": _stacks,
    "advice": _advice,
    "acted": _acted,
    "checkpoint": _checkpoint,
}


def record_builders(rec: Record) -> list[PointBuilder]:
    """The points of one record, not yet lines; raises ``UnwritableRecord`` with the reason."""
    build = _BUILDERS.get(rec.kind)
    if build is None:
        raise UnwritableRecord(f"kind {rec.kind!r} is not stored in InfluxDB")
    return build(rec)


def record_points(rec: Record) -> list[Point]:
    """The points of one record; raises ``UnwritableRecord`` with the reason."""
    return [b.point() for b in record_builders(rec)]


def record_lines(rec: Record) -> list[str]:
    """Line protocol of one record (one line per point)."""
    return [line for b in record_builders(rec) if (line := b.line())]
