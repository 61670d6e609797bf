"""Incidents: the alerts of one underlying event, reported as one.

The rules raise an alert per rule and scope; one event (a bad batch) often trips several (a loss
spike, a gradient spike, their correlation, an ARIMA excursion, an over-length share). A firing
alert joins the run's open incident of the same topic (training dynamics, throughput, memory,
data, evaluation, hardware) if one of its members started in the last ``join_gap`` steps, or
any open incident that started within ``join_steps`` steps of it (one event seen by rules of
several topics); otherwise it opens an incident. An incident:

* has one severity, the highest any member reached (it escalates, and never steps down before
  it resolves);
* carries the most specific hint of its members (a correlation explains more than its parts, a
  named cause more than a spike, a spike more than a forecast excursion) and every member's
  evidence;
* inhibits its members: only the incident is reported (opened; again when it escalates, gets a
  better hint or a member of a rule as specific as its lead; resolved), as Alertmanager's
  inhibition keeps lower-severity alerts of a firing one quiet;
* resolves when its signals are back in their bands: when its last member that names the event
  (a spike, a schedule deviation, a correlation, a named cause) resolves, each after its rule's
  persistence (``RulesConfig.resolve_after`` steps without a breach). Followers (an ARIMA
  excursion, a volatility window: ``specificity`` 1) are what an event leaves behind: they join
  it, never hold it open, and one still firing when it resolves, or starting within
  ``join_gap`` steps after (``follow_steps``, on a metric its event named: the volatility of
  a loss window that still holds the spike), stays inhibited by it (an incident of followers
  only resolves with its last one);
* opens again (the same incident) if an alert of its topic that is not a follower starts
  within ``join_gap`` steps after it resolved (``follow_steps`` for a condition,
  ``CONDITIONS``: a straggler or a data wait that breaches on and off is one event; an
  aggregate counted from its first step: the next window, which still holds the event's last
  steps, breaching again);
* is never paged twice for one event by an aggregate: an alert of a ``step_window`` (its
  evidence's ``span_first``, the window's first step) whose span covers an incident of its
  topic that opened and resolved joins it quietly, as a follower does (a window over a data
  stall that arrives after the steps sent raw paged and resolved it); where it names the
  cause better than the incident's lead (a straggler over one rank's data wait), the
  incident is reported again as resolved, with the better lead: no page.

A new event is its own incident, not a member of the one still open: an alert of a rule that
already has a member there which has come back in its band (it peaked and resolved) and started
more than ``join_steps`` steps before, now more than ``join_gap`` steps after that member
resolved or (a spike) on another rank or with a larger value more than ``join_gap`` steps after
that member started (a second loss spike after the first, a corrupted batch after an lr
blow-up; not the blow-up's loss still climbing a few steps on, nor a window whose peak is the
spike already paged), opens an incident of its own, paged with its own step; the earlier
incident goes on and resolves on its own signals.

Its identity (``fingerprint``) derives from the run, the topic and the step it started at, and
its time from the record it opened on, so a replay after a restart reports the same incident.

The advice given for an incident (``note_advice``) and the ranks' answers to it (``answered``)
travel in its reports' evidence as ``remedies``: one entry per action, with what it costs and
its evidence, and the answers grouped by outcome (``n`` ranks, the first ``MAX_RANKS`` named,
``MAX_DETAILS`` distinct details). Advice suggested but not sent (past the run's remedy budget,
no checkpoint in range) is an entry too, with ``held`` (the reason) and the evidence saying
that a person decides. An answer reports the incident again (in its state: firing, or resolved
while it is remembered) when it brings an outcome the advice had not had, or is the last
rank's; so does advice decided after the incident's last report (``report_again``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from steplens.stream_jobs.engine.core import CRITICAL, INFO, WARNING, Alert

RANK = {INFO: 0, WARNING: 1, CRITICAL: 2}
MAX_RANKS = 8  # ranks named per outcome of an answer
MAX_DETAILS = 2  # distinct details kept per outcome
DETAIL_CHARS = 200
MAX_ANSWERED = 1024  # ranks remembered per advice, so a repeated answer counts once
# what the evidence of a piece of advice keeps (the rest is on the advice topic)
ADVICE_FIELDS = (
    "checkpoint",
    "checkpoint_step",
    "skip_batches",
    "lr_factor",
    "duration_s",
    "at_step",
    "steps_lost",
    "batches_skipped",
    "evidence",
)

# rule (or its detector's name) -> topic
TOPICS: Mapping[str, str] = {
    "nonfinite": "training",
    "spike:loss": "training",
    "spike:grad_norm": "training",
    "spike:grad_norm_preclip": "training",
    "volatility": "training",
    "arima:loss": "training",
    "arima:grad_norm": "training",
    "arima:grad_norm_preclip": "training",
    "lr_schedule": "training",
    "training": "training",
    "clipping": "training",
    "vanishing": "training",
    "correlation:loss_grad": "training",
    "arima:step_time_s": "throughput",
    "arima:tokens_per_s": "throughput",
    "straggler": "throughput",
    "hang": "throughput",
    "threshold:gpu_util": "throughput",
    "threshold:data_wait_share": "throughput",
    "threshold:disk_io_latency_ms": "throughput",
    "threshold:comm_latency_ms": "throughput",
    "correlation:data_bottleneck": "throughput",
    "threshold:gpu_mem_pct": "memory",
    "threshold:gpu_mem_growth": "memory",
    "threshold:host_mem_available_pct": "memory",
    "memory": "memory",
    "data": "data",
    "plateau": "evaluation",
    "perplexity": "evaluation",
    "generalization_gap": "evaluation",
    "eval_unstable": "evaluation",
    "correlation:eval_unstable": "evaluation",
    "hardware": "hardware",
    "baseline:step_time_s": "throughput",
    "baseline:tokens_per_s": "throughput",
    "baseline": "hardware",  # a GPU, disk or network series outside its 7-day band
}

# how much a rule's hint explains, most first
SPECIFIC: Mapping[str, int] = {
    "correlation": 4,
    "nonfinite": 3,
    "data": 3,
    "lr_schedule": 3,
    "hang": 3,
    "straggler": 4,  # names the rank and what it waits on: more than its data wait's share
    "threshold": 3,
    "hardware": 3,
    "memory": 3,
    "training": 3,
    "clipping": 3,
    "vanishing": 3,
    "spike": 2,
    "plateau": 2,
    "perplexity": 2,
    "generalization_gap": 2,
    "eval_unstable": 2,
}


def topic_of(rule: str) -> str:
    """The topic of ``rule``: from ``TOPICS``; a rule of a metric that has none (a column of an
    offline CSV) is of its metric's topic, so every detector of one column is one incident."""
    name, _, metric = rule.partition(":")
    return TOPICS.get(rule) or TOPICS.get(name) or metric or name


def specificity(rule: str) -> int:
    return SPECIFIC.get(rule.split(":", 1)[0], 1)


# rules whose value is the size of the event (a spike that is larger is a new one)
SPIKES = frozenset({"spike", "nonfinite"})
# rules of a condition that holds for a while (a slow rank, a share over a line): breaching on
# and off within ``follow_steps`` is one event
CONDITIONS = frozenset({"straggler", "threshold"})


def follower(rule: str) -> bool:
    """Whether ``rule`` only follows an event (a forecast excursion, a volatility window)."""
    return specificity(rule) <= 1


@dataclass
class Member:
    rule: str
    scope: str
    severity: str
    hint: str
    started_step: int | None
    step: int | None
    firing: bool = True
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Incident:
    fingerprint: str
    run_id: str
    topic: str
    started_step: int | None
    time_ns: int
    severity: str = INFO
    # by the alert's fingerprint and start: an alert that fires again is a member again
    members: dict[str, Member] = field(default_factory=dict)
    last_step: int | None = None
    episode: int = 0  # times it opened again after resolving
    # the advice given for it and its answers (see the module's docstring), one per action
    remedies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def lead(self) -> Member:
        """The member whose hint the incident carries."""
        return max(
            self.members.values(),
            key=lambda m: (specificity(m.rule), RANK.get(m.severity, 0), -(m.started_step or 0)),
        )

    def events(self) -> list[Member]:
        """The members that name the event (all of them when only followers joined)."""
        named = [m for m in self.members.values() if not follower(m.rule)]
        return named or list(self.members.values())

    def firing(self) -> bool:
        """Whether it holds: a member that names the event fires."""
        return any(m.firing for m in self.events())

    def last_start(self) -> int | None:
        """The latest step a member that names the event started at (None: none has a step)."""
        starts = [m.started_step for m in self.events() if m.started_step is not None]
        return max(starts, default=None)

    def rules(self) -> frozenset[str]:
        return frozenset(m.rule for m in self.members.values())


@dataclass
class IncidentsConfig:
    join_steps: int = 2  # an alert starting this close to an open incident's start joins it
    join_gap: int = 20  # ... one of its topic, if one of its members started this recently
    # a follower of a metric a resolved incident's event named (the loss volatility of a window
    # that still holds its spike) stays inhibited by it this many steps after its event ended
    follow_steps: int = 100
    max_members: int = 20  # members listed in the evidence (the rest are counted)
    max_closed: int = 16  # resolved incidents remembered (to open again)


@dataclass
class IncidentsState:
    open: dict[str, Incident] = field(default_factory=dict)  # by fingerprint
    # alert fingerprint -> its incident and its member's key there, while it fires
    of_alert: dict[str, list[str]] = field(default_factory=dict)
    # resolved in the last ``join_gap`` steps (they may open again), by fingerprint
    closed: dict[str, Incident] = field(default_factory=dict)


def incident_id(run_id: str, topic: str, step: int | None) -> str:
    return hashlib.sha1(f"{run_id}|incident|{topic}|{step}".encode()).hexdigest()[:16]


def _home(state: IncidentsState, cfg: IncidentsConfig, a: Alert) -> tuple[Incident | None, bool]:
    """The incident ``a`` (firing) joins, or None; and whether it joins quietly (one that
    resolved, whose event's follower stays inhibited by it). The one it is already a member
    of (its evidence amended); else, unless ``a`` is a new event (``_new_event``), the run's
    latest of its topic, unless no member that names that one's event started in the
    ``join_gap`` steps before ``a`` (a new event, while the last one's slow members, such as
    a volatility window, still fire; a follower joins it whenever it started); else one that
    resolved in the last ``join_gap`` steps; else one that started within ``join_steps`` of
    it. ``join_gap_of`` widens ``join_gap`` for conditions and aggregates."""
    mine = state.of_alert.get(a.fingerprint)
    if mine is not None and mine[1] == f"{a.fingerprint}@{a.started_step}":
        inc = state.open.get(mine[0])
        if inc is not None:
            return inc, False
        return state.closed.get(mine[0]), True  # a follower left firing when it resolved
    topic = topic_of(a.rule)
    start = a.started_step if a.started_step is not None else a.step
    span = span_of(a)
    # an aggregate's evidence starts at its span's first step
    earliest = start if span is None or start is None else min(start, span)
    same = [i for i in state.open.values() if i.run_id == a.run_id and i.topic == topic]
    if same and not _new_event(same[-1], cfg, a):
        inc = same[-1]
        last = inc.last_start()
        near = (
            earliest is None
            or last is None
            or earliest - last <= join_gap_of(cfg, a.rule, earliest)
        )
        if near or follower(a.rule):  # a follower is never a new event
            return inc, False
    if start is None or earliest is None:
        return None, False
    # one that resolved in the last ``join_gap`` steps opens again (an event whose alerts
    # breach on and off), or keeps a follower of its event quiet; an aggregate whose span
    # covers it adds to it
    for fp, inc in list(state.closed.items()):
        too_old = max(cfg.join_gap, cfg.follow_steps)
        if inc.last_step is None or earliest - inc.last_step > too_old:
            del state.closed[fp]  # too old to open again: forgotten
        elif inc.run_id == a.run_id and inc.topic == topic:
            ended = max((m.step for m in inc.events() if m.step is not None), default=None)
            if follower(a.rule) and _follows(inc, cfg, a, start, ended):
                return inc, True
            if span is not None and _covers(inc, span, ended):
                return inc, True
            gap = join_gap_of(cfg, a.rule, start, span)
            if ended is None or start - ended > gap or _new_event(inc, cfg, a):
                continue  # (its followers, not its event, moved since)
            del state.closed[fp]
            state.open[fp] = inc
            inc.episode += 1
            return inc, False
    for inc in state.open.values():
        near = inc.started_step is not None and abs(start - inc.started_step) <= cfg.join_steps
        if inc.run_id == a.run_id and near and not _new_event(inc, cfg, a):
            return inc, False
    return None, False


def span_of(a: Alert) -> int | None:
    """An aggregate's first step (its window's ``span_first``): it covers its span; None for
    an alert of steps."""
    span = a.evidence.get("span_first")
    return span if isinstance(span, int) and not isinstance(span, bool) else None


def join_gap_of(cfg: IncidentsConfig, rule: str, start: int, span: int | None = None) -> int:
    """Steps after an alert of ``rule`` resolved within which the same breaching again is its
    event going on: ``join_gap`` (a second spike, a second correlation is a new event),
    ``follow_steps`` for a condition (``CONDITIONS``: a straggler or a data wait breaching on
    and off), counted to an aggregate's first step (``span``: its window's; a window that
    starts within them holds the event's last steps, sent before only as a mean)."""
    gap = cfg.join_gap
    if rule.split(":", 1)[0] in CONDITIONS:
        gap = max(gap, cfg.follow_steps)
    return gap if span is None else gap + max(start - span, 0)


def _covers(inc: Incident, span: int, ended: int | None) -> bool:
    """Whether an aggregate from step ``span`` on covers ``inc``'s event (resolved at
    ``ended``): a window that holds the steps of an incident already paged and over is more
    evidence of it, never a second page."""
    end = ended if ended is not None else inc.last_step
    return end is not None and span <= end


def _follows(inc: Incident, cfg: IncidentsConfig, a: Alert, start: int, ended: int | None) -> bool:
    """Whether the follower ``a`` follows ``inc``'s event (resolved): it started within
    ``join_gap`` steps of the incident's last step, or within ``follow_steps`` of its event's
    end on a metric the event named."""
    if all(follower(m.rule) for m in inc.members.values()):
        return False  # an incident of followers only: it opens again
    if inc.last_step is not None and start - inc.last_step <= cfg.join_gap:
        return True
    named = {m.rule.partition(":")[2] for m in inc.events()}
    return (
        ended is not None
        and start - ended <= cfg.follow_steps
        and a.rule.partition(":")[2] in named
    )


def _new_event(inc: Incident, cfg: IncidentsConfig, a: Alert) -> bool:
    """Whether ``a`` (not a follower) is a new event rather than more of ``inc``'s: a member
    of its rule there came back in its band (it peaked), started more than ``join_steps``
    before ``a``, and ``a`` is more than ``join_gap`` steps after that member resolved, or (a
    spike) on another rank, or larger from more than ``join_gap`` steps after that member's
    start (counted from an aggregate's first step): an lr blow-up's loss still climbing a few
    steps on, or a window whose peak is the spike already paged, is the same event growing."""
    start = a.started_step if a.started_step is not None else a.step
    if start is None or follower(a.rule):
        return False
    span = span_of(a)
    first = start if span is None else min(start, span)
    for m in inc.members.values():
        if m.rule != a.rule or m.firing or m.started_step is None:
            continue
        if start - m.started_step <= cfg.join_steps:
            continue
        if m.step is not None and start - m.step > join_gap_of(cfg, a.rule, start, span):
            return True
        if a.rule.split(":", 1)[0] not in SPIKES:
            continue
        if _rank(m.scope, m.evidence) != _rank(a.scope, a.evidence):
            return True
        was, now = m.evidence.get("value"), a.evidence.get("value")
        grew = _number(was) and _number(now) and now > was
        if grew and first - m.started_step > cfg.join_gap:
            return True
    return False


def _rank(scope: str, evidence: Mapping[str, Any]) -> Any:
    return evidence.get("rank", scope)


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def update(
    state: IncidentsState, cfg: IncidentsConfig, alerts: list[Alert], time_ns: int = 0
) -> list[Alert]:
    """Take the rules' alert transitions of one record (or batch row); returns the incidents'
    transitions, as alerts (rule: the lead member's; scope "incident"; evidence: the members,
    at most ``max_members``), each incident at most once. The result does not depend on the
    order of ``alerts``. ``time_ns``: the time of the record these alerts fired on."""
    before = {fp: (inc.severity, inc.lead.rule, inc.rules()) for fp, inc in state.open.items()}
    changed: dict[str, Incident] = {}
    grown: set[str] = set()  # incidents a member of which gained evidence
    firing = sorted(
        (a for a in alerts if a.state == "firing"),
        key=lambda a: (topic_of(a.rule), a.rule, a.scope),
    )
    # a new event's alerts first: it opens its incident, and the rest of the record's joins it
    fresh = [a for a in firing if any(_new_event(i, cfg, a) for i in state.open.values())]
    relabelled: dict[str, Incident] = {}  # resolved incidents a quiet member names better
    for a in fresh + [a for a in firing if a not in fresh]:
        inc, grew = _firing(state, cfg, a, time_ns, relabelled)
        if inc is None:  # a follower kept quiet by an incident that resolved
            continue
        changed[inc.fingerprint] = inc
        if grew:
            grown.add(inc.fingerprint)
    step = max((a.step for a in alerts if a.step is not None), default=None)
    out: list[Alert] = []
    for inc in sorted(changed.values(), key=lambda i: (i.topic, i.fingerprint)):
        was = before.get(inc.fingerprint)
        # new, escalated, a better hint, a new finding, or a member's evidence completed
        if was is None or _news(inc, *was) or inc.fingerprint in grown:
            out.append(_report(inc, cfg, "firing", step, time_ns))
    for inc in relabelled.values():  # no page: the resolved incident, its cause named better
        if inc.fingerprint in state.closed:
            out.append(_report(inc, cfg, "resolved", step, time_ns))
    for a in alerts:
        if a.state != "firing":
            out += _resolved(state, cfg, a, time_ns)
    return out


def update_all(
    state: IncidentsState,
    cfg: IncidentsConfig,
    rows: Iterable[list[Alert]],
    times_ns: Sequence[int],
    *,
    amended: list[Alert] | None = None,
) -> list[Alert]:
    """The incidents' stage of a record: each row's transitions (``update_rows``), then those
    of the alerts its late evidence ``amended`` (at its last row's time)."""
    out = [a for row in update_rows(state, cfg, rows, times_ns) for a in row]
    if amended:
        out += update(state, cfg, amended, times_ns[-1])
    return out


def update_rows(
    state: IncidentsState,
    cfg: IncidentsConfig,
    rows: Iterable[list[Alert]],
    times_ns: Sequence[int],
) -> Iterator[list[Alert]]:
    """``update`` for each row's alert transitions (``rows``), at the row's time (the alerts'
    ``time_ns`` set to it); ``state`` is the state after that row when it is yielded."""
    for alerts, t in zip(rows, times_ns, strict=True):
        if not alerts:
            yield alerts
            continue
        for a in alerts:
            a.time_ns = t
        yield update(state, cfg, alerts, t)


def _firing(
    state: IncidentsState,
    cfg: IncidentsConfig,
    a: Alert,
    time_ns: int,
    relabelled: dict[str, Incident],
) -> tuple[Incident | None, bool]:
    """The incident ``a`` joins (or opens), and whether it adds evidence to a member it
    already is; a member inhibited from now on. None: a follower kept quiet by an incident
    that resolved (a member of it, not reported; ``relabelled`` gets the incident when the
    member is more specific than its lead: a window's straggler over a data wait's steps)."""
    inc, quiet = _home(state, cfg, a)
    member = Member(a.rule, a.scope, a.severity, a.hint, a.started_step, a.step, True, a.evidence)
    if quiet:
        key = f"{a.fingerprint}@{a.started_step}"
        if inc is not None:  # its steps keep the incident's followers quiet
            lead = inc.lead.rule
            inc.members[key] = member
            _seen(inc, a.step)
            if inc.lead.rule != lead:
                relabelled[inc.fingerprint] = inc
        state.of_alert[a.fingerprint] = [inc.fingerprint if inc else "", key]
        return None, False
    if inc is None:
        start = a.started_step if a.started_step is not None else a.step
        fp = incident_id(a.run_id, topic_of(a.rule), start)
        inc = state.open[fp] = Incident(fp, a.run_id, topic_of(a.rule), start, time_ns, INFO)
    key = f"{a.fingerprint}@{a.started_step}"
    again = inc.members.get(key)  # an escalation of a firing member keeps its peak
    if again is not None and RANK.get(again.severity, 0) > RANK.get(member.severity, 0):
        member.severity = again.severity
    grew = again is not None and not again.evidence.keys() >= member.evidence.keys()
    inc.members[key] = member
    state.of_alert[a.fingerprint] = [inc.fingerprint, key]
    # its peak; also a follower's it kept quiet while it was resolved, when it opens again
    for m in (member, *(inc.members.values() if inc.episode else ())):
        if RANK.get(m.severity, 0) > RANK.get(inc.severity, 0):
            inc.severity = m.severity
    _seen(inc, a.step)
    return inc, grew


def _seen(inc: Incident, step: int | None) -> None:
    if step is not None and (inc.last_step is None or step > inc.last_step):
        inc.last_step = step


def _news(inc: Incident, severity: str, lead: str, rules: frozenset[str]) -> bool:
    """Whether ``inc`` says more than it did (``severity``, ``lead`` rule, ``rules``): it
    escalated, its hint improved, or a rule as specific as its lead joined (a straggler in a
    disk-latency incident). A follower of the event (the volatility or forecast excursion a
    spike leaves behind) joins silently: the next report lists it."""
    if RANK[inc.severity] > RANK[severity] or inc.lead.rule != lead:
        return True
    bar = specificity(inc.lead.rule)
    return any(specificity(r) >= bar for r in inc.rules() - rules)


def _resolved(state: IncidentsState, cfg: IncidentsConfig, a: Alert, time_ns: int) -> list[Alert]:
    fp, key = state.of_alert.pop(a.fingerprint, (None, None))
    inc = state.open.get(fp) if fp else None
    if inc is None:  # a follower an incident that resolved kept quiet
        gone = state.closed.get(fp) if fp else None
        member = gone.members.get(key) if gone is not None and key else None
        if member is not None and gone is not None:
            member.firing, member.step = False, a.step
            _seen(gone, a.step)
        return []
    member = inc.members.get(key) if key else None
    if member is not None:
        member.firing = False
        member.step = a.step
    _seen(inc, a.step)
    if inc.firing():
        return []
    del state.open[inc.fingerprint]
    state.closed[inc.fingerprint] = inc
    while len(state.closed) > cfg.max_closed:
        del state.closed[next(iter(state.closed))]
    return [_report(inc, cfg, "resolved", a.step, time_ns)]


def _report(inc: Incident, cfg: IncidentsConfig, st: str, step: int | None, time_ns: int) -> Alert:
    lead = inc.lead
    members = [
        {
            "rule": m.rule,
            "scope": m.scope,
            "severity": m.severity,
            "started_step": m.started_step,
            "step": m.step,
            "firing": m.firing,
            **m.evidence,
        }
        for m in list(inc.members.values())[: cfg.max_members]
    ]
    rules = ", ".join(dict.fromkeys(m.rule for m in inc.members.values()))
    verb = "resolved" if st == "resolved" else "since"
    return Alert(
        lead.rule,
        inc.severity,
        st,
        "incident",
        lead.hint,
        inc.fingerprint,
        inc.run_id,
        step,
        inc.started_step,
        f"{inc.topic} incident {verb} step {inc.started_step if st != 'resolved' else step}: "
        f"{rules}",
        {
            "topic": inc.topic,
            "members": members,
            "member_count": len(inc.members),
            "episode": inc.episode,
            **({"remedies": _remedies(inc)} if inc.remedies else {}),
        },
        time_ns,
    )


def _remedies(inc: Incident) -> list[dict[str, Any]]:
    """The evidence's copy of the incident's remedies (without the ranks that answered)."""
    return [
        {
            **{k: v for k, v in r.items() if k not in ("answers", "answered")},
            "answers": [
                {**g, "ranks": list(g["ranks"]), "details": list(g["details"])}
                for g in r["answers"]
            ],
        }
        for r in inc.remedies
    ]


def _of(state: IncidentsState, fingerprint: str) -> tuple[Incident | None, str]:
    """The incident of ``fingerprint`` and its state, while it is open or remembered."""
    if fingerprint in state.open:
        return state.open[fingerprint], "firing"
    return state.closed.get(fingerprint), "resolved"


def note_advice(
    state: IncidentsState,
    data: dict[str, Any],
    rank: int,
    step: int | None,
    held: str | None = None,
) -> bool:
    """Advice given for an incident (an ``advice`` payload, for ``rank`` at ``step``), or only
    suggested (``held``: why it was not sent); whether the incident was found. Its next report
    carries it (``with_remedies`` for this one)."""
    inc, _ = _of(state, str(data.get("fingerprint")))
    action = data.get("action")
    if inc is None or any(r["action"] == action for r in inc.remedies):
        return inc is not None
    entry: dict[str, Any] = {"action": action, "rank": rank, "step": step}
    if held is not None:
        entry["held"] = held
    entry.update((k, data[k]) for k in ADVICE_FIELDS if data.get(k) is not None)
    samples = data.get("sample_ids") or data.get("sample_hashes")
    if samples:
        entry["n_samples"] = len(samples)
    inc.remedies.append({**entry, "answers": [], "answered": []})
    return True


def with_remedies(state: IncidentsState, alerts: list[Alert]) -> list[Alert]:
    """``alerts`` with the incidents' reports carrying their remedies as they are now."""
    out = []
    for a in alerts:
        inc, _ = _of(state, a.fingerprint) if a.scope == "incident" else (None, "")
        if inc is not None and inc.remedies:
            out.append(replace(a, evidence={**a.evidence, "remedies": _remedies(inc)}))
        else:
            out.append(a)
    return out


def report_again(
    state: IncidentsState, cfg: IncidentsConfig, fingerprint: str, step: int | None, time_ns: int
) -> Alert | None:
    """The incident of ``fingerprint`` reported again in its state (at ``step`` while it fires),
    with its remedies as they are now: advice decided on steps after its last report."""
    inc, st = _of(state, fingerprint)
    if inc is None:
        return None
    return _report(inc, cfg, st, step if st == "firing" else inc.last_step, time_ns)


def answered(
    state: IncidentsState,
    cfg: IncidentsConfig,
    fingerprint: str,
    action: str,
    answer: dict[str, Any],
    *,
    world_size: int,
    time_ns: int,
) -> list[Alert]:
    """A rank's answer (``rank``, ``outcome``, ``detail``, ``step``) to the incident's advice
    ``action`` (for one rank, or every rank of ``world_size``). Returns the incident's report
    again when the answer is news (a new outcome, or the last rank's), else nothing."""
    inc, st = _of(state, fingerprint)
    entry = next((r for r in inc.remedies if r["action"] == action), None) if inc else None
    rank = answer.get("rank")
    if inc is None or entry is None or rank in entry["answered"]:
        return []
    if len(entry["answered"]) < MAX_ANSWERED:
        entry["answered"].append(rank)
    outcome = str(answer.get("outcome"))
    group = next((g for g in entry["answers"] if g["outcome"] == outcome), None)
    news = group is None
    if group is None:
        group = {"outcome": outcome, "n": 0, "ranks": [], "details": []}
        entry["answers"].append(group)
    group["n"] += 1
    if len(group["ranks"]) < MAX_RANKS:
        group["ranks"].append(rank)
    detail = str(answer.get("detail") or "")[:DETAIL_CHARS]
    if detail and len(group["details"]) < MAX_DETAILS and detail not in group["details"]:
        group["details"].append(detail)
    expected = 1 if entry["rank"] is not None and entry["rank"] >= 0 else world_size
    if not news and sum(g["n"] for g in entry["answers"]) != expected:
        return []
    step = answer.get("step") if st == "firing" else inc.last_step
    return [_report(inc, cfg, st, step, time_ns)]
