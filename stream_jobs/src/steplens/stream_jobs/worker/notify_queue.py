"""What the notifiers (webhook, Alertmanager) share: a bounded memory of what was sent, and a
bounded queue that never makes the worker wait."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any


def first_time(seen: OrderedDict[Any, None], key: Any, remember: int) -> bool:
    """Remember ``key`` (the last ``remember`` keys); False when it was remembered already."""
    if key in seen:
        return False
    seen[key] = None
    if len(seen) > remember:
        seen.popitem(last=False)
    return True


def put_dropping_oldest(queue: asyncio.Queue[Any], item: Any) -> bool:
    """Queue ``item`` without waiting; True when the oldest item was dropped for it (and
    marked done, so that ``queue.join`` still returns)."""
    dropped = queue.full()
    if dropped:
        queue.get_nowait()
        queue.task_done()
    queue.put_nowait(item)
    return dropped
