"""A bounded on-disk spool of encoded records, kept while Kafka is unreachable.

Records are appended to numbered segment files; a frame is ``crc32, key length, value length``
(big-endian u32 each) then key and value. When the spool exceeds its bound the oldest segment is
deleted and its records are counted as dropped. Replay reads the oldest segment; the caller
removes it once every record in it was delivered. A torn frame at the end of a segment (a crash
while writing) ends that segment's replay.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

_FRAME = struct.Struct(">III")
_SEGMENT_RE = re.compile(r"^(\d{10})\.seg$")


@dataclass
class _Segment:
    index: int
    path: str
    bytes: int
    records: int


class Spool:
    def __init__(self, directory: str, max_bytes: int, segment_bytes: int | None = None) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or min(max(max_bytes // 8, 64 << 10), 16 << 20)
        self.dropped_records = 0  # deleted to stay within max_bytes
        self.dropped_segments = 0
        self._segments: list[_Segment] = []
        self._writer: BinaryIO | None = None  # open file of the newest segment
        self._total = 0
        self._opened = False

    # ------------------------------------------------------------------ state
    @property
    def total_bytes(self) -> int:
        return self._total

    @property
    def records(self) -> int:
        return sum(s.records for s in self._segments)

    def __len__(self) -> int:
        return len(self._segments)

    def _open(self) -> None:
        """Create the folder and pick up segments left by an earlier process."""
        if self._opened:
            return
        os.makedirs(self.directory, exist_ok=True)
        found = []
        for name in os.listdir(self.directory):
            m = _SEGMENT_RE.match(name)
            if m:
                path = os.path.join(self.directory, name)
                found.append(_Segment(int(m.group(1)), path, os.path.getsize(path), -1))
        for seg in sorted(found, key=lambda s: s.index):
            seg.records = sum(1 for _ in iter_frames(seg.path))
            self._segments.append(seg)
            self._total += seg.bytes
        self._opened = True

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
        self._writer = open(path, "ab")  # noqa: SIM115 - kept open across appends
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
        self._close_writer()


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
