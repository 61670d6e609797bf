"""log_eval from predictions and references (the text extra), log_batch's ids, epoch and
language-model labels, through a real Monitor."""

from __future__ import annotations

import logging
import sys
import threading

import pytest

PREDICTIONS = ["the cat sat on the mat", "a dog barked at the moon", "hello world"]
REFERENCES = ["the cat sat on the mat", "the dog barked at the moon", "goodbye world"]


def test_bleu_and_rouge_are_computed_by_the_libraries_in_the_worker(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    sacrebleu = pytest.importorskip("sacrebleu")
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    from steplens.producer.pipeline import text_scores

    threads: list[str] = []
    real = text_scores.text_scores

    def spy(p, r):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return real(p, r)

    m, tx = memory_monitor()
    text_scores.text_scores = spy
    try:
        m.log_eval(10, split="val", loss=1.2, predictions=PREDICTIONS, references=REFERENCES)
        m.log_eval(20, split="val", bleu=50.0, predictions=PREDICTIONS, references=REFERENCES)
        m.shutdown()
    finally:
        text_scores.text_scores = real
    first, second = (r.data for r in tx.records("eval"))
    bleu = sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rouge = sum(
        scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(PREDICTIONS, REFERENCES, strict=True)
    ) / len(PREDICTIONS)
    assert first["bleu"] == pytest.approx(bleu) and 0 < first["bleu"] < 100
    assert first["rouge"] == pytest.approx(rouge) and first["loss"] == 1.2
    assert second["bleu"] == 50.0 and second["rouge"] == pytest.approx(rouge)  # caller's wins
    assert threads == ["steplens-producer", "steplens-producer"]


def test_without_the_extra_the_rest_is_sent_and_it_is_said_once(  # type: ignore[no-untyped-def]
    memory_monitor, monkeypatch, caplog
) -> None:
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import fails as when not installed
    m, tx = memory_monitor()
    with caplog.at_level(logging.WARNING, logger="steplens"):
        for step in (1, 2):
            m.log_eval(step, loss=2.0, accuracy=0.5, predictions=["a"], references=["a"])
        m.log_eval(3, loss=2.0, predictions=["a", "b"], references=["a"])  # not paired
        m.shutdown()
    evals = [r.data for r in tx.records("eval")]
    assert [e["loss"] for e in evals] == [2.0, 2.0, 2.0] and evals[0]["accuracy"] == 0.5
    assert all("bleu" not in e and "rouge" not in e for e in evals)
    said = [
        msg
        for msg in (r.getMessage() for r in caplog.records)
        if "BLEU" in msg and not msg.startswith("steplens checks:")  # init's list of checks
    ]
    assert len(said) == 2 and "steplens-producer[text]" in said[0] and "one each" in said[1]
    assert m.stats()["errors"]["text_extra_missing"] == 2


def test_batches_carry_ids_epoch_and_the_supervised_share(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    m, tx = memory_monitor()
    ids = torch.arange(24).reshape(4, 6)
    labels = ids.clone()
    labels[:, :2] = -100  # the prompt carries no loss
    m.log_batch(5, ids, labels=labels, sample_ids=["a", "b", "c", "d"], epoch=2, max_len=4)
    m.log_batch(6, ids, labels=torch.tensor([0, 1, 1, 1]), sample_ids=torch.tensor([7, 8, 9, 10]))
    m.log_batch(7, ids, epoch=-1)  # refused: counted, the others kept
    m.log_batch(8, ids, task="regression")
    m.shutdown()
    lm, cls = (r.data for r in tx.records("batch"))
    assert lm["supervised_share"] == pytest.approx(4 / 6) and "label_counts" not in lm
    assert lm["sample_ids"] == ["a", "b", "c", "d"] and lm["epoch"] == 2
    assert lm["over_length"] == 4 and len(lm["sample_hashes"]) == 4
    assert cls["label_counts"] == {"1": 3, "0": 1} and cls["sample_ids"] == ["7", "8", "9", "10"]
    assert "epoch" not in cls
    assert m.stats()["dropped"]["bad_batch"] == 2


def test_timed_batches_go_to_the_data_quality_checks_with_their_step(memory_monitor):
    """timed() hands each batch that holds token ids to the data-quality path with the step
    logged after it: a dict of tensors (a collator's), the model's sequence length as the
    maximum; float features are left alone."""
    torch = pytest.importorskip("torch")
    m, t = memory_monitor(model_info={"seq_len": 8})
    ids = torch.arange(30).reshape(3, 10)
    loader = [
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        torch.zeros(3, 10),  # features, not tokens
        (ids[:2, :5], torch.tensor([0, 1])),
    ]
    for step, _batch in enumerate(m.timed(loader), start=7):
        m.log_step(step, loss=1.0)
    m.flush(5)
    got = {r.step: r.data for r in t.records("batch")}
    assert set(got) == {7, 9}
    assert got[7]["n_samples"] == 3 and got[7]["over_length"] == 3 and got[7]["max_len"] == 8
    assert got[9]["n_samples"] == 2 and got[9]["over_length"] == 0
    assert got[9]["label_counts"] == {"0": 1, "1": 1}


@pytest.mark.parametrize(("every", "expected"), [(2, [1, 3]), (0, [])])
def test_timed_batches_are_sampled_one_in_batch_every(memory_monitor, every, expected):
    torch = pytest.importorskip("torch")
    m, t = memory_monitor(batch_every=every)
    loader = [torch.arange(4 * i, 4 * i + 4).reshape(2, 2) for i in range(4)]
    for step, _batch in enumerate(m.timed(loader)):
        m.log_step(step, loss=1.0)
    m.flush(5)
    assert [r.step for r in t.records("batch")] == expected
