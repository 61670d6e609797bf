"""The alert board: the incidents (one row each), counts, every record and a timeline.

The stream jobs report incidents: alert records of scope ``incident`` in measurement
``alert``, tagged ``rule`` (the lead rule), ``severity``, ``state`` and ``scope``, one when an
incident opens, again when it escalates or learns more, one when it resolves; the member
alerts are in ``evidence`` and listed in ``summary``. The rollups keep the tags and the
numbers ``step``, ``rank``, ``started_step``, not the text. Records are counted through
``rank``, which every alert has (``step`` is absent when no step was seen, e.g. a hang).

The advice the stream jobs gave the run's ranks (measurement ``advice``, tagged ``action`` and
``fingerprint``: the incident's) and the ranks' answers (``acted``, tagged ``rank``,
``action``, ``outcome``; the incident's fingerprint and the detail are text) are one table
each, a row per record."""

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
LOG_LIMIT = 1000
INCIDENT_LIMIT = 500
SEVERITY = 'sev = (s) => if s == "critical" then 2 else if s == "warning" then 1 else 0'
INCIDENT_ROW = (
    "_time",
    "severity",
    "state",
    "opened_step",
    "last_step",
    "duration_steps",
    "duration_s",
    "rule",
    "hint",
    "members",
    "fingerprint",
    "evidence",
)


ADVICE_NUMBERS = (
    "rank",
    "step",
    "onset_step",
    "checkpoint_step",
    "skip_batches",
    "lr_factor",
    "duration_s",
    "n_sample_ids",
    "n_sample_hashes",
)
ADVICE_ROW = ("_time", "action", *ADVICE_NUMBERS, "checkpoint", "rule", "reason", "fingerprint")
ANSWER_ROW = ("_time", "rank", "action", "outcome", "step", "detail", "fingerprint")
ADVICE_LIMIT = 500


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


def incident_rows() -> str:
    """One row per incident, newest first: opened (time, step), peak severity, resolved or
    open, how long from opening to its last record, the lead rule and hint (its newest
    record's), the member rules (from the summary) and the newest evidence. Records are
    grouped by the step the incident started at (its fingerprint derives from it and its
    topic; the rollups keep the step, not the fingerprint)."""
    read = Read("alert", (), where='r.scope == "incident"', rolled_fields=("step", "started_step"))
    pivot = 'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
    newest = "if exists r.{0} then r.{0} else accumulator.{0}"
    members = 'if exists r.summary then strings.splitN(v: r.summary, t: ": ", i: 2) else [""]'
    fold = (
        'reduce(identity: {n: 0, opened: 0, last: 0, peak: 0, state: "", rule: "", '
        'hint: "", members: "", fingerprint: "", evidence: "", opened_step: -1, '
        "last_step: -1}, fn: (r, accumulator) => ({\n"
        "    n: accumulator.n + 1,\n"
        "    opened: if accumulator.n == 0 then int(v: r._time) else accumulator.opened,\n"
        "    last: int(v: r._time),\n"
        "    peak: if sev(s: r.severity) > accumulator.peak then sev(s: r.severity) "
        "else accumulator.peak,\n"
        "    state: r.state,\n"
        "    rule: r.rule,\n"
        f"    hint: {newest.format('hint')},\n"
        f"    members: if exists r.summary then listed(a: {members}) else accumulator.members,\n"
        f"    fingerprint: {newest.format('fingerprint')},\n"
        f"    evidence: {newest.format('evidence')},\n"
        "    opened_step: if accumulator.opened_step >= 0 or not exists r.started_step "
        "then accumulator.opened_step else r.started_step,\n"
        "    last_step: if exists r.step then r.step else accumulator.last_step,\n"
        "  }))"
    )
    row = (
        "map(fn: (r) => ({_time: time(v: r.opened), "
        'severity: if r.peak == 2 then "critical" else if r.peak == 1 then "warning" '
        'else "info", state: if r.state == "resolved" then "resolved" else "open", '
        "opened_step: r.opened_step, last_step: r.last_step, "
        "duration_steps: r.last_step - r.opened_step, "
        "duration_s: float(v: r.last - r.opened) / 1000000000.0, rule: r.rule, hint: r.hint, "
        "members: r.members, fingerprint: r.fingerprint, evidence: r.evidence}))"
    )
    key = (
        "map(fn: (r) => ({r with incident: if exists r.started_step then "
        'string(v: r.started_step) else if exists r.fingerprint then r.fingerprint else "-"}))'
    )
    return stitched(
        read,
        "last",
        shape_hot=[pivot],
        shape_rolled=["toInt()", pivot],
        defs=SEVERITY + "\nlisted = (a) => if length(arr: a) > 1 then a[1] else a[0]",
        after=[
            "group()",
            key,
            'group(columns: ["incident"])',
            'sort(columns: ["_time"])',
            fold,
            row,
            "group()",
            f"keep(columns: {names(INCIDENT_ROW)})",
            'sort(columns: ["_time"], desc: true)',
            f"limit(n: {INCIDENT_LIMIT})",
        ],
    )


def record_rows(read: Read, columns: Sequence[str]) -> str:
    """One row per record of ``read``, newest first, every value as text (numbers and text
    in one column type, as the two buckets give them); before the cut only tags and
    numbers."""
    text = "map(fn: (r) => ({r with _value: string(v: r._value)}))"
    pivot = 'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
    return stitched(
        read,
        "last",
        shape_hot=[text, pivot],
        shape_rolled=[text, pivot],
        after=[
            "group()",
            f"keep(columns: {names(columns)})",
            'sort(columns: ["_time"], desc: true)',
            f"limit(n: {ADVICE_LIMIT})",
        ],
    )


def advice_rows() -> str:
    fields = (*ADVICE_NUMBERS, "checkpoint", "rule", "reason")
    return record_rows(Read("advice", fields, rolled_fields=ADVICE_NUMBERS), ADVICE_ROW)


def answer_rows() -> str:
    read = Read("acted", ("step", "detail", "fingerprint"), rolled_fields=("step",))
    return record_rows(read, ANSWER_ROW)


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
            "Incident records (every transition: opened, news, resolved)",
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
    ]
    remedies = [
        panel(
            "Advice given (newest first)",
            "table",
            [advice_rows()],
            ["action", "rank", "step", "checkpoint", "skip_batches", "reason", "fingerprint"],
            description="What the stream jobs advised the run's ranks to do about an incident "
            "(its fingerprint): skip_samples (n_sample_ids / n_sample_hashes), rewind "
            "(checkpoint, checkpoint_step, skip_batches), lower_lr (lr_factor), profile "
            "(duration_s); rank -1: every rank; step: when it was decided. At most "
            f"{ADVICE_LIMIT} records. Before the hot window no text. " + COLD,
            w=12,
            h=9,
            hot_only=["checkpoint", "reason"],
        ),
        panel(
            "Answers of the ranks (newest first)",
            "table",
            [answer_rows()],
            ["rank", "action", "outcome", "step", "detail", "fingerprint"],
            description="What each rank did with the advice: acted, declined, failed or "
            "refused (a remedy the run did not opt into), with the detail it gave and the "
            "incident's fingerprint; step: the rank's step when it answered. The report "
            "(steplens report) puts each incident's advice, answers and what followed in one "
            "row. Before the hot window no text. " + COLD,
            w=12,
            h=9,
            hot_only=["detail", "fingerprint"],
        ),
    ]
    return board(
        "steplens-alerts", "steplens: alert centre", [incidents_panel(), *remedies, *panels]
    )


def incidents_panel() -> dict[str, Any]:
    """The incidents, one row each; the evidence opens from its cell, the rule links to the
    training board from the incident's opening on."""
    training = (
        "/d/steplens-training/steplens-training?var-run_id=${run_id}&from=${__value.time}&to=now"
    )
    return panel(
        "Incidents (one row each, newest first)",
        "table",
        [incident_rows()],
        ["severity", "state", "opened_step", "duration_s", "rule", "hint", "members", "evidence"],
        description="An incident is the alerts of one event (the stream jobs group them): "
        "opened (time, step), peak severity, resolved or still open, time and steps from its "
        "opening to its last record, the lead rule and its hint, the member rules, and the "
        "evidence (click the cell). Step -1: the incident has no step (a hang). The rule "
        "links to the training board from the incident's opening. Before the hot window only "
        "steps and severities: the rollups keep no text. " + COLD,
        w=24,
        h=10,
        hot_only=["hint", "members", "evidence"],
        overrides=[
            {
                "matcher": {"id": "byName", "options": "duration_s"},
                "properties": [{"id": "unit", "value": "s"}],
            },
            {
                "matcher": {"id": "byName", "options": "evidence"},
                "properties": [{"id": "custom.inspect", "value": True}],
            },
            {
                "matcher": {"id": "byName", "options": "rule"},
                "properties": [
                    {
                        "id": "links",
                        "value": [{"title": "training board at this incident", "url": training}],
                    }
                ],
            },
        ],
    )
