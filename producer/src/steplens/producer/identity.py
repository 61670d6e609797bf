"""Who is logging: rank, local rank, world size and host of this process."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    run_id: str
    rank: int
    local_rank: int
    world_size: int
    host: str


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def detect(run_id: str | None) -> Identity:
    """From ``torch.distributed`` when it is initialised (torch is never imported here),
    else from torchrun's ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``, else a single process."""
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        except Exception:  # an odd torch build must not stop init
            pass
    host = socket.gethostname() or "localhost"
    return Identity(run_id or new_run_id(), max(rank, 0), max(local_rank, 0), max(world, 1), host)


def new_run_id() -> str:
    """A readable, unique run id: UTC time plus 6 random hex digits."""
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
