"""BLEU and ROUGE-L of predictions against references, for ``log_eval(predictions=...,
references=...)``. Runs in the producer's worker thread, never the caller's.

The scores are the libraries' own (the ``text`` extra): corpus BLEU from sacrebleu (0..100,
its default 13a tokenisation, one reference per prediction) and the mean ROUGE-L F-measure of
Google's rouge-score (0..1, with stemming). Without them nothing is computed, and the
producer says so once.
"""

from __future__ import annotations

from typing import Any

MAX_PAIRS = 10_000  # (prediction, reference) pairs scored per call; more is a misuse


class MissingExtra(ImportError):
    """sacrebleu or rouge-score is not installed."""


_SCORER: Any = None


def _rouge_scorer() -> Any:
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer

        _SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return _SCORER


def text_scores(predictions: list[Any], references: list[Any]) -> dict[str, float]:
    """``{"bleu": ..., "rouge": ...}``; raises ValueError for lists that do not pair up and
    ``MissingExtra`` without the libraries."""
    if len(predictions) != len(references):
        raise ValueError(
            f"{len(predictions)} predictions for {len(references)} references: one each"
        )
    if not predictions:
        raise ValueError("no predictions to score")
    if len(predictions) > MAX_PAIRS:
        raise ValueError(f"{len(predictions):,} pairs: at most {MAX_PAIRS:,} per call")
    try:
        import sacrebleu

        scorer = _rouge_scorer()
    except ImportError as exc:
        raise MissingExtra(str(exc)) from None
    preds = [str(p) for p in predictions]
    refs = [str(r) for r in references]
    bleu = sacrebleu.corpus_bleu(preds, [refs]).score
    rouge = sum(scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(preds, refs, strict=True))
    return {"bleu": float(bleu), "rouge": rouge / len(preds)}
