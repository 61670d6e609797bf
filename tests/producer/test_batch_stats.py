"""Batch statistics: histogram, over-length, labels, hashes equal for equal content."""

from __future__ import annotations

import numpy as np

from steplens.producer.pipeline.batch_stats import batch_payload, length_edges


def test_lengths_labels_hashes() -> None:
    ids = np.array([[5, 6, 7, 0], [5, 6, 7, 0], [9, 0, 0, 0]])
    mask = (ids != 0).astype(int)
    d, cut = batch_payload(ids, mask, labels=np.array([2, 2, 1]), max_len=2)
    assert cut == 0
    assert d["n_samples"] == 3 and d["length_max"] == 3 and d["over_length"] == 2
    assert sum(d["length_counts"]) == 3 and len(d["length_edges"]) == len(d["length_counts"]) + 1
    assert d["label_counts"] == {"2": 2, "1": 1} and "supervised_share" not in d
    h = d["sample_hashes"]
    assert h[0] == h[1] != h[2] and len(h[0]) == 16
    # the same content as a ragged Python list hashes the same
    assert batch_payload([[5, 6, 7], [9]])[0]["sample_hashes"] == [h[0], h[2]]


def test_token_labels_report_the_supervised_share_not_classes() -> None:
    """A packed language-model batch has no ignored label: {supervised, ignored} counts made
    an infinite class imbalance of it."""
    labels = np.array([[-100, 3, 4], [-100, -100, 5]])
    d, _ = batch_payload(np.ones((2, 3), dtype=np.int64), labels=labels)
    assert d["supervised_share"] == 0.5 and "label_counts" not in d
    packed, _ = batch_payload(np.ones((2, 3), dtype=np.int64), labels=np.ones((2, 3)))
    assert packed["supervised_share"] == 1.0 and "label_counts" not in packed
    # task="lm" with labels flattened to one dimension, and another ignore index
    flat, _ = batch_payload(
        np.ones((1, 4)), labels=np.array([0, 0, 7, 8]), task="lm", ignore_index=0
    )
    assert flat["supervised_share"] == 0.5 and "label_counts" not in flat
    assert length_edges(5) == [0, 1, 2, 4, 8]


def test_sample_ids_and_hashes_are_bounded_and_the_cut_counted() -> None:
    ids = np.arange(40).reshape(10, 4)
    d, cut = batch_payload(ids, sample_ids=[f"doc-{i}" for i in range(10)], max_samples=4)
    assert d["n_samples"] == 10 and cut == 6
    assert len(d["sample_hashes"]) == 4 and d["sample_ids"] == ["doc-0", "doc-1", "doc-2", "doc-3"]
    assert batch_payload(ids, sample_ids=np.arange(10) * 3)[0]["sample_ids"][:3] == ["0", "3", "6"]
