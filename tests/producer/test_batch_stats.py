"""Batch statistics: histogram, over-length, labels, hashes equal for equal content."""

from __future__ import annotations

import numpy as np

from steplens.producer.batch_stats import batch_payload, length_edges


def test_lengths_labels_hashes() -> None:
    ids = np.array([[5, 6, 7, 0], [5, 6, 7, 0], [9, 0, 0, 0]])
    mask = (ids != 0).astype(int)
    d = batch_payload(ids, mask, labels=np.array([2, 2, 1]), max_len=2)
    assert d["n_samples"] == 3 and d["length_max"] == 3 and d["over_length"] == 2
    assert sum(d["length_counts"]) == 3 and len(d["length_edges"]) == len(d["length_counts"]) + 1
    assert d["label_counts"] == {"2": 2, "1": 1}
    h = d["sample_hashes"]
    assert h[0] == h[1] != h[2] and len(h[0]) == 16
    # the same content as a ragged Python list hashes the same
    assert batch_payload([[5, 6, 7], [9]])["sample_hashes"] == [h[0], h[2]]


def test_token_labels_and_edges() -> None:
    labels = np.array([[-100, 3, 4], [-100, -100, 5]])
    d = batch_payload(np.ones((2, 3), dtype=np.int64), labels=labels)
    assert d["label_counts"] == {"supervised": 3, "ignored": 3}
    assert length_edges(5) == [0, 1, 2, 4, 8]
