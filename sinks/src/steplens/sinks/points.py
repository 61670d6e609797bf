"""Records to InfluxDB points (pure; see docs/architecture.md, "InfluxDB layout").

Escaping is influxdb-client's (``Point``). Line protocol cannot carry a backslash or a control
character (newline, tab, ...) in a tag value, tag key or field key unchanged, so records with
such names are rejected with the reason (they stay in S3, and go to the dead-letter topic).
String field values may hold anything: quotes and backslashes are escaped, newlines are kept.
Non-finite numbers, which line protocol cannot hold, are stored as a string field
``<name>_nonfinite`` ("NaN", "Infinity", "-Infinity").
"""

from __future__ import annotations

import functools
import json
import math
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Final

from influxdb_client import Point, WritePrecision

from steplens.producer import schema
from steplens.producer.schema import Record

MAX_STRING_FIELD: Final = 60_000  # InfluxDB caps string fields at 64 KiB

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
HEALTH_INTS: Final = ("sent", "spooled", "spool_bytes", "replayed", "queue_len")
WINDOW_INTS: Final = ("count", "nonfinite")
WINDOW_FLOATS: Final = ("mean", "min", "max", "last")

# kind -> measurement of its main point (hw is split into host, gpu, disk and net points)
MEASUREMENT: Final = {
    "step": "step",
    "step_batch": "step",  # written as its step records
    "step_window": "step_window",
    "eval": "eval",
    "batch": "batch",
    "hw": "host",
    "comm": "comm",
    "health": "producer_health",
    "signal": "signal",
    "alert": "alert",
    "run_meta": "run_meta",
}


class UnwritableRecord(ValueError):
    """The record cannot be represented as line protocol; the message is the reason."""


def _nonfinite_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


@functools.lru_cache(maxsize=65536)
def _name_problem(value: str) -> str | None:
    if "\\" in value:
        return "contains a backslash"
    for ch in value:
        if unicodedata.category(ch) == "Cc":
            return f"contains control character {ch!r}"
    return None


def check_name(value: str, what: str) -> str:
    """Reject names line protocol would alter: backslashes and control characters."""
    problem = _name_problem(value)
    if problem is not None:
        raise UnwritableRecord(f"{what} {value[:80]!r} {problem}")
    return value


class PointBuilder:
    """One point: checks every name, keeps field types stable per field name.

    The point is built as it goes, and its tags and fields are kept as dicts too, so a sink
    can see the names and leave fields out (the name limits, ``drop``) before the line is made:
    only then is the point built again from the dicts. ``name_tag``: the tag whose values are
    metric names (``step_window``'s ``metric``), limited like field keys."""

    __slots__ = ("_point", "_rebuild", "fields", "measurement", "name_tag", "tags", "time_ns")

    def __init__(self, measurement: str, rec: Record, name_tag: str | None = None) -> None:
        self.measurement = measurement
        self.time_ns = rec.time_ns
        self.name_tag = name_tag
        self.tags: dict[str, str] = {}
        self.fields: dict[str, Any] = {"seq": rec.seq}
        self._point = Point(measurement).field("seq", rec.seq)
        self._rebuild = False

    def drop(self, key: str) -> None:
        """Leave field ``key`` out of the point."""
        del self.fields[key]
        self._rebuild = True

    def point(self) -> Point:
        if self._rebuild:
            self._point = Point(self.measurement)
            for key, value in self.tags.items():
                self._point.tag(key, value)
            for key, value in self.fields.items():
                self._point.field(key, value)
            self._rebuild = False
        return self._point.time(self.time_ns, WritePrecision.NS)

    def line(self) -> str:
        return str(self.point().to_line_protocol())

    def tag(self, key: str, value: Any) -> PointBuilder:
        if value is None or value == "":
            return self
        key, text = check_name(key, "tag key"), check_name(str(value), f"tag {key}")
        self.tags[key] = text
        self._point.tag(key, text)
        return self

    def _field(self, key: str, value: Any) -> None:
        self.fields[key] = value
        self._point.field(key, value)

    def num(self, key: str, value: Any) -> PointBuilder:
        """A float field; non-finite values go to ``<key>_nonfinite``."""
        if value is None:
            return self
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UnwritableRecord(f"field {key[:80]!r} is not a number: {value!r:.80}")
        check_name(key, "field key")
        f = float(value)
        if math.isfinite(f):
            self._field(key, f)
        else:
            self._field(f"{key}_nonfinite", _nonfinite_name(f))
        return self

    def integer(self, key: str, value: Any) -> PointBuilder:
        if value is None:
            return self
        if isinstance(value, bool) or not isinstance(value, int):
            raise UnwritableRecord(f"field {key[:80]!r} is not an integer: {value!r:.80}")
        self._field(check_name(key, "field key"), value)
        return self

    def text(self, key: str, value: Any) -> PointBuilder:
        if value is None:
            return self
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        self._field(check_name(key, "field key"), text[:MAX_STRING_FIELD])
        return self

    def flag(self, key: str, value: Any) -> PointBuilder:
        if value is None:
            return self
        self._field(check_name(key, "field key"), bool(value))
        return self

    def any(self, key: str, value: Any) -> PointBuilder:
        """Free-form scalar: numbers as floats (stable type), text, booleans."""
        if isinstance(value, bool):
            return self.flag(key, value)
        if isinstance(value, (int, float)):
            return self.num(key, value)
        return self.text(key, value)


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
        PointBuilder("step", rec)
        .tag("run_id", rec.run_id)
        .tag("rank", rec.rank)
        .tag("host", rec.host)
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
    return [b]


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
            PointBuilder("step_window", rec, name_tag="metric")
            .tag("run_id", rec.run_id)
            .tag("rank", rec.rank)
        )
        b.tag("host", rec.host).tag("metric", metric)
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
    b = PointBuilder("eval", rec).tag("run_id", rec.run_id).tag("rank", rec.rank)
    b.tag("split", d["split"]).integer("step", rec.step)
    for name in EVAL_FLOATS:
        b.num(name, d.get(name))
    _by_name(b, d.get("extra") or {}, {*EVAL_FLOATS, "step", "seq"}, "extra_")
    return [b]


def _batch(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder("batch", rec).tag("run_id", rec.run_id).tag("rank", rec.rank)
    b.integer("step", rec.step).integer("n_samples", d["n_samples"]).num(
        "length_mean", d.get("length_mean")
    )
    b.integer("length_max", d.get("length_max")).integer("max_len", d.get("max_len"))
    b.integer("over_length", d.get("over_length"))
    for label, count in (d.get("label_counts") or {}).items():
        b.integer(f"label_{label}", count)
    return [b]


def _flat_points(
    rec: Record, measurement: str, tag: str, key: str, items: list[dict[str, Any]]
) -> list[PointBuilder]:
    points: list[PointBuilder] = []
    for i, item in enumerate(items):
        b = PointBuilder(measurement, rec).tag("run_id", rec.run_id).tag("host", rec.host)
        b.tag(tag, item.get(key, i))
        for name, value in item.items():
            if name != key:
                b.any(name, value)
        points.append(b)
    return points


def _hw(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder("host", rec).tag("run_id", rec.run_id).tag("host", rec.host)
    b.integer("mem_available_bytes", d.get("mem_available_bytes"))
    b.integer("mem_total_bytes", d.get("mem_total_bytes")).num("cpu_percent", d.get("cpu_percent"))
    b.text("gpu_status", d.get("gpu_status"))
    return [
        b,
        *_flat_points(rec, "gpu", "gpu", "index", d.get("gpus") or []),
        *_flat_points(rec, "disk", "device", "device", d.get("disks") or []),
        *_flat_points(rec, "net", "iface", "iface", d.get("nets") or []),
    ]


def _comm(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder("comm", rec).tag("run_id", rec.run_id).tag("rank", rec.rank)
    b.tag("op", d["op"]).tag("peer", d.get("peer"))
    b.num("latency_ms", d["latency_ms"]).integer("bytes", d.get("bytes"))
    b.text("backend", d.get("backend")).integer("step", rec.step)
    return [b]


def _health(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder("producer_health", rec).tag("run_id", rec.run_id).tag("rank", rec.rank)
    b.tag("host", rec.host)
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
    b = PointBuilder("signal", rec).tag("run_id", rec.run_id).tag("rank", rec.rank)
    b.tag("name", d["name"]).tag("metric", d["metric"]).tag("scope", scope)
    b.integer("step", rec.step)
    for name in SIGNAL_FLOATS:
        b.num(name, d.get(name))
    b.text("detail", d.get("detail"))
    return [b]


def _alert(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder("alert", rec).tag("run_id", rec.run_id).tag("rule", d["rule"])
    b.tag("severity", d["severity"]).tag("state", d["state"]).tag("scope", d["scope"])
    b.integer("step", rec.step).integer("rank", rec.rank).text("hint", d["hint"])
    b.text("summary", d.get("summary")).text("fingerprint", d["fingerprint"])
    b.integer("started_step", d.get("started_step")).text("evidence", d.get("evidence"))
    return [b]


def _run_meta(rec: Record) -> list[PointBuilder]:
    d = rec.data
    b = PointBuilder("run_meta", rec).tag("run_id", rec.run_id).tag("rank", rec.rank)
    b.integer("world_size", d["world_size"]).num("peak_flops", d.get("peak_flops"))
    for name in ("hosts", "model", "optimizer", "lr_schedule", "config"):
        b.text(name, d.get(name))
    return [b]


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
