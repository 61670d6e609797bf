"""The demo's scripted incidents, and how alerts are matched against them afterwards.

The plan is a pure function of the run length, so the training script (which injects the
incidents) and the demo command (which scores what was caught) agree without talking.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MAX_FALSE_LINES = 12  # false alarms listed by name in the scorecard


@dataclass(frozen=True)
class Incident:
    kind: str  # lr_blowup | corrupted_batch | straggler | duplicates | stall
    first_step: int
    last_step: int
    rank: int | None  # None: every rank
    description: str
    # words that appear in the names of rules that should catch it (matched loosely): an
    # incident catches it only when its lead rule has one
    rule_words: tuple[str, ...] = ()
    params: dict[str, float] = field(default_factory=dict)

    def covers(self, step: int) -> bool:
        return self.first_step <= step <= self.last_step


def plan_incidents(total_steps: int, stall_s: float = 75.0, slow_s: float = 0.5) -> list[Incident]:
    """Incidents spread over the second half of a run of ``total_steps`` (at least 120).

    The first third is left clean so every detector has a baseline before anything happens.
    """
    if total_steps < 120:
        raise ValueError("the incident plan needs at least 120 steps")

    def at(fraction: float) -> int:
        return int(total_steps * fraction)

    blow, corrupt, slow, dup, stall = at(0.40), at(0.52), at(0.62), at(0.76), at(0.90)
    slow_len = max(12, total_steps // 15)
    dup_len = max(8, total_steps // 30)
    return [
        Incident(
            "lr_blowup",
            blow,
            blow + 3,
            None,
            "learning rate x30 for 4 steps: loss and grad norm spike together",
            ("lr", "loss", "grad", "spike", "diverg", "arima", "schedule"),
            {"factor": 30.0},
        ),
        Incident(
            "corrupted_batch",
            corrupt,
            corrupt,
            0,
            "rank 0 reads a corrupted batch: random tokens, over-length rows",
            ("batch", "length", "data", "loss", "spike", "corrupt", "arima"),
        ),
        Incident(
            "straggler",
            slow,
            slow + slow_len - 1,
            1,
            f"rank 1 slowed down by {slow_s:.2f} s per step",
            ("straggl",),  # the cross-rank rule: a slow step or a data wait names no rank
            {"slow_s": slow_s},
        ),
        Incident(
            "duplicates",
            dup,
            dup + dup_len - 1,
            None,
            "a burst of duplicated samples: every batch drawn from 4 samples",
            ("dup", "repeat", "batch", "data", "hash"),
        ),
        Incident(
            "stall",
            stall,
            stall,
            1,
            f"rank 1 stops stepping for {stall_s:.0f} s (hardware samples continue)",
            ("hang", "stall", "progress", "heartbeat", "stuck"),
            {"stall_s": stall_s},
        ),
    ]


def save_plan(incidents: list[Incident], path: Path) -> None:
    path.write_text(json.dumps([asdict(i) for i in incidents], indent=1))


def load_plan(path: Path) -> list[Incident]:
    out = []
    for d in json.loads(path.read_text()):
        d["rule_words"] = tuple(d.get("rule_words", ()))
        out.append(Incident(**d))
    return out


# --------------------------------------------------------------------------- scoring


@dataclass
class Scorecard:
    caught: dict[str, list[dict[str, Any]]]  # incident kind -> alerts that caught it
    missed: list[Incident]
    false_alarms: list[dict[str, Any]]
    # alerts inside an incident's window whose rule is a side effect (e.g. a grad spike when
    # duplicated batches start): neither a catch nor a false alarm
    related: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def alert_step(alert: dict[str, Any]) -> int | None:
    """The step an alert refers to: where the condition started, else where it fired, else
    the step estimated from the time it fired (``estimated_step``)."""
    for key in ("started_step", "step", "estimated_step"):
        value = alert.get(key)
        if isinstance(value, int):
            return value
    return None


def _rank_of(alert: dict[str, Any]) -> int | None:
    rank = alert.get("rank")
    if isinstance(rank, int) and rank >= 0:
        return rank
    scope = str(alert.get("scope", ""))
    if scope.startswith("rank:"):
        try:
            return int(scope.split(":", 1)[1])
        except ValueError:
            return None
    return None


def members(alert: dict[str, Any]) -> list[dict[str, Any]]:
    """An incident record's members (the alerts it groups), each with the record's time; an
    alert record of its own otherwise."""
    ev = alert.get("evidence")
    got = ev.get("members") if isinstance(ev, dict) else None
    if not isinstance(got, list) or not got:
        return [alert]
    shared: dict[str, Any] = {k: alert[k] for k in ("time_ns", "estimated_step") if k in alert}
    return [{**m, **shared} for m in got if isinstance(m, dict)]


def _in_window(
    incident: Incident, alert: dict[str, Any], slack: int, started_ns: int | None
) -> bool:
    """Whether any of the alert's members falls in the incident's window."""
    return any(_member_in(incident, m, slack, started_ns) for m in members(alert))


def _member_in(
    incident: Incident, alert: dict[str, Any], slack: int, started_ns: int | None
) -> bool:
    rank = _rank_of(alert)
    # a stall holds every rank at the next collective and a straggler slows every rank's
    # wall-clock step: any rank may report those
    other_rank = incident.rank is not None and rank is not None and rank != incident.rank
    if other_rank and incident.kind not in ("stall", "straggler"):
        return False
    step = alert_step(alert)
    if step is not None:
        return incident.first_step - 2 <= step <= incident.last_step + slack
    # alerts about time without progress may carry no step: match them by time
    t = alert.get("time_ns")
    if started_ns is None or not isinstance(t, int):
        return False
    lasts_s = incident.params.get("stall_s", 0.0) + 120.0
    return started_ns - 5e9 <= t <= started_ns + lasts_s * 1e9


def _fits(incident: Incident, alert: dict[str, Any], slack: int, started_ns: int | None) -> bool:
    """Whether the alert's lead rule (an incident's ``rule``) belongs to the incident's kind
    and one of its members falls in the incident's window (a member that joined an incident
    opened earlier, elsewhere, catches nothing unless the incident is reported again for it:
    ``_reports``). A straggler found by a disk-latency threshold with a data wait as member
    is not caught: the lead names the cause."""
    lead = str(alert.get("rule", "")).lower()
    if not any(w in lead for w in incident.rule_words):
        return False
    return any(_member_in(incident, m, slack, started_ns) for m in members(alert))


def score(
    incidents: list[Incident],
    alerts: list[dict[str, Any]],
    slack: int = 10,
    started_ns: dict[str, int] | None = None,
) -> Scorecard:
    """Match the incidents steplens opened (alert records of scope "incident") to the
    scripted ones by step window and rank of their members (time window for alerts without
    any step, from ``started_ns``: incident kind -> wall time it started).

    A scripted incident is caught by an incident that opens (or opens again, or escalates:
    a higher severity or a new rule) inside its window, led by a rule of its kind, with a
    member there; an incident that opened earlier and is still open when the scripted one
    happens does not catch it by listing a later member. An incident none of whose members
    falls in any window is a false alarm; one with a member in a window that caught nothing
    there is related (a side effect); a scripted incident that nothing caught is missed. An incident
    counts once: its last report stands for it.
    """
    started_ns = started_ns or {}
    caught: dict[str, list[dict[str, Any]]] = {i.kind: [] for i in incidents}
    related: dict[str, list[dict[str, Any]]] = {i.kind: [] for i in incidents}
    for alert, at in _reports(alerts):
        for inc in incidents:
            at_ok = at is None or inc.first_step - 2 <= at <= inc.last_step + slack
            if at_ok and _fits(inc, alert, slack, started_ns.get(inc.kind)):
                caught[inc.kind].append(alert)
    for kind, hits in caught.items():  # an incident once: its last report that caught
        caught[kind] = list({_key(a): a for a in hits}.values())
    caught_ids = {_key(a) for hits in caught.values() for a in hits}
    false_alarms = []
    for alert in _opened([a for a in alerts if a.get("state", "firing") == "firing"]):
        windows = [i for i in incidents if _in_window(i, alert, slack, started_ns.get(i.kind))]
        if not windows:
            false_alarms.append(alert)
        elif _key(alert) not in caught_ids:
            related[windows[0].kind].append(alert)
    missed = [i for i in incidents if not caught[i.kind]]
    return Scorecard(
        {k: v for k, v in caught.items() if v},
        missed,
        false_alarms,
        {k: v for k, v in related.items() if v},
    )


def _key(alert: dict[str, Any]) -> Any:
    return alert.get("fingerprint") if alert.get("scope") == "incident" else id(alert)


def _reports(alerts: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int | None]]:
    """The firing reports that page: each incident as it opens (at the step it started), opens
    again, or escalates (at the step of the report); an alert that is not an incident as it
    is. With the step they page at (None: none known, the members' times decide)."""
    out: list[tuple[dict[str, Any], int | None]] = []
    last: dict[Any, dict[str, Any]] = {}
    for a in alerts:
        if a.get("scope") != "incident":
            if a.get("state", "firing") == "firing":
                out.append((a, alert_step(a)))
            continue
        key = a.get("fingerprint")
        before = last.get(key)
        last[key] = a
        if a.get("state", "firing") != "firing":
            continue
        if before is None:
            out.append((a, alert_step(a)))
        elif before.get("state") != "firing" or _escalated(before, a):
            step = a.get("step")
            out.append((a, step if isinstance(step, int) else alert_step(a)))
    return out


def _escalated(before: dict[str, Any], now: dict[str, Any]) -> bool:
    order = {"info": 0, "warning": 1, "critical": 2}
    if order.get(str(now.get("severity")), 0) > order.get(str(before.get("severity")), 0):
        return True
    had = {m.get("rule") for m in members(before)}
    return any(m.get("rule") not in had for m in members(now))


def estimate_steps(alerts: list[dict[str, Any]], timeline: list[tuple[int, int]]) -> None:
    """Give alerts without a step an ``estimated_step``: the last step seen before they fired.

    ``timeline``: (time_ns, step) pairs of records with a step, e.g. the run's signals.
    """
    points = sorted(timeline)
    times = [t for t, _ in points]
    for alert in alerts:
        t = alert.get("time_ns")
        if alert_step(alert) is not None or not isinstance(t, int) or not points:
            continue
        i = bisect.bisect_right(times, t)
        if i > 0:
            alert["estimated_step"] = max(s for _, s in points[:i])


def load_starts(path: Path) -> dict[str, int]:
    """Incident kind -> wall time (ns) it started, from the training run's starts log."""
    out: dict[str, int] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out.setdefault(str(d["kind"]), int(d["time_ns"]))
    return out


def format_scorecard(plan: list[Incident], card: Scorecard) -> str:
    lines = ["", "What steplens caught", "=" * 72]
    for inc in plan:
        where = "all ranks" if inc.rank is None else f"rank {inc.rank}"
        hits = card.caught.get(inc.kind, [])
        mark = "CAUGHT" if hits else "MISSED"
        lines.append(f"{mark:<7} {inc.kind} (steps {inc.first_step}-{inc.last_step}, {where})")
        for a in _distinct(hits):
            lines.append("        " + _alert_line(a))
        side = card.related.get(inc.kind, [])
        if side:
            rules = sorted({str(a.get("rule")) for a in side})
            lines.append(f"        (+{len(side)} related: {', '.join(rules)})")
    lines.append("-" * 72)
    false = _distinct(card.false_alarms)
    by_rule = Counter(str(a.get("rule")) for a in false)
    summary = ", ".join(f"{rule} x{n}" for rule, n in by_rule.most_common())
    lines.append(f"false alarms (outside every incident): {len(false)}  ({summary or 'none'})")
    for a in false[:MAX_FALSE_LINES]:
        lines.append("        " + _alert_line(a))
    if len(false) > MAX_FALSE_LINES:
        lines.append(f"        ... {len(false) - MAX_FALSE_LINES} more in the report")
    caught = len(plan) - len(card.missed)
    n_false = len(false)
    lines.append(f"caught {caught} of {len(plan)} incidents, {n_false} false alarm(s)")
    return "\n".join(lines)


def _opened(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each incident once: its last report (an escalation names more members); alerts that
    are not incidents as they are."""
    last: dict[Any, dict[str, Any]] = {}
    for i, a in enumerate(alerts):
        key = a.get("fingerprint") if a.get("scope") == "incident" else i
        last[key] = a
    return list(last.values())


def _distinct(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (rule, scope, step): an alert that fires again at the same step once."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for a in sorted(alerts, key=lambda a: alert_step(a) or 0):
        seen.setdefault((a.get("rule"), a.get("scope"), alert_step(a)), a)
    return list(seen.values())


def _alert_line(a: dict[str, Any]) -> str:
    rank = a.get("rank")
    where = f"rank {rank}" if isinstance(rank, int) and rank >= 0 else a.get("scope", "run")
    step = alert_step(a)
    shown = f"~{step}" if a.get("step") is None and step is not None else str(step)
    return (
        f"[{a.get('severity', '?'):<8}] step {shown:>5} {where:<8} "
        f"{a.get('rule', '?')}: {a.get('hint', '')}"
    )
