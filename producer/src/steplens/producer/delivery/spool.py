"""A bounded on-disk spool of encoded records, kept while Kafka is unreachable.

Records are appended to numbered segment files; a frame is ``crc32, key length, value length``
(big-endian u32 each) then key and value. When the spool exceeds its bound the oldest segment is
deleted and its records are counted as dropped. Replay reads the oldest segment; the caller
removes it once every record in it was delivered. A torn frame at the end of a segment (a crash
while writing) ends that segment's replay.

Each process spools into its own folder ``<root>/<run>/rank<r>-pid<pid>`` and holds an
exclusive lock on its ``.lock`` file while it uses it. A folder whose lock is free belongs to a
process that ended with records left (a Kafka outage at exit): the next producer with the same
root adopts its segments on start (``Spool.open``) and sends them first; ``send_spool`` sends a
spool by hand (``steplens spool send DIR``). The lock makes sure two live processes never
send the same segment. Folders are created 0700 and files 0600: records are training data.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from steplens.schema.kafka_produce import retry_while_full

log = logging.getLogger("steplens")

_FRAME = struct.Struct(">III")
_SEGMENT_RE = re.compile(r"^(\d{10})\.seg$")
LOCK_NAME = ".lock"
_DIR_MODE = 0o700
_FILE_MODE = 0o600


def _lock(folder: str) -> int | None:
    """An fd holding the folder's exclusive lock, or None while another process holds it."""
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _segments_in(folder: str) -> list[tuple[int, str]]:
    """(index, path) of the folder's segments, oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [
        (int(m.group(1)), os.path.join(folder, n)) for n in names if (m := _SEGMENT_RE.match(n))
    ]
    return sorted(found)


def _spool_folders(root: str) -> list[str]:
    """Every spool folder under ``root`` (``<root>/<run>/<rank-pid>`` or ``root`` itself)."""
    out = [root] if _segments_in(root) or os.path.exists(os.path.join(root, LOCK_NAME)) else []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if dirpath != root and (LOCK_NAME in filenames or any(map(_SEGMENT_RE.match, filenames))):
            out.append(dirpath)
    return out


def _forget(folder: str, lock_fd: int) -> None:
    """Remove an emptied, locked folder (and its run folder once empty); release the lock."""
    with contextlib.suppress(OSError):
        if not _segments_in(folder):
            os.unlink(os.path.join(folder, LOCK_NAME))
            os.rmdir(folder)
            os.rmdir(os.path.dirname(folder))  # fails while other ranks' folders are there
    os.close(lock_fd)


@dataclass
class _Segment:
    index: int
    path: str
    bytes: int
    records: int


class Spool:
    def __init__(
        self,
        directory: str,
        max_bytes: int,
        segment_bytes: int | None = None,
        adopt_root: str | None = None,
    ) -> None:
        self.directory = directory
        self.adopt_root = adopt_root  # where folders of ended processes are looked for
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or min(max(max_bytes // 8, 64 << 10), 16 << 20)
        self.dropped_records = 0  # deleted to stay within max_bytes
        self.dropped_segments = 0
        self._segments: list[_Segment] = []
        self._writer: BinaryIO | None = None  # open file of the newest segment
        self._total = 0
        self._opened = False
        self._lock_fd: int | None = None
        self.adopted_records = 0  # records found in folders of processes that ended

    # ------------------------------------------------------------------ state
    @property
    def total_bytes(self) -> int:
        return self._total

    @property
    def records(self) -> int:
        return sum(s.records for s in self._segments)

    def __len__(self) -> int:
        return len(self._segments)

    @property
    def opened(self) -> bool:
        return self._opened

    def open(self) -> None:
        """Create and lock the folder, adopt the segments of ended processes under
        ``adopt_root`` (oldest folder first), and pick up every segment now in the folder."""
        if self._opened:
            return
        os.makedirs(self.directory, mode=_DIR_MODE, exist_ok=True)
        os.chmod(self.directory, _DIR_MODE)
        self._lock_fd = _lock(self.directory)
        if self.adopt_root is not None and self._lock_fd is not None:
            self._adopt(self.adopt_root)
        for index, path in _segments_in(self.directory):
            seg = _Segment(index, path, os.path.getsize(path), -1)
            seg.records = sum(1 for _ in iter_frames(seg.path))
            self._segments.append(seg)
            self._total += seg.bytes
        self._opened = True

    def _open(self) -> None:
        self.open()

    def _adopt(self, root: str) -> None:
        mine = os.path.abspath(self.directory)
        present = _segments_in(self.directory)
        next_index = present[-1][0] + 1 if present else 1
        folders = [f for f in _spool_folders(root) if os.path.abspath(f) != mine]
        for folder in sorted(folders, key=_oldest_mtime):
            segments = _segments_in(folder)
            if not segments:
                continue  # a live process that has not spooled yet, or nothing left
            fd = _lock(folder)
            if fd is None:
                continue  # its process is alive: it sends its own
            try:
                for _, path in _segments_in(folder):
                    target = os.path.join(self.directory, f"{next_index:010d}.seg")
                    self.adopted_records += sum(1 for _ in iter_frames(path))
                    os.replace(path, target)
                    next_index += 1
                log.warning("steplens: sending the records a previous process left in %s", folder)
            finally:
                _forget(folder, fd)

    # ------------------------------------------------------------------ write
    def append(self, key: bytes, value: bytes) -> bool:
        """Append one record; False when it alone is larger than the bound (then dropped)."""
        self._open()
        body = key + value
        frame = _FRAME.pack(zlib.crc32(body), len(key), len(value)) + body
        if len(frame) > self.max_bytes:
            self.dropped_records += 1
            return False
        if self._writer is None or self._segments[-1].bytes >= self.segment_bytes:
            self._roll()
        seg = self._segments[-1]
        f = self._writer
        assert f is not None
        f.write(frame)
        f.flush()
        seg.bytes += len(frame)
        seg.records += 1
        self._total += len(frame)
        self._enforce_bound()
        return True

    def _roll(self) -> None:
        self._close_writer()
        index = self._segments[-1].index + 1 if self._segments else 1
        path = os.path.join(self.directory, f"{index:010d}.seg")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, _FILE_MODE)
        self._writer = os.fdopen(fd, "ab")
        self._segments.append(_Segment(index, path, 0, 0))

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _enforce_bound(self) -> None:
        while self._total > self.max_bytes and len(self._segments) > 1:
            oldest = self._segments[0]
            self.dropped_records += oldest.records
            self.dropped_segments += 1
            self._delete(oldest)

    def _delete(self, seg: _Segment) -> None:
        self._segments.remove(seg)
        self._total -= seg.bytes
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.path)

    # ------------------------------------------------------------------ replay
    def oldest(self) -> tuple[int, list[tuple[bytes, bytes]]] | None:
        """The oldest segment's index and records; the writer moves on to a new segment."""
        found = self.oldest_lazy()
        return None if found is None else (found[0], list(found[1]))

    def oldest_lazy(self) -> tuple[int, Iterator[tuple[bytes, bytes]]] | None:
        """Like ``oldest`` but the records are read on demand, a block at a time."""
        self._open()
        if not self._segments:
            return None
        seg = self._segments[0]
        if len(self._segments) == 1 and self._writer is not None:
            self._close_writer()  # next append starts a new segment
        return seg.index, iter_frames(seg.path)

    def remove(self, index: int) -> None:
        """Delete a replayed segment (no-op when it was already dropped for space)."""
        for seg in self._segments:
            if seg.index == index:
                if seg is self._segments[-1]:
                    self._close_writer()
                self._delete(seg)
                return

    def close(self) -> None:
        """Close the writer and release the folder (removed when empty): records left in it
        are then adopted by the next producer with the same root."""
        self._close_writer()
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            if not self._segments:
                _forget(self.directory, fd)
            else:
                os.close(fd)


def _oldest_mtime(folder: str) -> float:
    segments = _segments_in(folder)
    try:
        return os.path.getmtime(segments[0][1]) if segments else 0.0
    except OSError:
        return 0.0


def iter_frames(path: str, block_bytes: int = 64 << 10) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) frames of one segment, read ``block_bytes`` at a time; a torn or corrupt
    frame ends the segment. A missing file has no frames."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the generator's finally
    except FileNotFoundError:
        return
    try:
        buf, pos = b"", 0
        while True:
            chunk = f.read(block_bytes)
            if not chunk:
                return
            buf, pos = buf[pos:] + chunk, 0
            while pos + _FRAME.size <= len(buf):
                crc, klen, vlen = _FRAME.unpack_from(buf, pos)
                start, end = pos + _FRAME.size, pos + _FRAME.size + klen + vlen
                if end > len(buf):
                    break  # the rest of this frame is in the next block
                body = buf[start:end]
                if zlib.crc32(body) != crc:
                    return
                yield body[:klen], body[klen:]
                pos = end
    finally:
        f.close()


def send_spool(directory: str, transport: Any, timeout_s: float = 30.0) -> tuple[int, int]:
    """Send every record of the spool folders under ``directory`` through ``transport`` (a
    ``steplens.producer.delivery.transport.Transport``), oldest segment first, and delete each
    segment once all its records are acknowledged. Folders of live processes are skipped; a
    record the transport's full local buffer does not take within ``timeout_s`` ends the
    folder's turn (it and the rest stay). Returns (records sent, records left)."""
    sent = left = 0
    for folder in _spool_folders(directory):
        fd = _lock(folder)
        if fd is None:
            log.warning("steplens: %s belongs to a running process; skipped", folder)
            left += sum(sum(1 for _ in iter_frames(p)) for _, p in _segments_in(folder))
            continue
        try:
            for _, path in _segments_in(folder):
                ok, total = _send_segment(path, transport, timeout_s)
                sent += ok
                if ok < total:
                    left += total - ok
                    break
                os.unlink(path)
        finally:
            _forget(folder, fd)
    return sent, left


def _send_segment(path: str, transport: Any, timeout_s: float) -> tuple[int, int]:
    """(acknowledged, total) records of one segment."""
    acked = [0, 0]  # ok, failed

    def done(ok: bool, _key: bytes, _value: bytes) -> None:
        acked[0 if ok else 1] += 1

    queued = total = 0
    frames = iter_frames(path)
    for key, value in frames:
        total += 1
        attempt = functools.partial(transport.produce, key, value, done)
        if not retry_while_full(attempt, transport.poll, timeout_s, poll_s=0.05):
            total += sum(1 for _ in frames)  # the local queue stayed full: the rest stays spooled
            break
        queued += 1
    deadline = time.monotonic() + timeout_s
    while sum(acked) < queued and time.monotonic() < deadline:
        transport.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        transport.poll(0)
    return acked[0], total
