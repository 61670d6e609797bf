"""The synthetic corpus: real structure (agreement, topics), padding, determinism."""

from __future__ import annotations

import numpy as np

from steplens.stack.demo_corpus import (
    EOS,
    MAX_SENTENCE,
    PAD,
    TOPICS,
    TRANSITIVE,
    VOCAB,
    WORD_ID,
    Grammar,
    decode,
    make_batch,
)


def test_same_seed_same_corpus_other_seed_other_corpus():
    a = make_batch(Grammar(np.random.default_rng(1)), 8, 48)[0]
    b = make_batch(Grammar(np.random.default_rng(1)), 8, 48)[0]
    c = make_batch(Grammar(np.random.default_rng(2)), 8, 48)[0]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_batches_are_padded_documents_within_length():
    ids, mask = make_batch(Grammar(np.random.default_rng(3)), 32, 48)
    assert ids.shape == mask.shape == (32, 48)
    lengths = mask.sum(axis=1)
    assert (lengths >= 24 - MAX_SENTENCE).all() and (lengths <= 48).all()
    assert ((ids == PAD) == (mask == 0)).all()
    for row, n in zip(ids, lengths, strict=True):
        assert row[n - 1] == EOS  # documents end on a whole sentence


def test_sentences_are_never_longer_than_the_bound():
    g = Grammar(np.random.default_rng(6))
    assert max(len(g.sentence("sea")) for _ in range(500)) == MAX_SENTENCE


def test_subject_and_verb_agree_in_number():
    g = Grammar(np.random.default_rng(4))
    singular = {forms[0] for forms in TRANSITIVE.values()}
    plural = {forms[1] for forms in TRANSITIVE.values()}
    checked = 0
    for _ in range(300):
        words = g.sentence("farm")
        verbs = [w for w in words if w in singular | plural]
        if not verbs:
            continue
        noun = words[words.index(verbs[0]) - 1]
        assert (noun.endswith("s")) == (verbs[0] in plural), " ".join(words)
        checked += 1
    assert checked > 50


def test_documents_keep_to_one_topic():
    g = Grammar(np.random.default_rng(5))
    nouns = {t: set(ns) | {n + "s" for n in ns} for t, ns in TOPICS.items()}
    for _ in range(50):
        words = set(decode(g.document(24, 48)).split())
        assert sum(bool(words & ns) for ns in nouns.values()) == 1


def test_vocabulary_is_unique_and_indexed():
    assert len(VOCAB) == len(set(VOCAB)) == len(WORD_ID)
    assert VOCAB[PAD] == "<pad>" and VOCAB[EOS] == "."
