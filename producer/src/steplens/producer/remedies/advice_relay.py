"""One advice reader per node: local rank 0 reads the advice topic, the node's other ranks read
what it relays through a file.

Every rank of a run with a remedy on needs the run's advice; a Kafka consumer per rank costs
the broker two connections and a fetch loop each (16,384 ranks: about 33,000 connections,
``bench/RESULTS.md``). With the relay, the node's local rank 0 keeps the only consumer
(``RelayWriter``: the messages of the run's key are appended to the node's file as they
arrive) and the other local ranks read that file (``RelayReader``), so the broker sees one
consumer per node. Each rank's ``AdviceInbox`` still judges every message itself (rank,
remedies, rate limit, what it has seen), exactly as with its own consumer.

The file: ``<advice_relay_dir>/<run>/<host>/<generation>``, frames of a 4-byte big-endian
length and a msgpack ``[key, value, partition, offset, relayed_ms]``. The writer starts a new
generation when it starts and when the file reaches ``MAX_FILE_BYTES``, and removes those two
back (a reader keeps reading a removed file it holds open); readers go on to the next
generation at the end of theirs. A reader starts at the first generation written since its
own start and keeps what was relayed from then on, as a consumer of its own would have.
Where the node's file never appears (local rank 0 not instrumented, ranks that share no
disk), the reader gives up after ``RELAY_WAIT_S`` and the rank opens a consumer of its own
(``advice_source``, called again by ``AdviceOpener``). The folder is the user's own (0700); a
folder of another owner or open to others turns the relay off (a consumer per rank).
Each host has a folder of its own: a reader lists its host's generations, never every node's
(a run folder shared over NFS, or the simulator's, holds one per node: 2,048 at 16,384 ranks).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from steplens.producer.delivery.transport import kafka_advice_source
from steplens.producer.remedies.advice_inbox import AdviceSource, Message

log = logging.getLogger("steplens")

MAX_FILE_BYTES = 8 << 20  # a generation's size before the next; three kept at most
MAX_FRAME_BYTES = 4 << 20  # larger than any advice message the broker lets through
LIST_EVERY_S = 1.0  # a reader at the end of its file lists the folder at most this often
RELAY_WAIT_S = 60.0  # a reader whose node's file has not appeared by then gives up
STALE_RUN_S = 7 * 86400.0  # a run's relay folder untouched this long is removed by a writer
_LEN = struct.Struct(">I")
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_frame = msgspec.msgpack.Encoder()
_unframe = msgspec.msgpack.Decoder(tuple[bytes | None, bytes | None, int, int, int])


class RelayMissing(ConnectionError):
    """The node's relay file did not appear in time: this rank needs a consumer of its own."""


def relay_folder(base: str, run_id: str) -> Path | None:
    """The run's relay folder under ``base``, made private to this user; None where ``base``
    or the folder belongs to another user or others may write it (the relay is then off)."""
    try:
        root = Path(base)
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder = root / _SAFE.sub("_", run_id)[:200]
        folder.mkdir(exist_ok=True, mode=0o700)
        for p in (root, folder):
            st = p.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                log.warning("steplens: advice relay off: %s is not this user's own folder", p)
                return None
        return folder
    except OSError as exc:
        log.warning("steplens: advice relay off: %s", exc)
        return None


def _host_folder(folder: Path, host: str) -> Path:
    return folder / _SAFE.sub("_", host)


def _generations(folder: Path, host: str) -> list[int]:
    try:
        return sorted(int(p.name) for p in _host_folder(folder, host).iterdir() if p.name.isdigit())
    except OSError:
        return []


def _path(folder: Path, host: str, generation: int) -> Path:
    return _host_folder(folder, host) / str(generation)


class RelayWriter:
    """Local rank 0's source: its own consumer's messages, those of the run's key appended to
    the node's file (the others are for no rank here; this rank's inbox still counts them)."""

    label = "kafka, relayed to the node"

    def __init__(self, source: AdviceSource, folder: Path, host: str, run_id: str) -> None:
        self.source = source
        self._folder, self._host = folder, host
        self._key = run_id.encode()
        self.errors = 0
        _host_folder(folder, host).mkdir(exist_ok=True, mode=0o700)
        known = _generations(folder, host)
        self._generation = known[-1] + 1 if known else 0
        self._fd = self._open()
        _remove_stale_runs(folder.parent, folder)

    def _open(self) -> int:
        path = _path(self._folder, self._host, self._generation)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for old in _generations(self._folder, self._host):
            if old <= self._generation - 2:
                _path(self._folder, self._host, old).unlink(missing_ok=True)
        return fd

    def take_advice(self, max_n: int) -> list[Message]:
        messages = self.source.take_advice(max_n)
        ours = [m for m in messages if m[0] == self._key]
        if ours:
            self._append(ours)
        return messages

    def _append(self, messages: list[Message]) -> None:
        now_ms = time.time_ns() // 1_000_000
        chunks = []
        for key, value, partition, offset in messages:
            body = _frame.encode((key, value, partition, offset, now_ms))
            if len(body) <= MAX_FRAME_BYTES:
                chunks.append(_LEN.pack(len(body)) + body)
        try:
            if os.fstat(self._fd).st_size >= MAX_FILE_BYTES:
                os.close(self._fd)
                self._generation += 1
                self._fd = self._open()
            os.write(self._fd, b"".join(chunks))  # one append: readers never see a frame cut
        except OSError as exc:
            self.errors += 1
            if self.errors == 1:
                log.warning("steplens: advice relay cannot write %s: %s", self._folder, exc)

    def close_advice(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self.source.close_advice()


class RelayReader:
    """The source of a local rank other than 0: the frames its node's writer appends, from
    this rank's start (``start_ms``) on. Raises ``RelayMissing`` from ``take_advice`` once no
    file has appeared within ``wait_s`` (``RELAY_WAIT_S``) of its start (after calling
    ``on_missing``)."""

    label = "node relay"

    def __init__(
        self,
        folder: Path,
        host: str,
        start_ms: int,
        *,
        wait_s: float | None = None,
        on_missing: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._folder, self._host = folder, host
        self._on_missing = on_missing
        self._start_ms = start_ms
        self._clock = clock
        self._give_up = clock() + (RELAY_WAIT_S if wait_s is None else wait_s)
        self._generation: int | None = None
        self._file: BinaryIO | None = None
        self._buf = b""
        self._listed = -math.inf  # when the folder was last listed
        self.broken = 0  # frames that could not be read (the rest of their file skipped)

    def take_advice(self, max_n: int) -> list[Message]:
        if self._file is None and not self._open_first():
            return []
        out: list[Message] = []
        while len(out) < max_n:
            frame = self._next_frame()
            if frame is None:
                if not self._next_generation():
                    break
                continue
            key, value, partition, offset, relayed_ms = frame
            if relayed_ms >= self._start_ms:
                out.append((key, value, partition, offset))
        return out

    def _open_first(self) -> bool:
        known = _generations(self._folder, self._host)
        if not known:
            if self._clock() > self._give_up:
                if self._on_missing is not None:
                    self._on_missing()
                raise RelayMissing(f"no advice relay from local rank 0 in {self._folder}")
            return False
        # the first written to since this rank started (older ones hold only what was
        # relayed before), else the newest, which the writer appends to
        first = known[-1]
        for g in known:
            try:
                if _path(self._folder, self._host, g).stat().st_mtime * 1000 >= self._start_ms:
                    first = g
                    break
            except OSError:
                continue
        return self._open_generation(first)

    def _open_generation(self, generation: int) -> bool:
        try:
            f = _path(self._folder, self._host, generation).open("rb")
        except OSError:
            return False
        if self._file is not None:
            self._file.close()
        self._file, self._generation, self._buf = f, generation, b""
        return True

    def _next_frame(self) -> tuple | None:
        """The next whole frame of the open file (None: none yet)."""
        while True:
            if len(self._buf) < _LEN.size and not self._read_more(_LEN.size):
                return None
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_FRAME_BYTES:  # not a frame: the rest of this file cannot be trusted
                self.broken += 1
                self._read_more(0)
                self._buf = b""
                return None
            need = _LEN.size + n
            if len(self._buf) < need and not self._read_more(need):
                return None
            body, self._buf = self._buf[_LEN.size : need], self._buf[need:]
            try:
                return _unframe.decode(body)
            except msgspec.DecodeError:
                self.broken += 1

    def _read_more(self, need: int) -> bool:
        """Whether, after reading what the file has now, ``need`` bytes are buffered."""
        if self._file is not None:
            self._buf += self._file.read()
        return len(self._buf) >= need

    def _next_generation(self) -> bool:
        """At the end of this generation: on to the next one the writer started, once this
        one is read to its end (the writer finished it before starting the next). The next
        number is looked for at each call (one stat); the folder is listed at most every
        ``LIST_EVERY_S`` (a reader that fell behind generations the writer removed)."""
        current = self._generation or 0
        if _path(self._folder, self._host, current + 1).exists():
            later = [current + 1]
        else:
            now = self._clock()
            if now < self._listed + LIST_EVERY_S:
                return False
            self._listed = now
            later = [g for g in _generations(self._folder, self._host) if g > current]
        if not later:
            return False
        before = len(self._buf)
        if self._read_more(before + 1):
            return True  # written before the writer moved on: read it first
        if self._buf:
            self.broken += 1  # a frame the writer never finished
        return self._open_generation(later[0])

    def close_advice(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def advice_source(
    config: Any,
    identity: Any,
    start_ms: int,
    per_node: bool = True,
    on_missing: Callable[[], None] | None = None,
) -> AdviceSource:
    """A rank's advice source (``config``: its ProducerConfig): on a run of several ranks with
    ``advice_per_node`` (and ``per_node``: its node did relay before), local rank 0 reads Kafka
    and relays, the others read the relay; else a consumer of its own."""
    folder = None
    if config.advice_per_node and per_node and identity.world_size > 1:
        folder = relay_folder(config.advice_relay_dir, identity.run_id)
    if folder is None:
        return kafka_advice_source(config, identity, start_ms)
    if identity.local_rank == 0:
        own = kafka_advice_source(config, identity, start_ms)
        return RelayWriter(own, folder, identity.host, identity.run_id)
    return RelayReader(folder, identity.host, start_ms, on_missing=on_missing)


class AdviceOpener:
    """Opens a rank's advice source (``advice_source``), in the worker's opening thread; a
    rank whose node relays nothing within ``RELAY_WAIT_S`` opens a consumer of its own from
    then on."""

    def __init__(self, config: Any, identity: Any, start_ms: int) -> None:
        self.config = config
        self.identity = identity
        self.start_ms = start_ms  # advice from then on
        self.relay_missing = False  # the node relays no advice: this rank reads Kafka

    def __call__(self) -> AdviceSource:
        return advice_source(
            self.config,
            self.identity,
            self.start_ms,
            per_node=not self.relay_missing,
            on_missing=self._no_relay,
        )

    def _no_relay(self) -> None:
        self.relay_missing = True
        log.warning("steplens: no advice relay from local rank 0 on this node: own consumer")


def _remove_stale_runs(root: Path, keep: Path) -> None:
    """Relay folders of runs untouched for ``STALE_RUN_S`` (runs end; folders would not)."""
    cutoff = time.time() - STALE_RUN_S
    try:
        for folder in root.iterdir():
            if folder != keep and folder.stat().st_mtime <= cutoff:
                shutil.rmtree(folder, ignore_errors=True)
    except OSError:
        pass


__all__ = [
    "AdviceOpener",
    "RelayMissing",
    "RelayReader",
    "RelayWriter",
    "advice_source",
    "relay_folder",
]
