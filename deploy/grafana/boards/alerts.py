"""The alert board: counts, the alert log and a timeline per alert.

An alert is one record per transition (firing, resolved) in measurement ``alert``, tagged
``rule``, ``severity``, ``state`` and ``scope``; its fingerprint is a hash of run, rule and
scope, so (rule, scope) names one alert in both buckets (the rollups keep the tags and the
numbers ``step``, ``rank``, ``started_step``, not the text). Records are counted through
``rank``, which every alert has (``step`` is absent when no step was seen, e.g. a hang).
Incidents, when the stream jobs group alerts into them, are alert records with scope
``incident`` and their members in ``evidence``: the same panels show them, and one lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .flux import Read, names, stitched
from .layout import COLD, board, panel

FIRING = 'r.state == "firing"'
LOG_COLUMNS = (
    "_time",
    "severity",
    "state",
    "rule",
    "scope",
    "step",
    "rank",
    "hint",
    "summary",
    "fingerprint",
    "evidence",
)
INCIDENT_COLUMNS = (
    "_time",
    "severity",
    "state",
    "rule",
    "step",
    "summary",
    "fingerprint",
    "evidence",
)
LOG_LIMIT = 1000


def count_by(column: str, where: str = "") -> str:
    read = Read("alert", ("rank",), where=where, keep=(column,))
    return stitched(read, "last", after=[f"group(columns: {names((column,))})", "count()"])


def alert_log(where: str = "", columns: Sequence[str] = LOG_COLUMNS) -> str:
    """The newest ``LOG_LIMIT`` records; before the cut only tags and numbers (rollups)."""
    read = Read("alert", (), where=where, rolled_fields=("step", "rank", "started_step"))
    pivot = 'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
    return stitched(
        read,
        "last",
        shape_hot=[pivot],
        shape_rolled=["toInt()", pivot],
        after=[
            "group()",
            f"keep(columns: {names(columns)})",
            'sort(columns: ["_time"], desc: true)',
            f"limit(n: {LOG_LIMIT})",
        ],
    )


def timeline() -> str:
    """One row per alert (rule, scope): its severity while firing, then "resolved"."""
    read = Read("alert", ("rank",), keep=("rule", "scope", "state", "severity"))
    state = (
        "map(fn: (r) => ({_time: r._time, rule: r.rule, scope: r.scope, "
        '_value: if r.state == "firing" then r.severity else "resolved"}))'
    )
    return stitched(
        read,
        "last",
        after=[
            state,
            f"group(columns: {names(('rule', 'scope'))})",
            'sort(columns: ["_time"])',
            "aggregateWindow(every: every, fn: last, createEmpty: false)",
        ],
    )


def alerts() -> dict[str, Any]:
    older = (
        "Records older than the hot bucket (an hour) come from the 1-minute rollups: tags and "
        "step only, and several transitions of one alert within a minute count once. " + COLD
    )
    panels = [
        panel(
            "Firing alerts by severity",
            "bargauge",
            [count_by("severity", FIRING)],
            ["_value", "severity"],
            w=8,
            h=7,
        ),
        panel("Firing vs resolved", "piechart", [count_by("state")], ["_value", "state"], w=8, h=7),
        panel(
            "Alerts per rule", "bargauge", [count_by("rule", FIRING)], ["_value", "rule"], w=8, h=7
        ),
        panel(
            "Alert log",
            "table",
            [alert_log()],
            ["severity", "state", "rule", "scope", "step", "hint", "fingerprint", "evidence"],
            description=f"Newest first, at most {LOG_LIMIT} records. " + older,
            w=24,
            h=12,
            hot_only=["hint", "fingerprint", "evidence"],
        ),
        panel(
            "Alert timeline by rule and scope",
            "state-timeline",
            [timeline()],
            ["_value", "rule", "scope"],
            description="One row per alert (its fingerprint is run + rule + scope): its "
            "severity while it fires, then resolved. " + older,
            w=24,
            h=9,
        ),
        panel(
            "Incidents and their members",
            "table",
            [alert_log('r.scope == "incident"', INCIDENT_COLUMNS)],
            ["rule", "state", "fingerprint", "evidence"],
            description='Alert records of scope "incident": alerts the stream jobs grouped '
            "into one incident, listed in evidence. " + older,
            w=24,
            h=8,
            hot_only=["fingerprint", "evidence"],
        ),
    ]
    return board("steplens-alerts", "steplens: alert centre", panels)
