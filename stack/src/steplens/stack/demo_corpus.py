"""A small synthetic corpus with real structure, so a tiny language model can learn it.

Documents are sentences from a probabilistic grammar with number agreement (``the cat sees``
vs ``the cats see``) and a topic per document (nouns come from the document's topic), so the
next token is predictable from short and longer context and the loss falls well below
``ln(vocab)``. Nothing is downloaded; the same seed gives the same corpus.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", ".")

TOPICS: dict[str, tuple[str, ...]] = {
    "farm": ("cow", "horse", "pig", "goat", "farmer", "dog"),
    "sea": ("fish", "whale", "boat", "sailor", "crab", "gull"),
    "city": ("car", "bus", "driver", "shop", "clerk", "tram"),
    "forest": ("wolf", "bear", "owl", "fox", "deer", "hunter"),
}
ADJECTIVES = ("big", "small", "old", "young", "quick", "quiet", "red", "grey")
DETERMINERS = ("the", "a", "every", "that")
# verb stem -> (singular form, plural form)
TRANSITIVE = {"see": ("sees", "see"), "chase": ("chases", "chase"), "like": ("likes", "like")}
INTRANSITIVE = {"sleep": ("sleeps", "sleep"), "run": ("runs", "run"), "wait": ("waits", "wait")}
ADVERBS = ("slowly", "today", "again", "loudly")


def _vocabulary() -> list[str]:
    words: list[str] = list(SPECIALS)
    for nouns in TOPICS.values():
        for noun in nouns:
            words += [noun, noun + "s"]
    words += list(ADJECTIVES) + list(DETERMINERS) + list(ADVERBS)
    for forms in (*TRANSITIVE.values(), *INTRANSITIVE.values()):
        words += list(forms)
    return list(dict.fromkeys(words))


VOCAB: list[str] = _vocabulary()
MAX_SENTENCE = 8  # det adj noun verb det adj noun "."
WORD_ID: dict[str, int] = {w: i for i, w in enumerate(VOCAB)}


@dataclass
class Grammar:
    """Sentence generator; one instance per stream so ranks can draw independently."""

    rng: np.random.Generator

    def _pick(self, options: tuple[str, ...] | list[str]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def noun_phrase(self, topic: str) -> tuple[list[str], bool]:
        plural = bool(self.rng.random() < 0.4)
        det = "the" if plural else self._pick(DETERMINERS)
        words = [det]
        if self.rng.random() < 0.5:
            words.append(self._pick(ADJECTIVES))
        noun = self._pick(TOPICS[topic])
        words.append(noun + "s" if plural else noun)
        return words, plural

    def sentence(self, topic: str) -> list[str]:
        subject, plural = self.noun_phrase(topic)
        form = 1 if plural else 0
        if self.rng.random() < 0.6:
            verb = TRANSITIVE[self._pick(tuple(TRANSITIVE))][form]
            obj, _ = self.noun_phrase(topic)
            words = [*subject, verb, *obj]
        else:
            verb = INTRANSITIVE[self._pick(tuple(INTRANSITIVE))][form]
            words = [*subject, verb]
            if self.rng.random() < 0.5:
                words.append(self._pick(ADVERBS))
        return [*words, "."]

    def document(self, min_len: int, max_len: int) -> list[int]:
        """Token ids of one document: BOS then whole sentences, at most ``max_len`` tokens and
        at least ``min_len - MAX_SENTENCE`` (it stops before a sentence that does not fit)."""
        topic = self._pick(tuple(TOPICS))
        target = int(self.rng.integers(min_len, max_len + 1))
        ids = [BOS]
        while True:
            sent = [WORD_ID[w] for w in self.sentence(topic)]
            if len(ids) + len(sent) > target:
                break
            ids += sent
        if len(ids) == 1:  # a target shorter than one sentence: cut a sentence
            ids += [WORD_ID[w] for w in self.sentence(topic)][: target - 1]
        return ids


def make_batch(grammar: Grammar, batch_size: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), both ``(batch_size, max_len)`` int64, padded with PAD."""
    ids = np.full((batch_size, max_len), PAD, dtype=np.int64)
    mask = np.zeros((batch_size, max_len), dtype=np.int64)
    for row in range(batch_size):
        doc = grammar.document(max_len // 2, max_len)
        ids[row, : len(doc)] = doc
        mask[row, : len(doc)] = 1
    return ids, mask


def decode(ids: list[int] | np.ndarray) -> str:
    return " ".join(VOCAB[int(i)] for i in ids if int(i) != PAD)
