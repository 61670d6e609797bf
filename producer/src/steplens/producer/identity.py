"""Who is logging: rank, local rank, world size and host of this process."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass

log = logging.getLogger("steplens")

# a wide run's ranks send their periodic records (windows, health, hardware heartbeats) in up
# to MAX_PHASES phases of at least PHASE_RANKS ranks each
PHASE_RANKS = 256
MAX_PHASES = 16
GOLDEN = (5**0.5 - 1) / 2  # rank * GOLDEN spreads any ranks, a node's first ones too, evenly


@dataclass(frozen=True)
class Identity:
    run_id: str
    rank: int
    local_rank: int
    world_size: int
    host: str

    @property
    def phase(self) -> float:
        """Where in each of its periods (0 <= phase < 1) this rank's periodic records fall.

        The ranks of a run step together, so their windows, health and hardware heartbeats
        all fell due at the same step: 16,384 ranks sent 16,384 windows at once every 10 s,
        a burst the stream jobs took seconds to drain while the seconds between sat idle,
        and an alert behind it waited. A run of ``2 * PHASE_RANKS`` ranks or more spreads
        them by rank over up to ``MAX_PHASES`` phases; each phase keeps about ``PHASE_RANKS``
        ranks or more, whose windows end at the same step to be compared with each other. A
        smaller run keeps one phase (0)."""
        phases = min(MAX_PHASES, self.world_size // PHASE_RANKS)
        if phases <= 1:
            return 0.0
        return int(self.rank * GOLDEN % 1.0 * phases) / phases


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


def run_id_from_env() -> str | None:
    """STEPLENS_RUN_ID, else torchrun's TORCHELASTIC_RUN_ID (shared by all ranks)."""
    value = os.environ.get("STEPLENS_RUN_ID", "")
    if value:
        return value
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return elastic if elastic and elastic != "none" else None


def resolve_identity(
    run_id: str | None, rank: int | None, local_rank: int | None, world_size: int | None
) -> Identity:
    """This process's identity: what is given, else what torchrun and the host say."""
    ident = detect(run_id or run_id_from_env())
    out = Identity(
        ident.run_id,
        ident.rank if rank is None else rank,
        ident.local_rank if local_rank is None else local_rank,
        ident.world_size if world_size is None else world_size,
        ident.host,
    )
    if run_id is None and run_id_from_env() is None and out.world_size > 1:
        log.warning(
            "steplens: no run id given (run_id= or STEPLENS_RUN_ID); this rank uses %s",
            out.run_id,
        )
    return out
