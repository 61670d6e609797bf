"""Which checks of the design a rank's settings and environment turn on, said once at ``init``
(one log line) and sent in ``run_meta`` (``checks``), so the report and the boards can say it.

Each check is ``on`` (its input flows at these settings), ``on use`` (it runs once the call
that feeds it is made: ``needs``), or ``off`` (``why``, and ``enable``: the one line that turns
it on). Only settings and installed packages are read here (no import of torch, NVML or
psutil); ``docs/checks.md`` is the same table at the defaults.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from steplens.producer.config import ProducerConfig
from steplens.producer.identity import Identity

ON, ON_USE, OFF = "on", "on use", "off"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _check(name: str, state: str, detail: str = "", enable: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"check": name, "state": state}
    if detail:
        out["needs" if state == ON_USE else "why"] = detail
    if enable:
        out["enable"] = enable
    return out


def design_checks(config: ProducerConfig, identity: Identity) -> list[dict[str, Any]]:
    """Every check of the design with its state at ``config`` on this rank."""
    c = config
    multi = identity.world_size > 1
    hw_on = c.hw_interval_s > 0
    hw_why = "hw_interval_s is 0"
    hw_enable = "STEPLENS_HW_INTERVAL_S=1"
    seq_len = (c.model_info or {}).get("seq_len", (c.model_info or {}).get("max_len"))
    batches = c.batch_every > 0
    out = [
        _check("loss spikes and divergence", ON_USE, "log_step(step, loss=loss)"),
        _check("loss volatility", ON_USE, "log_step(step, loss=loss)"),
        _check(
            "gradient norm spikes/explosion/vanishing",
            ON_USE,
            "log_step(..., grad_norm=clip_grad_norm_(...)) or watch()",
        ),
        _check("gradient clipping rate", ON_USE, "watch(..., max_grad_norm=1.0)"),
        _check("per-layer norms and update ratio", ON_USE, "watch(model, optimizer, every=10)"),
        _check("ARIMA forecasts (loss, grad norm, step time)", ON_USE, "log_step"),
        _check(
            "lr schedule",
            ON_USE if c.lr_schedule else OFF,
            "watch(model, optimizer, scheduler) or log_step(lr=)"
            if c.lr_schedule
            else "no declared schedule",
            "" if c.lr_schedule else 'sl.init(..., lr_schedule={"kind": "cosine", ...})',
        ),
        _check("throughput (tokens/s)", ON_USE, "log_step(..., tokens=n)"),
        _check(
            "MFU",
            ON_USE if c.flops_per_token and c.peak_flops else OFF,
            "log_step(..., tokens=n)"
            if c.flops_per_token and c.peak_flops
            else "flops_per_token or peak_flops not given",
            ""
            if c.flops_per_token and c.peak_flops
            else "sl.init(..., flops_per_token=6 * n_params, peak_flops=989e12)",
        ),
        _check("input pipeline wait", ON_USE, "for batch in sl.timed(loader)"),
        _check(
            "stragglers (step time across ranks)",
            ON if multi else OFF,
            "" if multi else "one rank",
        ),
        _check(
            "hangs (no progress) and stack dumps",
            ON if c.hang_dump_after_s != 0 else OFF,
            "" if c.hang_dump_after_s != 0 else "hang_dump_after_s is 0 (stacks off)",
            "" if c.hang_dump_after_s != 0 else "sl.init(..., hang_dump_after_s=None)",
        ),
    ]
    nvml = _installed("pynvml")
    gpu_state = ON if hw_on and nvml else OFF
    gpu_why = hw_why if not hw_on else ("" if nvml else "nvidia-ml-py not installed")
    gpu_enable = (
        hw_enable if not hw_on else ("" if nvml else 'pip install "steplens-producer[gpu]"')
    )
    out.append(_check("GPU util/memory/temperature/errors", gpu_state, gpu_why, gpu_enable))
    torch = _installed("torch")
    profile = "profile" in c.remedies
    out.append(
        _check(
            "profiler trace of a slow rank (straggler, idle GPU)",
            ON if profile and torch else OFF,
            ("torch not installed" if profile else "the profile remedy is off")
            if not (profile and torch)
            else "",
            ""
            if profile
            else ("STEPLENS_PROFILE=1" if not c.profile else 'sl.init(..., remedies=["profile"])'),
        )
    )
    out.append(
        _check(
            "GPU memory toward out-of-memory (allocator growth, retries, fragmentation)",
            ON if hw_on and torch else OFF,
            hw_why if not hw_on else ("" if torch else "torch not installed"),
            hw_enable if not hw_on else "",
        )
    )
    ps = _installed("psutil")
    host_why = hw_why if not hw_on else ("" if ps else "psutil not installed")
    host_enable = (
        hw_enable if not hw_on else ("" if ps else 'pip install "steplens-producer[host]"')
    )
    out.append(_check("host CPU/disk/network", ON if hw_on and ps else OFF, host_why, host_enable))
    # every rank's health record carries its process's memory and its host's
    out.append(_check("host memory toward out-of-memory (each rank's process)", ON, "", ""))
    timed = multi and c.comm_every > 0 and torch
    if timed:
        comm_why = (
            "watch(ddp_model, optimizer): its all-reduce is timed (other parallelisms: "
            "sl.probe_comm(every=100))"
        )
    elif not multi:
        comm_why = "one rank"
    else:
        comm_why = "comm_every is 0" if torch else "torch not installed"
    out.append(
        _check(
            "inter-rank communication latency over 50 ms",
            ON_USE if timed else OFF,
            comm_why,
            "STEPLENS_COMM_EVERY=100, or sl.probe_comm(every=100)"
            if multi and torch and not timed
            else "",
        )
    )
    out += [
        _check("validation loss and overfitting", ON_USE, "sl.log_eval(step, loss=val_loss)"),
        _check("accuracy/F1/perplexity", ON_USE, "sl.log_eval(step, accuracy=..., f1=...)"),
    ]
    text = _installed("sacrebleu") and _installed("rouge_score")
    out.append(
        _check(
            "BLEU/ROUGE",
            ON_USE if text else OFF,
            "sl.log_eval(step, predictions=..., references=...)"
            if text
            else "sacrebleu and rouge-score not installed",
            "" if text else 'pip install "steplens-producer[text]"',
        )
    )
    batch_why = "batch_every is 0"
    batch_enable = "STEPLENS_BATCH_EVERY=1, or sl.log_batch(step, input_ids)"
    for name, needs in (
        ("input length distribution", "sl.timed(loader) with input_ids"),
        ("duplicates and repeats", "sl.timed(loader) with input_ids"),
        ("label balance", "sl.timed(loader) with labels"),
    ):
        out.append(
            _check(
                name,
                ON_USE if batches else OFF,
                needs if batches else batch_why,
                "" if batches else batch_enable,
            )
        )
    out.append(
        _check(
            "over-length samples",
            ON_USE if batches and seq_len else OFF,
            "sl.timed(loader) with input_ids"
            if batches and seq_len
            else ("no maximum length" if batches else batch_why),
            "" if batches and seq_len else 'sl.init(..., model_info={"seq_len": 4096})',
        )
    )
    return out


def summary(checks: list[dict[str, Any]], remedies: Sequence[str] = ()) -> str:
    """The one log line: what runs, what waits for a call, what is off and how to turn it on,
    and the remedies the run opted into (advice read with ``sl.advice()``)."""
    on = [c["check"] for c in checks if c["state"] == ON]
    use = [c["check"] for c in checks if c["state"] == ON_USE]
    # names may hold commas (the ARIMA forecasts'): the lists are joined with " | "
    off = [
        f"{c['check']} ({c.get('why', 'off')}"
        + (f"; turn on: {c['enable']}" if c.get("enable") else "")
        + ")"
        for c in checks
        if c["state"] == OFF
    ]
    return (
        f"steplens checks: on: {' | '.join(on) or 'none'}; "
        f"on with their calls: {' | '.join(use) or 'none'}; "
        f"off: {' | '.join(off) or 'none'} (docs/checks.md); "
        f"remedies: {', '.join(remedies) or 'none'}"
    )
