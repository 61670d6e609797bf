"""Data quality of one batch: token-length histogram, over-length count, label counts and a
content hash per sample (MD5 of the valid token ids as little-endian int64, first 16 hex digits),
so the stream side can count duplicates across ranks. Runs in the worker thread."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import numpy as np

HASH_HEX_DIGITS = 16
MAX_LABELS = 256
IGNORE_INDEX = -100  # the usual "no loss here" label


def _rows(x: Any) -> list[np.ndarray]:
    """A batch as a list of 1-D int64 arrays (ragged lists allowed)."""
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        if x.ndim == 1:
            x = x[None, :]
        return [np.asarray(r, dtype="<i8") for r in x]
    return [np.asarray(r, dtype="<i8").reshape(-1) for r in x]


def length_edges(longest: int) -> list[int]:
    """0, 1, 2, 4, ... up to the first power of two above ``longest``."""
    edges, e = [0, 1], 1
    while e <= longest:
        e *= 2
        edges.append(e)
    return edges


def sample_hash(tokens: np.ndarray) -> str:
    return hashlib.md5(tokens.astype("<i8").tobytes(), usedforsecurity=False).hexdigest()[
        :HASH_HEX_DIGITS
    ]


def batch_payload(
    input_ids: Any, attention_mask: Any = None, labels: Any = None, max_len: int | None = None
) -> dict[str, Any]:
    rows = _rows(input_ids)
    masks = _rows(attention_mask) if attention_mask is not None else None
    tokens = [
        r[m != 0] if masks is not None else r for r, m in zip(rows, masks or rows, strict=True)
    ]
    lengths = [int(t.size) for t in tokens]
    longest = max(lengths, default=0)
    edges = length_edges(longest)
    counts = np.histogram(lengths, bins=edges)[0].tolist() if lengths else [0] * (len(edges) - 1)
    data: dict[str, Any] = {
        "n_samples": len(rows),
        "length_edges": edges,
        "length_counts": [int(c) for c in counts],
        "length_max": longest,
        "sample_hashes": [sample_hash(t) for t in tokens],
    }
    if lengths:
        data["length_mean"] = float(sum(lengths)) / len(lengths)
    if max_len is not None:
        data["max_len"] = int(max_len)
        data["over_length"] = sum(1 for n in lengths if n > max_len)
    if labels is not None:
        data["label_counts"] = label_counts(labels)
    return data


def label_counts(labels: Any) -> dict[str, int]:
    """Per-class counts for one label per sample; supervised vs ignored tokens for token labels."""
    if hasattr(labels, "detach"):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim >= 2:
        ignored = int((arr == IGNORE_INDEX).sum())
        return {"supervised": int(arr.size) - ignored, "ignored": ignored}
    counter = Counter(str(v) for v in arr.reshape(-1).tolist())
    return dict(counter.most_common(MAX_LABELS))
