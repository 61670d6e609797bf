"""The worker's runs: loaded from the table (or warmed from their history when the table has
none), checkpointed to it, their messages acknowledged.

A by-run message is acknowledged only once a checkpoint of its run holds it, so a worker killed
between checkpoints leaves those messages to be scored again, not lost (a run's ``offsets``
skip what its stored state already applied). Checkpoints go to the table (changelog-backed: a
restarted or newly joined worker resumes the run); a run's head and each changed rank's series
are values of their own (``RunDetector.dump``). A run the table does not have is warmed from its
history when the worker has the stores (the ``History`` it is given: ``history_loads``); its
messages wait for that, in order.

A rebalance keeps in memory the runs whose by-run partition stays with the worker: their state
is ahead of the table, and the messages Faust delivers again from the committed offset are
skipped by the raw offsets that state applied, so they are neither scored twice nor scored onto
an older state. A run whose partition moved is dropped; its new owner restores it from the table
and skips by the offsets stored with it. A message whose scoring a rebalance interrupted
(``generation`` changed) is neither held nor acknowledged: its run's owner scores it again.
How many runs it keeps, and when an idle one is retired: ``run_limits``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

from steplens.schema.log_limit import LimitedLog
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals.arima_fit import ArimaParams
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.engine.state import RANK_SEP, rank_key
from steplens.stream_jobs.worker.compat import NUDGE
from steplens.stream_jobs.worker.run_limits import RunLimits
from steplens.stream_jobs.worker.settings import LimitSettings

log = logging.getLogger("steplens.stream_jobs")

# A table value reaches the changelog as one Kafka message (1 MB at most by default). A run's
# head holds its run-wide states, which grow with its GPUs (about 8 KB a rank): past
# ``MAX_VALUE`` bytes it is stored in parts, in the slot its previous parts are not in, and the
# run's key holds ``PARTS``, the slot and the count (a checkpoint cut before that value leaves
# the previous head whole).
MAX_VALUE = 512 << 10
PARTS = b"SLpt"
# A run's checkpoint costs about 4 KB and a quarter of a millisecond per rank it writes: 4 s
# for a run of 16,384 ranks, most of ``checkpoint_s``. A checkpoint that took ``SLOW_CHECKPOINT_S``
# or more makes its run's next one wait ``CHECKPOINT_SPACING`` times as long as it took (if
# that is longer than ``checkpoint_s``): a run's checkpoints take at most about a fortieth of
# the loop, and a crash scores again at most that many seconds of its messages (a shard of
# 2,048 ranks: about 0.4 s a checkpoint, one every 16 s; at ten times, one every 5 s, they
# were a fifth of a 16,384-rank worker's time, bench/RESULTS.md).
CHECKPOINT_SPACING = 40.0
SLOW_CHECKPOINT_S = 0.1


def part_key(run: str, slot: int, i: int) -> bytes:
    return f"{run}{RANK_SEP}head:{slot}:{i}".encode()


def parts_of(value: bytes | None) -> tuple[int, int] | None:
    """The slot and count a run's key names when its head is stored in parts."""
    if value is None or not value.startswith(PARTS) or len(value) != len(PARTS) + 5:
        return None
    return value[len(PARTS)], int.from_bytes(value[len(PARTS) + 1 :], "big")


class Load(Protocol):
    done: bool


class History(Protocol):
    """The history loads a store is given (``history_loads.HistoryLoads``)."""

    loads: dict[str, Any]

    def waiting(self, run: str) -> Load | None: ...

    def begin(self, run: str, event: Any) -> Load | None: ...

    def hold(self, load: Any, event: Any) -> None: ...

    def finish(self, run: str, det: RunDetector | None) -> tuple[RunDetector, list[Any]]: ...

    def reseed(self, det: RunDetector, rank: int, step: int, until_ns: int) -> bool: ...

    def revoked(self) -> None: ...


class RunStore:
    def __init__(
        self,
        table: MutableMapping[bytes, Any],
        cfg: DetectorConfig,
        checkpoint_s: float,
        history: History | None = None,
        limits: RunLimits | None = None,
        *,
        count_restore: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.table = table
        self.cfg = cfg
        self.checkpoint_s = checkpoint_s
        self.history = history  # None: runs the table does not have start cold
        self.cache: dict[str, RunDetector] = {}
        # run -> when its last checkpoint ended, and how long it took
        self.saved: dict[str, tuple[float, float]] = {}
        self.partition_of: dict[str, int] = {}  # run -> its by-run partition
        self.generation = 0  # rebalances begun; the detect agent compares it around a message
        # by-run partition -> run -> its messages scored since its last checkpoint
        self.held: dict[int, dict[str, list[Any]]] = {}
        self.limits = limits or RunLimits(LimitSettings(), table.keys)
        self.count_restore = count_restore  # "restored", or "unreadable" (starts afresh)
        self._restores = LimitedLog(log)  # a rebalance may move thousands: a line a minute

    def admit(self, run: str, event: Any) -> bool:
        """Whether ``event`` (a by-run message of ``run``) goes on to be scored; False: it is
        acknowledged as it is (a run past ``max_runs``, or the nudge that retires an idle
        run)."""
        if event.value != NUDGE:
            return self.limits.admits(run)  # a run in memory is one it keeps
        kept, busy = run in self.limits.known, self.busy(run)
        if kept and not busy and self.limits.idle(run):  # a nudge retires an idle run
            self._retire(run)
            return False
        return kept or busy

    def busy(self, run: str) -> bool:
        """``run`` holds messages for its next checkpoint, or its history is loading."""
        h = self.history
        return any(run in held for held in self.held.values()) or (
            h is not None and h.waiting(run) is not None
        )

    def _retire(self, run: str) -> None:
        det = self.cache.pop(run, None)
        head = self._head(run)
        ranks = list(det.series) if det is not None else RunDetector.stored_ranks(head)
        self._drop_parts(run, 0)
        self._drop_parts(run, 1)
        for key in [*(rank_key(run, r, slot) for r in ranks for slot in (0, 1)), run]:
            if key.encode() in self.table:
                del self.table[key.encode()]
        self.saved.pop(run, None)
        self.partition_of.pop(run, None)
        self.limits.retired(run)

    def idle_runs(self) -> list[str]:
        """Runs to send a retirement nudge (``run_limits``)."""
        return self.limits.idle_runs(self.busy)

    def ready(self, run: str, event: Any) -> list[Any]:
        """``run``'s messages to score now, in order, with ``event`` last (its detector is
        ``cache[run]``); none while a history load holds the run (``event`` waits with it)."""
        h = self.history
        if run in self.cache and (h is None or not h.loads):  # the common case
            return [event]
        tail = [event]
        load = h.waiting(run) if h is not None else None
        if load is None and run not in self.cache:
            det = self._restored(run)
            if det is None and h is not None:
                load = h.begin(run, event)
                tail = [] if load is not None else tail
            if load is None:
                self.cache[run] = det or RunDetector(run, self.cfg, fit_inline=False)
        elif load is not None and not load.done:
            h.hold(load, event)  # type: ignore[union-attr]
            tail = []
        if load is None:
            return tail
        if not load.done:
            return []
        self.cache[run], held = h.finish(run, self.cache.get(run))  # type: ignore[union-attr]
        return [*held, *tail]

    def _head(self, run: str) -> bytes | None:
        """``run``'s stored head, joined from its parts where it has them (None: none, or a
        part is missing)."""
        value = self.table.get(run.encode())
        got = parts_of(value)
        if got is None:
            return value
        slot, n = got
        parts = [self.table.get(part_key(run, slot, i)) for i in range(n)]
        if any(p is None for p in parts):
            log.warning("run %s: a part of its stored head is missing; it starts afresh", run)
            return None
        return b"".join(parts)  # type: ignore[arg-type]

    def _put_head(self, run: str, head: bytes) -> None:
        """Write ``run``'s head: as it is, or in parts in the slot the stored one is not in;
        then the parts no stored head names are cleared."""
        key = run.encode()
        before = parts_of(self.table.get(key))
        if len(head) <= MAX_VALUE:
            self.table[key] = head
            slot = None
        else:
            slot = 1 - before[0] if before is not None else 0
            n = 0
            for i in range(0, len(head), MAX_VALUE):
                self.table[part_key(run, slot, n)] = head[i : i + MAX_VALUE]
                n += 1
            self._drop_parts(run, slot, n)  # a longer head's earlier parts in this slot
            self.table[key] = PARTS + bytes([slot]) + n.to_bytes(4, "big")
        if before is not None and before[0] != slot:
            self._drop_parts(run, before[0])

    def _drop_parts(self, run: str, slot: int, start: int = 0) -> None:
        i = start
        while (key := part_key(run, slot, i)) in self.table:
            del self.table[key]
            i += 1

    def _restored(self, run: str) -> RunDetector | None:
        blob = self._head(run)
        if not blob:
            return None
        det = RunDetector.load(
            blob, lambda r, slot: self.table.get(rank_key(run, r, slot).encode()), self.cfg
        )
        if det is None:  # RunDetector.load said why
            self.count_restore("unreadable")
            return None
        det.touched.update(det.series)
        det.resume_fits()
        self.count_restore("restored")
        self._restores.warning(
            "restored",
            "run %s restored from the runs table: %d ranks, %d records applied",
            run,
            len(det.series),
            det.records,
        )
        return det

    def restart(self, det: RunDetector, rank: int, step: int, until_ns: int) -> bool:
        """A rank of ``det`` resumes at ``step`` (its steps went back): True when it is
        re-seeded now (or the detector starts it afresh itself: no history); False when a
        history load begins, for which the run's messages from this one on must wait
        (``wait``)."""
        if self.history is None:
            return True
        return self.history.reseed(det, rank, step, until_ns)

    def wait(self, run: str, events: list[Any]) -> None:
        """``events`` (the run's, in order) wait for its history load before anything held."""
        h = self.history
        load = h.waiting(run) if h is not None else None
        assert h is not None and load is not None
        for event in events:
            h.hold(load, event)

    def hold(self, partition: int, run: str, event: Any) -> list[tuple[str, list[Any]]]:
        """Hold ``event`` (a message of ``run`` on by-run ``partition``) until a checkpoint;
        returns the runs of that partition that are due one, each with its held messages (to
        be checkpointed now: table writes go to the changelog partition of the message being
        processed, theirs too)."""
        held = self.held.setdefault(partition, {})
        held.setdefault(run, []).append(event)
        self.partition_of[run] = partition
        now = time.monotonic()
        due = [r for r in held if self._due(r, now)]
        return [(r, held.pop(r)) for r in due]

    def _due(self, run: str, now: float) -> bool:
        ended, took = self.saved.get(run, (-math.inf, 0.0))
        spaced = CHECKPOINT_SPACING * took if took >= SLOW_CHECKPOINT_S else 0.0
        return now - ended >= max(self.checkpoint_s, spaced)

    def checkpoint(self, run: str) -> None:
        """Write ``run``'s changed state to the table: each changed rank in its other slot,
        then the head that names those slots (a checkpoint cut short before the head leaves
        the stored run as it was; a large head in parts: ``MAX_VALUE``), then the ranks'
        previous slots are cleared. The next is due ``checkpoint_s`` after it ends, or forty
        times as long as it took if it was slow (``CHECKPOINT_SPACING``)."""
        began = time.monotonic()
        det = self.cache[run]
        head, ranks = det.dump(det.take_touched())
        for rank, blob in ranks.items():
            self.table[rank_key(run, rank, det.slots[rank]).encode()] = blob
        self._put_head(run, head)
        for rank in ranks:
            old = rank_key(run, rank, 1 - det.slots[rank]).encode()
            if old in self.table:
                del self.table[old]
        ended = time.monotonic()
        self.saved[run] = (ended, ended - began)

    def quiet_runs(self) -> list[str]:
        """Runs holding messages past their next checkpoint's time (a run that went quiet:
        its next checkpoint needs a message of its partition)."""
        now = time.monotonic()
        return [run for held in self.held.values() for run in held if self._due(run, now)]

    def revoked(self) -> None:
        """A rebalance began: the held messages are not acknowledged (Faust delivers them
        again from the committed offset, to this worker or the partition's next owner), the
        history loads are dropped, and a message being scored is left to that replay."""
        self.generation += 1
        self.held.clear()
        self.limits.forget()
        if self.history is not None:
            self.history.revoked()

    def assigned(self, partitions: set[int]) -> None:
        """The by-run ``partitions`` are this worker's now: the runs of the others are
        dropped (their next owner restores them from the table); the rest stay in memory."""
        for run in [r for r in self.cache if self.partition_of.get(r) not in partitions]:
            del self.cache[run]
            self.saved.pop(run, None)
            self.partition_of.pop(run, None)

    def fitted(self, run: str, key: tuple[int, str], params: ArimaParams | None) -> None:
        det = self.cache.get(run)
        if det is not None:
            det.apply_fit(key, params)
