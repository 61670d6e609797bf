"""What the notifier outputs (webhook, Alertmanager) share: one JSON POST with its answer
classified, a bounded memory of the transitions posted, and an alert record's fields.

A POST is one attempt: 2xx is delivered; a connection error, a timeout, 429 or 5xx is worth
another attempt (the consumer loop makes it); any other answer refuses the alerts for good
(they become dead letters with the answer as the reason).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import urllib3

from steplens.schema import Record

log = logging.getLogger("steplens.sinks.notify")


@dataclass(frozen=True)
class Answer:
    """What a POST came to: ``ok``; else ``retry`` (worth another attempt) or refused."""

    ok: bool
    retry: bool = False
    reason: str = ""


Post = Callable[[str, Any, dict[str, str]], Answer]  # url, JSON body, headers -> answer


class JsonPoster:
    """POSTs JSON over one connection pool (thread-safe), one attempt per call."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self._http = urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout_s), retries=False)

    def __call__(self, url: str, body: Any, headers: dict[str, str]) -> Answer:
        data = json.dumps(body).encode()
        try:
            resp = self._http.request(
                "POST", url, body=data, headers={"Content-Type": "application/json", **headers}
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Answer(False, retry=True, reason=f"{type(exc).__name__}: {exc}"[:300])
        if resp.status < 300:
            return Answer(True)
        reason = f"HTTP {resp.status}: {resp.data[:300].decode('utf-8', 'replace')}"
        return Answer(False, retry=resp.status >= 500 or resp.status == 429, reason=reason)


class Remembered:
    """The last ``limit`` keys seen (oldest forgotten first)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: Hashable) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self.limit:
            self._keys.popitem(last=False)


def alert_of(rec: Record) -> dict[str, Any]:
    """An alert record's transition: the worker's fields, each present (None when absent)."""
    d = rec.data
    evidence = d.get("evidence")
    return {
        "rule": d["rule"],
        "severity": d["severity"],
        "state": d["state"],
        "scope": d["scope"],
        "hint": d["hint"],
        "fingerprint": d["fingerprint"],
        "run_id": rec.run_id,
        "step": rec.step,
        "started_step": d.get("started_step"),
        "summary": d.get("summary") or "",
        "evidence": evidence if isinstance(evidence, dict) else {},
        "time_ns": rec.time_ns,
    }
