"""The stacks of a stuck rank: a rank that stopped stepping sends its Python stacks (``stacks``
records); each rank's last is kept (bounded text) and its hang alert carries it.

The stacks are those of the current stall: a record whose ``last_step`` is older than the
rank's last step (it stepped again since) is not named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RULES = frozenset({"hang:progress"})


@dataclass
class StacksConfig:
    max_threads: int = 8
    max_chars: int = 3000  # of all threads' stacks; each keeps its end (the innermost frames)


@dataclass
class StacksState:
    last: dict[str, Any] | None = None  # {"stalled_s", "last_step", "threads": [...]}


def keep(state: StacksState, cfg: StacksConfig, step: int | None, data: dict[str, Any]) -> None:
    """One ``stacks`` record, its threads cut to the budget."""
    threads = [t for t in data.get("threads") or [] if isinstance(t, dict)][: cfg.max_threads]
    each = cfg.max_chars // max(len(threads), 1)
    kept = [
        {
            "name": str(t.get("name", ""))[:100],
            "id": t.get("id"),
            "stack": str(t.get("stack", ""))[-each:],
        }
        for t in threads
    ]
    state.last = {
        "stalled_s": data.get("stalled_s"),
        "last_step": data.get("last_step"),
        "threads": kept,
        "threads_sent": len(data.get("threads") or []),
    }


def names(
    state: StacksState, cfg: StacksConfig, rule: str, step: int | None, detail: dict[str, Any]
) -> dict[str, Any] | None:
    """``{"stacks": ...}`` for a hang of this rank, when its stacks are of this stall."""
    got = state.last
    if rule not in RULES or got is None:
        return None
    mine, seen = got.get("last_step"), detail.get("last_step")
    if isinstance(mine, int) and isinstance(seen, int) and mine < seen:
        return None  # stacks of an earlier stall
    return {"stacks": got}
