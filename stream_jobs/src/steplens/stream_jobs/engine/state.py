"""Detector state as plain data (msgpack), with a format version: never pickled.

A value is ``MAGIC``, a format byte, then msgpack. Containers and state dataclasses are
written as tagged maps (``$c`` class, ``$d`` dict, ``$s`` set, ``$q`` deque, ``$t`` tuple,
``$a`` numpy array as dtype, shape and bytes); only the classes a ``Codec`` is given are built
back, each from the fields it has now (a field added by a later release takes its default; one
it no longer has is dropped). A value of another format, or none of ours (the pickles of earlier
releases), is refused (``ValueError``).

A run is stored as a head under the run id and each rank's series as a value of its own
(``rank_key``: one value for a whole run grew with its ranks past what Kafka takes in one
message), in one of two slots the head names; ``RunDetector.dump`` and ``RunDetector.load``
say what a head holds (a large head is stored in parts: ``worker.store``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np

MAGIC = b"SLst"
FORMAT = 1  # raise it when a change cannot be read by the rule above; keep reading the old

RANK_SEP = "\x1f"  # in a rank's table key only (a run id is printable)
_AS_IS = frozenset({type(None), bool, int, float, str, bytes})  # written by msgpack itself


def rank_key(run: str, rank: int, slot: int = 0) -> str:
    """The table key of one rank's series of ``run`` in ``slot`` (0 or 1; 0 is the key of the
    heads stored before slots)."""
    key = f"{run}{RANK_SEP}rank:{rank}"
    return key if slot == 0 else f"{key}{RANK_SEP}{slot}"


class Codec:
    """``pack`` and ``unpack`` of values made of containers, numpy arrays and ``classes``."""

    def __init__(self, classes: Iterable[type]) -> None:
        self.classes: dict[str, type] = {c.__name__: c for c in classes}

    def _plain(self, x: Any) -> Any:
        if type(x) in _AS_IS or isinstance(x, (bool, int, float, str, bytes)):
            return x
        if isinstance(x, list):
            return self._items(x)
        if isinstance(x, dict):
            return {"$d": [[self._plain(k), self._plain(v)] for k, v in x.items()]}
        if isinstance(x, np.ndarray):
            a = np.ascontiguousarray(x)
            return {"$a": [a.dtype.str, list(a.shape), a.tobytes()]}
        if isinstance(x, deque):
            return {"$q": [x.maxlen, self._items(x)]}
        if isinstance(x, (set, frozenset)):
            return {"$s": self._items(x)}
        if isinstance(x, tuple):
            return {"$t": self._items(x)}
        if isinstance(x, np.generic):
            return x.item()
        name = type(x).__name__
        if self.classes.get(name) is type(x):
            return {"$c": name, "f": self._fields(x)}
        raise TypeError(f"not part of a detector's state: {type(x).__name__}")

    # most of a state is numbers: written as they are, without a call each
    def _items(self, xs: Iterable[Any]) -> list[Any]:
        plain = self._plain
        return [v if type(v) in _AS_IS else plain(v) for v in xs]

    def _fields(self, x: Any) -> dict[str, Any]:
        plain, out = self._plain, {}
        for f in _stored_fields(type(x)):
            v = getattr(x, f)
            out[f] = v if type(v) in _AS_IS else plain(v)
        return out

    def _built(self, x: Any) -> Any:
        if isinstance(x, list):
            return [self._built(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "$d" in x:
            return {_key(self._built(k)): self._built(v) for k, v in x["$d"]}
        if "$a" in x:
            dtype, shape, raw = x["$a"]
            return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
        if "$q" in x:
            maxlen, items = x["$q"]
            return deque((self._built(v) for v in items), maxlen=maxlen)
        if "$s" in x:
            return {_key(self._built(v)) for v in x["$s"]}
        if "$t" in x:
            return tuple(self._built(v) for v in x["$t"])
        if "$c" in x:
            cls = self.classes.get(x["$c"])
            if cls is None:
                raise ValueError(f"unknown state class {x['$c']!r}")
            names = _stored_fields(cls)
            return cls(**{k: self._built(v) for k, v in x["f"].items() if k in names})
        raise ValueError("unknown tag in a stored state")

    def pack(self, value: Any) -> bytes:
        return MAGIC + bytes([FORMAT]) + msgpack.packb(self._plain(value), use_bin_type=True)

    def unpack(self, blob: bytes) -> Any:
        """The value of ``pack``; ``ValueError`` for a value of another format or none of ours."""
        if not blob.startswith(MAGIC) or len(blob) <= len(MAGIC):
            raise ValueError("not a steplens state (an older release's format?)")
        if blob[len(MAGIC)] != FORMAT:
            raise ValueError(f"state format {blob[len(MAGIC)]}, this release reads {FORMAT}")
        return self._built(msgpack.unpackb(blob[len(MAGIC) + 1 :], raw=False, strict_map_key=False))


@functools.cache
def _stored_fields(cls: type) -> tuple[str, ...]:
    """The fields of a state dataclass that its stored form holds (those ``__init__`` takes)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def _key(k: Any) -> Any:
    return tuple(_key(v) for v in k) if isinstance(k, list) else k
