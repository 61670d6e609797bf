"""The key a run's detector holds: the run id, or for a shard of a wide run past its first the
run id, ``SEP`` and the shard's number (``worker/run_shards.py`` cuts a run into shards). What
a detector publishes names the run (``run_of``); a shard past the first pages nothing that is
the whole run's (``shard``: a hang of every rank is paged by shard 0, whose ranks stop too)."""

from __future__ import annotations

SEP = "\x1e"  # between a run id and its shard (a run id is printable)


def shard_key(run: str, shard: int) -> str:
    return run if shard == 0 else f"{run}{SEP}{shard}"


def split_key(key: str) -> tuple[str, int]:
    """A by-run key's run id and shard."""
    run, sep, shard = key.rpartition(SEP)
    if sep and run and shard.isdigit():
        return run, int(shard)
    return key, 0


def run_of(key: str) -> str:
    """The run id a by-run key names."""
    return split_key(key)[0]


def shard(key: str) -> int:
    """The shard a by-run key holds (0: the run's first, or a run that is not split)."""
    return split_key(key)[1]
