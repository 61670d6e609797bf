"""Detector state as plain data (msgpack), with a format version: never pickled.

A value is ``MAGIC``, a format byte, then msgpack. Containers and state dataclasses are
written as tagged maps (``$c`` class, ``$d`` dict, ``$s`` set, ``$q`` deque, ``$t`` tuple,
``$a`` numpy array as dtype, shape and bytes, ``$r`` a trend's ``Samples`` as one float64
array); only the classes a ``Codec`` is given are built
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
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np

MAGIC = b"SLst"
FORMAT = 1  # raise it when a change cannot be read by the rule above; keep reading the old

RANK_SEP = "\x1f"  # in a rank's table key only (a run id is printable)
# the values written as they are (``Codec``; a subclass, numpy's float64, takes the long way)
_SCALARS = frozenset({type(None), bool, int, float, str, bytes})


class Samples(deque[tuple[float, ...]]):
    """A trend's kept samples: rows of floats of one width, oldest first (a ``deque`` with a
    ``maxlen``), stored as one float64 array (``$r``) rather than a list per row. A run's
    trends (a GPU's temperature, a rank's memory: up to 120 samples each) were most of what
    its head cost to pack."""


def rank_key(run: str, rank: int, slot: int = 0) -> str:
    """The table key of one rank's series of ``run`` in ``slot`` (0 or 1; 0 is the key of the
    heads stored before slots)."""
    key = f"{run}{RANK_SEP}rank:{rank}"
    return key if slot == 0 else f"{key}{RANK_SEP}{slot}"


class Codec:
    """``pack`` and ``unpack`` of values made of containers, numpy arrays and ``classes``."""

    def __init__(self, classes: Iterable[type]) -> None:
        self.classes: dict[str, type] = {c.__name__: c for c in classes}
        self._fields: dict[type, tuple[str, ...]] = {}  # a state class's init fields

    def _plain(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return x
        return self._plain_container(x)

    def _plain_items(self, xs: Iterable[Any]) -> list[Any]:
        """Each of ``xs`` plain (the scalars, most of a state's values, as they are)."""
        plain = self._plain_container
        return [v if type(v) in _SCALARS else plain(v) for v in xs]

    def _plain_dict(self, x: dict[Any, Any]) -> dict[str, Any]:
        plain, scalars = self._plain_container, _SCALARS
        items = [
            [k if type(k) in scalars else plain(k), v if type(v) in scalars else plain(v)]
            for k, v in x.items()
        ]
        return {"$d": items}

    def _plain_container(self, x: Any) -> Any:
        cls = type(x)
        names = self._fields.get(cls)
        if names is not None:  # a state class
            plain, scalars = self._plain_container, _SCALARS
            fields = {}
            for n in names:
                v = getattr(x, n)
                fields[n] = v if type(v) in scalars else plain(v)
            return {"$c": cls.__name__, "f": fields}
        if cls is list:
            return self._plain_items(x)
        if cls is dict:
            return self._plain_dict(x)
        if cls is deque:
            return {"$q": [x.maxlen, self._plain_items(x)]}
        if cls is Samples:
            rows = np.array(x, dtype=np.float64)
            return {"$r": [x.maxlen, rows.shape[1] if rows.ndim == 2 else 0, rows.tobytes()]}
        if cls is np.ndarray:
            a = np.ascontiguousarray(x)
            return {"$a": [a.dtype.str, list(a.shape), a.tobytes()]}
        if cls is tuple:
            return {"$t": self._plain_items(x)}
        return self._plain_other(x)

    def _plain_other(self, x: Any) -> Any:
        """What ``_plain_container`` does not know by its type alone (subclasses included)."""
        if x is None or isinstance(x, (bool, int, float, str, bytes)):
            return x
        if isinstance(x, list):
            return self._plain_items(x)
        if isinstance(x, dict):
            return self._plain_dict(x)
        if isinstance(x, np.ndarray):
            a = np.ascontiguousarray(x)
            return {"$a": [a.dtype.str, list(a.shape), a.tobytes()]}
        if isinstance(x, deque):
            return {"$q": [x.maxlen, self._plain_items(x)]}
        if isinstance(x, (set, frozenset)):
            return {"$s": self._plain_items(x)}
        if isinstance(x, tuple):
            return {"$t": self._plain_items(x)}
        if isinstance(x, np.generic):
            return x.item()
        cls = type(x)
        if not (dataclasses.is_dataclass(x) and self.classes.get(cls.__name__) is cls):
            raise TypeError(f"not part of a detector's state: {cls.__name__}")
        self._fields[cls] = tuple(f.name for f in dataclasses.fields(x) if f.init)
        return self._plain_container(x)

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
        if "$r" in x:
            maxlen, width, raw = x["$r"]
            rows = np.frombuffer(raw, dtype=np.float64).reshape(-1, width).tolist() if width else []
            return Samples(map(tuple, rows), maxlen=maxlen)
        if "$s" in x:
            return {_key(self._built(v)) for v in x["$s"]}
        if "$t" in x:
            return tuple(self._built(v) for v in x["$t"])
        if "$c" in x:
            cls = self.classes.get(x["$c"])
            if cls is None:
                raise ValueError(f"unknown state class {x['$c']!r}")
            names = {f.name for f in dataclasses.fields(cls) if f.init}
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


def _key(k: Any) -> Any:
    return tuple(_key(v) for v in k) if isinstance(k, list) else k
