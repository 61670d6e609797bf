"""Panels and boards: Grafana's JSON model, the variables and annotations every board has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .flux import Read, run_ids, stitched

INFLUX = {"type": "influxdb", "uid": "steplens-influxdb"}
HOT_WINDOW = "1h"  # the hot bucket's retention (STEPLENS_HOT_RETENTION)
COLD = (
    "Older raw points and text fields (hints, evidence): `steplens query --run RUN "
    "--metric NAME [--kind KIND]` reads InfluxDB and the Parquet history in S3."
)
BOARD_NOTE = (
    "Any range from 5 minutes to 30 days: the last hour comes from the hot bucket, anything "
    "older from the 1-minute rollups (mean, min, max, last per minute; no text). " + COLD
)


def target(query: str, ref: str = "A") -> dict[str, Any]:
    return {"refId": ref, "datasource": INFLUX, "query": query}


def panel(
    title: str,
    kind: str,
    queries: Sequence[str],
    fields: Sequence[str],
    *,
    description: str = "",
    unit: str | None = None,
    w: int = 12,
    h: int = 8,
    defaults: dict[str, Any] | None = None,
    overrides: Sequence[dict[str, Any]] = (),
    options: dict[str, Any] | None = None,
    hot_only: Sequence[str] = (),
) -> dict[str, Any]:
    """``fields``: what the panel plots; ``hot_only``: those of them the rollups lack (text)."""
    refs = "ABCDEFGH"
    field_defaults = dict(defaults or {})
    if unit:
        field_defaults["unit"] = unit
    return {
        "title": title,
        "type": kind,
        "datasource": INFLUX,
        "description": description,
        "gridPos": {"w": w, "h": h},
        "fieldConfig": {"defaults": field_defaults, "overrides": list(overrides)},
        "options": options or {},
        "targets": [target(q, refs[i]) for i, q in enumerate(queries)],
        "steplensFields": list(fields),
        **({"steplensHotOnly": list(hot_only)} if hot_only else {}),
    }


def right_axis(matcher: dict[str, str], unit: str | None = None) -> dict[str, Any]:
    """A field override: the fields ``matcher`` selects on the right axis, in ``unit``."""
    props = [{"id": "unit", "value": unit}] if unit else []
    return {
        "matcher": matcher,
        "properties": [*props, {"id": "custom.axisPlacement", "value": "right"}],
    }


def threshold_line(value: float, color: str = "red") -> dict[str, Any]:
    """A dashed line at ``value`` (the alert threshold of the stream jobs)."""
    return {
        "custom": {"thresholdsStyle": {"mode": "dashed"}},
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "transparent", "value": None}, {"color": color, "value": value}],
        },
    }


def _layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Left to right, top to bottom, on Grafana's 24-column grid; ids in order."""
    out = []
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append({"id": i, **p, "gridPos": {"x": x, "y": y, "w": w, "h": h}})
        x, row_h = x + w, max(row_h, h)
    return out


def _constant(name: str, value: str) -> dict[str, Any]:
    current = {"text": value, "value": value}
    return {"name": name, "type": "constant", "query": value, "hide": 2, "current": current}


def _firing_annotation() -> dict[str, Any]:
    """A mark at every alert that fires; its rule, scope and hint (rule and scope only
    before the cut: the rollups keep no text)."""
    columns = 'keep(columns: ["_time", "_value", "rule", "severity"])'
    label = 'r.rule + " (" + r.scope + ")"'
    query = stitched(
        Read("alert", ("hint",), where='r.state == "firing"', rolled_fields=("rank",)),
        "last",
        shape_hot=[f'map(fn: (r) => ({{r with _value: {label} + ": " + r._value}}))', columns],
        shape_rolled=[f"map(fn: (r) => ({{r with _value: {label}}}))", columns],
        after=["group()"],
    )
    return {
        "name": "alerts firing",
        "datasource": INFLUX,
        "enable": True,
        "iconColor": "red",
        "target": {"query": query},
    }


def board(
    uid: str,
    title: str,
    panels: list[dict[str, Any]],
    annotations: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A board of ``panels``; ``annotations`` beside the alerts that fire."""
    run = {
        "name": "run_id",
        "type": "query",
        "datasource": INFLUX,
        "label": "run",
        "query": run_ids(),
        "refresh": 2,
        "sort": 0,
        "current": {},
    }
    return {
        "uid": uid,
        "title": title,
        "description": BOARD_NOTE,
        "tags": ["steplens"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "5s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                _constant("bucket", "steplens"),
                _constant("rollup_bucket", "steplens_rollup"),
                _constant("hot_window", HOT_WINDOW),
                run,
            ]
        },
        "annotations": {"list": [_firing_annotation(), *annotations]},
        "panels": _layout(panels),
    }
