"""Skipping data a remedy named: samples for the rest of the run, and the next N batches after
a rewind.

``Skipping`` wraps what the loop iterates (a DataLoader, any iterable of batches, a sampler or
batch sampler of indices, an ``IterableDataset`` of samples) and drops, on the way through:

- an index (a sampler's ``int``) whose ``str`` is a skipped sample id, and such indices from a
  batch sampler's list (a list left empty is dropped);
- the rows of a batch whose id (the batch's ``sample_ids`` / ``sample_id`` field, or what
  ``ids(batch)`` returns) is skipped, or whose content hash is: the hash ``batch_stats`` sends
  (MD5 of the valid token ids), so a hash the stream jobs name is the one of the same row.
  Every field of the batch with one entry per row keeps the rows left; a batch left empty is
  dropped;
- the next ``n`` batches after ``skip_next(n)`` (a rewind's): ``n * items_per_batch`` items,
  where a framework batches the items (a Trainer's dataset of samples).

The skip lists live in this process: an ``IterableDataset`` that DataLoader workers read
(``num_workers > 0``) is a copy in each worker and never sees them; wrap the DataLoader or its
sampler instead. Nothing is looked at while the skip lists are empty. The lists are bounded
(``max_ids`` each); names past the cap are counted in ``overflow`` and not skipped. Rows are
hashed on the host, so a batch must still be on the CPU (as a DataLoader yields it); a batch
on a device is passed through untouched (no host sync) and counted in ``unreadable``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from steplens.producer.instruments.loader_batches import token_fields
from steplens.producer.pipeline.batch_stats import sample_hash

log = logging.getLogger("steplens")
MAX_IDS = 65_536  # sample ids, and hashes, each: a few MB at most
_ID_FIELDS = ("sample_ids", "sample_id", "ids", "idx", "index")


class SkipList:
    """The sample ids and hashes to skip for the rest of the run: bounded, overflow counted."""

    def __init__(self, max_ids: int = MAX_IDS) -> None:
        self.max_ids = max_ids
        self.ids: set[str] = set()
        self.hashes: set[str] = set()
        self.overflow = 0

    def __bool__(self) -> bool:
        return bool(self.ids or self.hashes)

    def add(self, ids: Iterable[Any] = (), hashes: Iterable[Any] = ()) -> int:
        """Add names; returns how many were new (past the cap: counted in ``overflow``)."""
        added = 0
        for names, values in ((self.ids, ids), (self.hashes, hashes)):
            for v in values or ():
                s = str(v)
                if s in names:
                    continue
                if len(names) >= self.max_ids:
                    self.overflow += 1
                    continue
                names.add(s)
                added += 1
        return added


def _rows_of(x: Any) -> int | None:
    """How many rows ``x`` has along its first axis (None: not a per-row field)."""
    shape = getattr(x, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if isinstance(x, (list, tuple)):
        return len(x)
    return None


def _take(x: Any, keep: list[int], n: int) -> Any:
    """``x``'s rows ``keep`` when it has ``n`` rows; anything else unchanged."""
    if _rows_of(x) != n:
        return x
    if hasattr(x, "index_select"):  # a torch tensor
        import torch

        return x.index_select(0, torch.tensor(keep, dtype=torch.long, device=x.device))
    if isinstance(x, np.ndarray):
        return x[keep]
    return type(x)(x[i] for i in keep) if isinstance(x, tuple) else [x[i] for i in keep]


def _id_list(ids: Any) -> list[str] | None:
    """A batch's sample ids as strings (one scalar id: one sample); None: on a device."""
    if isinstance(ids, (str, bytes, int)):
        return [str(ids)]
    if hasattr(ids, "detach") or isinstance(ids, np.ndarray):
        arr = _host(ids)
        return None if arr is None else [str(v) for v in arr.reshape(-1).tolist()]
    return [str(v) for v in ids]


def _host(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array when it is on the host already (None: on a device)."""
    if hasattr(x, "detach"):
        if x.device.type != "cpu":
            return None
        return x.detach().numpy()
    return np.asarray(x)


class Skipping:
    """Iterates ``source`` without the skipped samples (see the module's docstring).

    ``ids``: a function giving a batch's sample ids (one per row), where the batch has no
    ``sample_ids`` field. ``len()`` is the source's (a DataLoader's length, for a sampler)."""

    def __init__(
        self,
        source: Iterable[Any],
        skips: SkipList,
        ids: Callable[[Any], Any] | None = None,
    ) -> None:
        self.source = source
        self.skips = skips
        self.ids = ids
        self.items_per_batch = 1  # items of one training batch (a dataset of samples: more)
        self.pending = 0  # items still to skip (a rewind's)
        self.skipped_items = 0  # items skipped by skip_next
        self.dropped_rows = 0  # rows (or indices) dropped as named
        self.unreadable = 0  # batches that could not be looked at

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def skip_next(self, n: int) -> None:
        """Drop the next ``n`` batches (``n * items_per_batch`` items), besides those pending."""
        self.pending += max(0, int(n)) * self.items_per_batch

    def __iter__(self) -> Iterator[Any]:
        for item in self.source:
            if self.pending:
                self.pending -= 1
                self.skipped_items += 1
                continue
            out = self._without_skipped(item) if self.skips else item
            if out is not None:
                yield out

    # ------------------------------------------------------------------ filtering
    def _without_skipped(self, item: Any) -> Any:
        """The item without its skipped samples; None when nothing is left."""
        try:
            if isinstance(item, int) and not isinstance(item, bool):
                if str(item) in self.skips.ids:
                    self.dropped_rows += 1
                    return None
                return item
            if isinstance(item, list) and item and all(isinstance(i, int) for i in item):
                kept = [i for i in item if str(i) not in self.skips.ids]
                self.dropped_rows += len(item) - len(kept)
                return kept or None
            return self._batch_without_skipped(item)
        except Exception:
            self._unreadable()
            return item

    def _unreadable(self) -> None:
        if not self.unreadable:
            log.warning(
                "steplens: skipping() cannot read a batch (on a device, or without ids or "
                "token ids): named samples in such batches pass; counted in .unreadable"
            )
        self.unreadable += 1

    def _batch_without_skipped(self, batch: Any) -> Any:
        drop = self._named_rows(batch)
        if drop is None:
            self._unreadable()
            return batch
        n, rows = drop
        if not rows:
            return batch
        self.dropped_rows += len(rows)
        if len(rows) == n:
            return None
        keep = [i for i in range(n) if i not in rows]
        if isinstance(batch, Mapping):
            out = {k: _take(v, keep, n) for k, v in batch.items()}
            make: Any = type(batch)
            try:
                return make(out)  # BatchEncoding and friends take a dict
            except Exception:
                return out
        if isinstance(batch, (tuple, list)):
            return type(batch)(_take(v, keep, n) for v in batch)
        return _take(batch, keep, n)

    def _named_rows(self, batch: Any) -> tuple[int, set[int]] | None:
        """(rows in the batch, the rows named by id or hash), or None: not readable."""
        skips = self.skips
        ids = self._batch_ids(batch) if skips.ids else None
        fields = token_fields(batch) if skips.hashes else None
        if ids is None and fields is None:
            return None
        named: set[int] = set()
        n = None
        if ids is not None:
            id_list = _id_list(ids)
            if id_list is None:
                return None
            n = len(id_list)
            named.update(i for i, v in enumerate(id_list) if v in skips.ids)
        if fields is not None:
            tokens = _host(fields[0])
            mask = None if fields[1] is None else _host(fields[1])
            if tokens is None or (fields[1] is not None and mask is None):
                return None
            if tokens.ndim == 1:  # one sample
                tokens = tokens[None, :]
                mask = None if mask is None else mask.reshape(1, -1)
            n = len(tokens)
            for i, row in enumerate(tokens):
                valid = row if mask is None else row[mask[i] != 0]
                if sample_hash(np.asarray(valid)) in skips.hashes:
                    named.add(i)
        return (n or 0), named

    def _batch_ids(self, batch: Any) -> Any:
        if self.ids is not None:
            return self.ids(batch)
        if isinstance(batch, Mapping):
            for name in _ID_FIELDS:
                if name in batch:
                    return batch[name]
        return None
