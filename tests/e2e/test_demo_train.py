"""The demo's model and schedule, without Kafka: the model really learns the corpus."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from steplens.sinks.report_figures import declared_lr  # noqa: E402
from steplens.stack.demo_corpus import VOCAB, Grammar, make_batch  # noqa: E402
from steplens.stack.demo_train import TinyLM, corrupted_batch, cosine_lr, lm_loss  # noqa: E402


def test_loss_falls_well_below_uniform_guessing():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM(len(VOCAB), 48)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    grammar = Grammar(np.random.default_rng(0))
    first = None
    for _ in range(60):
        ids = torch.from_numpy(make_batch(grammar, 16, 48)[0])
        loss, n_tokens = lm_loss(model, ids)
        assert n_tokens > 0
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    uniform = math.log(len(VOCAB))
    assert abs(first - uniform) < 1.0  # starts near chance: a small initialisation
    held_out = torch.from_numpy(make_batch(Grammar(np.random.default_rng(99)), 32, 48)[0])
    with torch.no_grad():
        final = lm_loss(model, held_out)[0].item()
    assert final < 0.75 * uniform


def test_corrupted_batch_is_over_length_noise():
    rows = corrupted_batch(np.random.default_rng(0), 4, 48)
    assert rows.shape == (4, 96)
    assert rows.min() >= 3 and rows.max() < len(VOCAB)


@pytest.mark.parametrize("step", [0, 5, 9, 10, 11, 50, 150, 299, 300, 400])
def test_declared_schedule_matches_the_training_schedule(step):
    schedule = {
        "kind": "cosine",
        "peak_lr": 3e-3,
        "min_lr": 3e-4,
        "warmup_steps": 10,
        "total_steps": 300,
    }
    ours = cosine_lr(step, 3e-3, 3e-4, 10, 300)
    theirs = float(declared_lr(schedule, np.array([step]))[0])
    assert ours == pytest.approx(theirs, rel=1e-9)


def test_cosine_schedule_shape():
    assert cosine_lr(9, 1.0, 0.1, 10, 110) == pytest.approx(1.0)
    assert cosine_lr(60, 1.0, 0.1, 10, 110) == pytest.approx(0.55)
    assert cosine_lr(110, 1.0, 0.1, 10, 110) == pytest.approx(0.1)
    assert cosine_lr(500, 1.0, 0.1, 10, 110) == pytest.approx(0.1)


def _steplens_calls(source: str) -> list[tuple[str, int, tuple[tuple[str | None, object], ...]]]:
    """Each ``sl.<name>(...)`` call: its name, how many positional arguments, and its keywords
    (``None`` for ``**``), with their values for ``watch`` (its interval and clipping)."""
    import ast

    out = []
    for node in ast.walk(ast.parse(source)):
        func = getattr(node, "func", None)
        if not (isinstance(node, ast.Call) and isinstance(func, ast.Attribute)):
            continue
        if not (isinstance(func.value, ast.Name) and func.value.id == "sl"):
            continue
        kws = tuple((k.arg, k.value.value if func.attr == "watch" else None) for k in node.keywords)
        out.append((func.attr, len(node.args), kws))
    return sorted(out, key=lambda c: c[0])


def test_the_demo_instruments_itself_as_the_readme_shows():
    """The README's snippet is the demo's instrumentation: the same steplens calls, the same
    arguments, at the same defaults (no sampling or step time the README does not show)."""
    import inspect
    import re
    from pathlib import Path

    import steplens.stack.demo_train as demo

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## Instrument a training script", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None
    ours = _steplens_calls(snippet.group(1))
    theirs = _steplens_calls(inspect.getsource(demo))
    assert [c[0] for c in ours] == [
        "act", "checkpoint", "init", "log_eval", "log_step", "shutdown", "skipping", "timed",
        "watch",
    ]  # fmt: skip
    assert theirs == ours
