"""Helpers for the notifier outputs' tests: alert records as the worker publishes them, and a
local HTTP server that records what is posted and answers with the statuses it is given."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from steplens.schema import RUN_RANK, Record, make_record

T0 = 1_700_000_000.0


def member(rule: str, severity: str, started: int, step: int, firing: bool) -> dict[str, Any]:
    return {"rule": rule, "scope": "run", "severity": severity, "started_step": started,
            "step": step, "firing": firing}  # fmt: skip


def alert_record(
    run: str,
    fingerprint: str,
    rule: str,
    severity: str,
    state: str,
    step: int,
    members: list[dict[str, Any]],
    started: int = 100,
    episode: int = 0,
    t0: float = T0,
) -> Record:
    """An incident transition as ``steplens worker`` writes it to the alert topic."""
    rules = ", ".join(m["rule"] for m in members)
    return make_record(
        "alert",
        {
            "rule": rule,
            "severity": severity,
            "state": state,
            "scope": "incident",
            "hint": f"hint of {rule}",
            "summary": f"training incident {state} step {step}: {rules}",
            "fingerprint": fingerprint,
            "started_step": started,
            "evidence": {"topic": "training", "members": members, "episode": episode},
        },
        run_id=run,
        rank=RUN_RANK,
        step=step,
        time_ns=int((t0 + step) * 1e9),
    )


def incident_story(run: str, t0: float = T0) -> list[Record]:
    """A loss spike opens an incident (warning), a gradient spike joins it and leads it
    (critical: it escalates), both resolve."""
    fp = f"{run}-incident"
    loss = member("spike:loss", "warning", 100, 100, True)
    grad = member("spike:grad_norm", "critical", 101, 101, True)
    ended = [member("spike:loss", "warning", 100, 110, False),
             member("spike:grad_norm", "critical", 101, 112, False)]  # fmt: skip
    return [
        alert_record(run, fp, "spike:loss", "warning", "firing", 100, [loss], t0=t0),
        alert_record(run, fp, "spike:grad_norm", "critical", "firing", 101, [loss, grad], t0=t0),
        alert_record(run, fp, "spike:grad_norm", "critical", "resolved", 112, ended, t0=t0),
    ]


class HookServer:
    """Records each POST (path, headers, JSON body); answers with ``statuses`` in turn, then
    200."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.posts: list[tuple[str, dict[str, str], Any]] = []
        self.statuses = list(statuses or [])
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with hook._lock:
                    hook.posts.append((self.path, dict(self.headers), body))
                    status = hook.statuses.pop(0) if hook.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no")

            def log_message(self, *_: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [body for _, _, body in self.posts]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
