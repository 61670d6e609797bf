"""The Alertmanager output (`steplens sink alertmanager`): incidents of the alert topic into
Alertmanager (``POST /api/v2/alerts``).

An incident transition becomes an Alertmanager alert with the labels ``alertname`` and
``rule`` (both the rule of its lead member when it opened: an incident keeps its name),
``run_id``, ``severity``, ``fingerprint`` (the incident's id) and ``topic``, and the
annotations ``summary``, ``hint``, ``lead_rule`` (the lead member's rule now), ``members``,
``started_step``, ``step`` and ``advice`` (the advice the stream jobs gave for it and the
ranks' answers so far, one line each: the worker reports the incident again when an answer is
news); its ``startsAt`` is the time of the record it fired on.
Alertmanager identifies an alert by its labels and keeps a firing one until its ``endsAt``:

* a firing incident is posted with ``endsAt`` ``hold_s`` ahead (4 resends) and posted again
  every ``resend_s`` while it fires, as Prometheus does; so if this output stops, Alertmanager
  resolves it ``hold_s`` later by itself (the open incidents are in this process's memory);
* a resolved incident is posted with ``endsAt`` = the time of the record it resolved on;
* an incident that escalates changes its ``severity`` label, so the alert of its previous
  labels is resolved in the same post (else it would linger until its ``endsAt``); a better
  hint (a new lead member) only updates the annotations.

A transition already posted (the same fingerprint, state, severity, lead rule and advice: an
incident scored again after a worker restart) is not posted again (the last ``remember`` are
remembered); a repeat is harmless anyway, since Alertmanager merges alerts of the same labels.
An export posts what its batch changed, each alert (label set) once in its latest state (counted
``superseded``): Alertmanager takes in the alerts of one request on parallel workers, and an
alert posted firing and ended in one request was seen to stay firing in its group; at most
``MAX_BATCH`` alerts a request. The open incidents and the memory change only once every post
of a batch was answered, so a batch exported again (Alertmanager unreachable, 5xx, 429) posts
the same alerts again; a refused request (another 4xx) dead-letters the records it carried.
Resends run on a timer thread and are not retried (the next resend is). At most ``max_open``
firing incidents are kept for resends (the oldest go first, counted ``evicted``).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from steplens.schema import Record
from steplens.sinks import metrics
from steplens.sinks.contract import ExportResult, Rejection
from steplens.sinks.notify import JsonPoster, Post, Remembered, alert_of
from steplens.sinks.periodic import Every
from steplens.sinks.remedies import advice_text

MAX_BATCH = 100  # alerts in one POST
MAX_ANNOTATION = 2000  # characters of one annotation

# fingerprint, state, severity, rule, a digest of the advice annotation
Transition = tuple[str, str, str, str, str]


def rfc3339(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).isoformat(timespec="milliseconds")


def labels_of(alert: dict[str, Any]) -> dict[str, str]:
    topic = alert["evidence"].get("topic")
    labels = {
        "alertname": alert["rule"],
        "rule": alert["rule"],
        "run_id": alert["run_id"],
        "severity": alert["severity"],
        "fingerprint": alert["fingerprint"],
    }
    if topic:
        labels["topic"] = str(topic)
    return labels


def annotations_of(alert: dict[str, Any]) -> dict[str, str]:
    members = alert["evidence"].get("members")
    rules = [f"{m.get('rule')} ({m.get('scope')})" for m in members or [] if isinstance(m, dict)]
    out = {
        "summary": alert["summary"],
        "hint": alert["hint"],
        "lead_rule": alert["rule"],
        "members": ", ".join(rules),
        "started_step": "" if alert["started_step"] is None else str(alert["started_step"]),
        "step": "" if alert["step"] is None else str(alert["step"]),
        "advice": advice_text(alert["evidence"]),
    }
    return {k: v[:MAX_ANNOTATION] for k, v in out.items() if v}


@dataclass
class Posted:
    """An alert as Alertmanager has it: ``ends_s`` None = firing (``hold_s`` from the post)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_s: float
    ends_s: float | None = None

    def body(self, now_s: float, hold_s: float) -> dict[str, Any]:
        ends = self.ends_s if self.ends_s is not None else now_s + hold_s
        return {
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": rfc3339(self.starts_s),
            "endsAt": rfc3339(max(ends, self.starts_s)),
        }


@dataclass
class Plan:
    """What a batch changes: the posts (each with the batch index of its record), the open
    incidents it opens (a ``Posted``) or ends (None), and the transitions it posts."""

    posts: list[tuple[int, Posted]]
    opened: dict[str, Posted | None]
    transitions: list[Transition]
    repeated: int = 0


class AlertmanagerOutput:
    name = "alertmanager"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        remember: int = 10_000,
        resend_s: float = 60.0,
        max_open: int = 10_000,
        post: Post | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.post = post or JsonPoster(timeout_s)
        self.resend_s = resend_s
        self.hold_s = 4 * resend_s
        self.max_open = max_open
        self.seen = Remembered(remember)
        self.open: OrderedDict[str, Posted] = OrderedDict()  # firing incidents by fingerprint
        self.counts = dict.fromkeys(
            ("sent", "refused", "repeated", "evicted", "superseded", "resent", "resend_failed"), 0
        )
        # one post at a time: a resend of a firing alert must not overtake its resolution
        self._lock = threading.Lock()
        self._resends = Every(resend_s, self.resend, "alertmanager-resend")

    # ------------------------------------------------------------------ the batch
    def plan(self, batch: list[Record]) -> Plan:
        """The posts of ``batch``'s transitions (pure: nothing changes until ``apply``)."""
        plan = Plan([], {}, [])
        for i, rec in enumerate(batch):
            if rec.kind != "alert":
                continue
            alert = alert_of(rec)
            key = (
                alert["fingerprint"],
                alert["state"],
                alert["severity"],
                alert["rule"],
                hashlib.blake2b(advice_text(alert["evidence"]).encode(), digest_size=8).hexdigest(),
            )
            if key in self.seen or key in plan.transitions:
                plan.repeated += 1
                continue
            plan.transitions.append(key)
            at = alert["time_ns"] / 1e9 if alert["time_ns"] else time.time()
            now = Posted(labels_of(alert), annotations_of(alert), at)
            fp = alert["fingerprint"]
            before = plan.opened[fp] if fp in plan.opened else self.open.get(fp)
            if before is not None:
                now.starts_s = before.starts_s
                now.labels["alertname"] = now.labels["rule"] = before.labels["rule"]
                if before.labels != now.labels:  # escalated: end the alert of the old labels
                    plan.posts.append((i, replace(before, ends_s=at)))
            if alert["state"] == "resolved":
                now.ends_s = at
                plan.opened[fp] = None
            else:
                plan.opened[fp] = now
            plan.posts.append((i, now))
        return plan

    def export(self, batch: list[Record]) -> ExportResult:
        try:
            with self._lock:
                return self._export(batch)
        except Exception as exc:  # the contract: export never raises
            return ExportResult.retry(f"{type(exc).__name__}: {exc}")

    def _export(self, batch: list[Record]) -> ExportResult:
        plan = self.plan(batch)
        latest = {tuple(sorted(p.labels.items())): (i, p) for i, p in plan.posts}
        posts = list(latest.values())
        rejected: dict[int, str] = {}
        sent = 0
        for start in range(0, len(posts), MAX_BATCH):
            chunk = posts[start : start + MAX_BATCH]
            now = time.time()
            answer = self.post(self.url, [p.body(now, self.hold_s) for _, p in chunk], {})
            if answer.ok:
                sent += len(chunk)
            elif answer.retry:
                return ExportResult.retry(answer.reason)
            else:
                rejected.update((i, f"refused by Alertmanager: {answer.reason}") for i, _ in chunk)
        self._apply(plan)
        self._count("sent", sent)
        self._count("refused", sum(1 for i, _ in posts if i in rejected))
        self._count("superseded", len(plan.posts) - len(posts))
        self._count("repeated", plan.repeated)
        alerts = sum(1 for rec in batch if rec.kind == "alert")
        return ExportResult(
            accepted=alerts - plan.repeated - len(rejected),
            rejected=[Rejection(i, why) for i, why in sorted(rejected.items())],
            skipped=len(batch) - alerts + plan.repeated,
        )

    def _apply(self, plan: Plan) -> None:
        for key in plan.transitions:
            self.seen.add(key)
        for fp, posted in plan.opened.items():
            self.open.pop(fp, None)
            if posted is not None:
                self.open[fp] = posted
        while len(self.open) > self.max_open:
            self.open.popitem(last=False)  # Alertmanager ends it after hold_s
            self._count("evicted")

    # ------------------------------------------------------------------ resends
    def resend(self) -> None:
        """The firing incidents again, before Alertmanager's ``endsAt`` for them passes."""
        with self._lock:
            firing = list(self.open.values())
            for start in range(0, len(firing), MAX_BATCH):
                now = time.time()
                chunk = [p.body(now, self.hold_s) for p in firing[start : start + MAX_BATCH]]
                answer = self.post(self.url, chunk, {})
                self._count("resent" if answer.ok else "resend_failed", len(chunk))

    def _count(self, outcome: str, n: int = 1) -> None:
        if n:
            self.counts[outcome] += n
            metrics.NOTIFICATIONS.labels(self.name, outcome).inc(n)

    def shutdown(self) -> None:
        self._resends.stop()
