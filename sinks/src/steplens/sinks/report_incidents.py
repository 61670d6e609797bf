"""Incidents for people: the alert records of a run folded into one row per incident.

The stream jobs report an incident as alert records that share its ``fingerprint``: one when it
opens, again when it escalates or learns more, one when it resolves (and again if it opens
again). ``incidents`` turns them into one row each: when it opened (step and time), its peak
severity, whether it resolved (and when) or is still open, how long it lasted, its lead rule
and hint (the newest record's), its members' rules, and the evidence of its newest record.
Records without a fingerprint (older workers) are grouped by rule and scope.

``run_incidents`` adds what came of each: the advice the stream jobs gave for it with the
ranks' answers (``remedies_of``), and whether the loss (the ranks' mean) came back to its
trend from before the onset, and after how many steps (``steplens.sinks.recovery``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import numpy as np
import pandas as pd

from steplens.sinks.recovery import recovery
from steplens.sinks.remedies import (
    advice_line,
    answers_text,
    describe,
    grouped,
    present,
    traces,
    who,
)
from steplens.sinks.report_data import RunData

SEVERITY_RANK: Final = {"info": 0, "warning": 1, "critical": 2}
COLUMNS: Final = [
    "fingerprint",
    "opened_step",
    "opened_ns",
    "severity",
    "state",
    "resolved_step",
    "duration_steps",
    "duration_s",
    "rule",
    "hint",
    "advice",
    "members",
    "evidence",
    "records",
    "remedies",
    "recovery",
]


def parse_json(value: Any) -> Any:
    """A stored text field that holds JSON (the stores keep objects as text), else the value."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _number(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _members(evidence: Any, summary: Any, rule: str) -> list[str]:
    """The member rules: from the evidence's ``members``, else the summary's list after its
    colon (``"training incident since step 96: spike:loss, spike:grad_norm"``), else the rule."""
    if isinstance(evidence, dict) and isinstance(evidence.get("members"), list):
        rules = [str(m.get("rule")) for m in evidence["members"] if isinstance(m, dict)]
        if rules:
            return list(dict.fromkeys(rules))
    if isinstance(summary, str) and "incident" in summary and ": " in summary:
        listed = summary.split(": ", 1)[1]
        return list(dict.fromkeys(r.strip() for r in listed.split(", ") if r.strip()))
    return [rule]


def _advice(evidence: Any) -> list[str]:
    """What the members' evidence advises (``advice``: e.g. the evaluation interval the data
    supports), each once."""
    found: list[str] = []
    if isinstance(evidence, dict):
        for m in [evidence, *(evidence.get("members") or [])]:
            if isinstance(m, dict) and isinstance(m.get("advice"), str):
                found.append(m["advice"])
    return list(dict.fromkeys(found))


def _newest_text(g: pd.DataFrame, name: str) -> str:
    """The newest non-empty text of column ``name`` in the (time-ordered) records ``g``."""
    if name not in g:
        return ""
    texts = [t for t in g[name].dropna().astype(str) if t]
    return texts[-1] if texts else ""


def incidents(
    alerts: pd.DataFrame, last_step: float | None = None, last_ns: int | None = None
) -> pd.DataFrame:
    """One row per incident (``COLUMNS``), the earliest opened first. An open incident lasts
    until ``last_step`` / ``last_ns`` (the run's last stored step and time) so far."""
    if alerts.empty or not {"rule", "state"} <= set(alerts.columns):
        return pd.DataFrame(columns=COLUMNS)
    a = alerts.copy()
    if "fingerprint" not in a:
        a["fingerprint"] = None
    scope = a["scope"].astype(str) if "scope" in a else "run"
    a["_key"] = a["fingerprint"].where(a["fingerprint"].notna(), a["rule"].astype(str) + scope)
    order = [c for c in ("time_ns", "step") if c in a.columns]
    rows = []
    for key, group in a.groupby("_key", sort=False):
        g = group.sort_values(order, kind="stable") if order else group
        newest = g.iloc[-1]
        starts = pd.to_numeric(g["started_step"], errors="coerce") if "started_step" in g else None
        steps = pd.to_numeric(g["step"], errors="coerce") if "step" in g else pd.Series(np.nan)
        opened = starts.min() if starts is not None and starts.notna().any() else steps.min()
        times = pd.to_numeric(g["time_ns"], errors="coerce") if "time_ns" in g else None
        opened_ns = times.min() if times is not None else math.nan
        resolved = str(newest.get("state")) == "resolved"
        # it ended with the first of its trailing resolved records (the later ones bring news,
        # e.g. an answer to its advice)
        end_step, end_ns = _number(last_step), _number(last_ns)
        if resolved:
            done = (g["state"].astype(str) == "resolved").to_numpy()
            ended = g.iloc[0 if done.all() else len(done) - int(np.argmin(done[::-1]))]
            end_step, end_ns = _number(ended.get("step")), _number(ended.get("time_ns"))
        severities = g["severity"].astype(str) if "severity" in g else pd.Series(["info"])
        peak = max(severities, key=lambda s: SEVERITY_RANK.get(s, -1))
        evidence = parse_json(newest.get("evidence"))
        rule = str(newest.get("rule"))
        rows.append(
            {
                "fingerprint": str(key),
                "opened_step": _number(opened),
                "opened_ns": _number(opened_ns),
                "severity": peak,
                "state": "resolved" if resolved else "open",
                "resolved_step": end_step if resolved else math.nan,
                "duration_steps": end_step - _number(opened),
                "duration_s": (end_ns - _number(opened_ns)) / 1e9,
                "rule": rule,
                "hint": _newest_text(g, "hint"),
                "advice": _advice(evidence),
                "members": _members(evidence, newest.get("summary"), rule),
                "evidence": evidence if isinstance(evidence, dict) else {},
                "records": len(g),
                "remedies": [],
                "recovery": "",
            }
        )
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.sort_values(["opened_step", "opened_ns"], kind="stable").reset_index(drop=True)


def duration_text(steps: float, seconds: float) -> str:
    """``"12 steps, 40 s"``; either part left out when unknown."""
    parts = []
    if math.isfinite(steps):
        parts.append(f"{steps:.0f} steps")
    if math.isfinite(seconds) and seconds >= 0:
        parts.append(f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min")
    return ", ".join(parts)


def run_incidents(data: RunData) -> pd.DataFrame:
    """``incidents`` of a run, open ones lasting until its last stored step and time."""
    steps = data.steps
    last_step = float(steps["step"].max()) if "step" in steps and not steps.empty else None
    last_ns = None
    if "time_ns" in steps and steps["time_ns"].notna().any():
        last_ns = int(steps["time_ns"].max())
    found = incidents(data.alerts, last_step, last_ns)
    given = remedies_of(data.advice, data.acted)
    loss = loss_by_step(steps)
    xs, ys = loss.index.to_numpy(dtype="float64"), loss.to_numpy(dtype="float64")
    found["remedies"] = [given.get(fp, []) for fp in found["fingerprint"]]
    found["recovery"] = [
        recovery(xs, ys, onset).text() if math.isfinite(onset) and len(xs) else ""
        for onset in found["opened_step"]
    ]
    return found


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """``frame``'s records, oldest first, NaN read as missing."""
    if frame.empty or not {"fingerprint", "action"} <= set(frame.columns):
        return []
    order = [c for c in ("time_ns", "step") if c in frame.columns]
    frame = frame.sort_values(order, kind="stable") if order else frame
    return [{k: present(v) for k, v in r.items()} for r in frame.to_dict("records")]


def remedies_of(advice: pd.DataFrame, acted: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Incident fingerprint -> the advice given for it, in the order given: ``action``,
    ``step``, ``rank``, ``advice`` (what it asked, in words), ``answers`` (each rank's
    latest: rank, outcome, detail, step), ``answered`` (them in words), ``traces`` (a
    profile's: rank, uri) and ``line`` (all of it in one line). A record read twice (both
    stores, a replay) counts once."""
    answers: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {}
    for r in _rows(acted):
        answer = {k: r.get(k) for k in ("rank", "outcome", "detail", "step")}
        answers.setdefault((str(r["fingerprint"]), str(r["action"])), {})[r.get("rank")] = answer
    out: dict[str, list[dict[str, Any]]] = {}
    seen: set[tuple[str, str, Any]] = set()
    for r in _rows(advice):
        fp, action = str(r["fingerprint"]), str(r["action"])
        if (fp, action, r.get("rank")) in seen:
            continue
        seen.add((fp, action, r.get("rank")))
        got = list(answers.get((fp, action), {}).values())
        groups = grouped(got)
        out.setdefault(fp, []).append(
            {
                "action": action,
                "step": r.get("step"),
                "rank": r.get("rank"),
                "to": who(r.get("rank")),
                "advice": describe(r),
                "answers": got,
                "answered": answers_text(groups),
                "traces": traces(got),
                "line": advice_line(r, groups),
            }
        )
    return out


def loss_by_step(steps: pd.DataFrame) -> pd.Series:
    """The ranks' mean loss per logged step (an empty series without a loss)."""
    if steps.empty or not {"step", "loss"} <= set(steps.columns):
        return pd.Series(dtype="float64")
    loss = pd.to_numeric(steps["loss"], errors="coerce")
    return loss.groupby(steps["step"].astype("float64")).mean().sort_index()
