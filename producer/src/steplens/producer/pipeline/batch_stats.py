"""Data quality of one batch: token-length histogram, over-length count, labels and a content
hash per sample (MD5 of the valid token ids as little-endian int64, first 16 hex digits), so the
stream side can count duplicates across ranks and over the run. Runs in the worker thread.

Labels: a classification batch (one label per sample) sends its per-class counts; a language
model batch (token labels, or ``task="lm"``) sends the share of supervised tokens instead
(tokens whose label is not ``ignore_index``): a packed batch has no ignored token, and counts
of {supervised, ignored} would make a class imbalance of what is none.

At most ``max_samples`` hashes and ids go into one record (the first ones); the rest are
counted by the caller of ``batch_payload`` as cut, and ``n_samples`` stays the true count.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import numpy as np

HASH_HEX_DIGITS = 16
MAX_LABELS = 256
MAX_SAMPLES = 1024  # hashes (and ids) per record: about 20 KB of a 1 MiB record
MAX_ID_LEN = 256  # characters of one sample id
IGNORE_INDEX = -100  # the usual "no loss here" label
TASKS = ("lm", "classification")


def _rows(x: Any) -> list[np.ndarray]:
    """A batch as a list of 1-D int64 arrays (ragged lists allowed)."""
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        if x.ndim == 1:
            x = x[None, :]
        return [np.asarray(r, dtype="<i8") for r in x]
    return [np.asarray(r, dtype="<i8").reshape(-1) for r in x]


def _array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


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


def batch_payload(  # noqa: PLR0917 - one argument per log_batch argument
    input_ids: Any,
    attention_mask: Any = None,
    labels: Any = None,
    max_len: int | None = None,
    task: str | None = None,
    ignore_index: int = IGNORE_INDEX,
    sample_ids: Any = None,
    max_samples: int = MAX_SAMPLES,
) -> tuple[dict[str, Any], int]:
    """The ``batch`` payload (without ``epoch``) and how many samples' hashes were cut."""
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
        "sample_hashes": [sample_hash(t) for t in tokens[:max_samples]],
    }
    if lengths:
        data["length_mean"] = float(sum(lengths)) / len(lengths)
    if max_len is not None:
        data["max_len"] = int(max_len)
        data["over_length"] = sum(1 for n in lengths if n > max_len)
    if labels is not None:
        arr = _array(labels)
        if task == "lm" or (task is None and arr.ndim >= 2):
            share = supervised_share(arr, ignore_index)
            if share is not None:
                data["supervised_share"] = share
        else:
            data["label_counts"] = label_counts(arr)
    if sample_ids is not None:
        data["sample_ids"] = [str(i)[:MAX_ID_LEN] for i in _id_list(sample_ids, max_samples)]
    return data, max(0, len(rows) - max_samples)


def _id_list(ids: Any, limit: int) -> list[Any]:
    if hasattr(ids, "detach") or isinstance(ids, np.ndarray):
        return _array(ids).reshape(-1)[:limit].tolist()
    out = []
    for i, v in enumerate(ids):
        if i >= limit:
            break
        out.append(v)
    return out


def supervised_share(labels: np.ndarray, ignore_index: int = IGNORE_INDEX) -> float | None:
    """Share of token labels that carry a loss; None for an empty batch."""
    if labels.size == 0:
        return None
    return float((labels != ignore_index).sum()) / labels.size


def label_counts(labels: Any) -> dict[str, int]:
    """Per-class counts of one label per sample (the ``MAX_LABELS`` most common)."""
    arr = _array(labels)
    counter = Counter(str(v) for v in arr.reshape(-1).tolist())
    return dict(counter.most_common(MAX_LABELS))
