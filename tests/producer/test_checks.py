"""The checks of the design, said at init: one log line, the run_meta's list, the docs' table."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from steplens.producer.checks import OFF, ON_USE, design_checks
from steplens.producer.config import ProducerConfig
from steplens.producer.identity import Identity

README_INIT = {
    "flops_per_token": 6e9,
    "peak_flops": 989e12,
    "lr_schedule": {"kind": "cosine", "peak_lr": 3e-4, "warmup_steps": 10, "total_steps": 100},
    "model_info": {"seq_len": 4096},
}


def _states(world_size: int = 2, **config) -> dict[str, dict]:
    ident = Identity("r", 0, 0, world_size, "host")
    return {c["check"]: c for c in design_checks(ProducerConfig.resolve(**config), ident)}


def test_the_docs_table_lists_every_check():
    table = (Path(__file__).parents[2] / "docs" / "checks.md").read_text()
    documented = re.findall(r"^\| ([^|]+?) \|", table, re.M)[1:]
    assert [d for d in documented if not d.startswith("---")] == list(_states())


def test_at_the_readmes_init_every_check_is_on_where_its_packages_are():
    got = _states(**README_INIT)
    off = {name for name, c in got.items() if c["state"] == OFF}
    assert off <= {"BLEU/ROUGE"} | {
        "GPU util/memory/temperature/errors",  # where nvidia-ml-py is not installed
        "host CPU/disk/network",
    }
    comm = got["inter-rank communication latency over 50 ms"]
    assert comm["state"] == ON_USE and "watch(ddp_model" in comm["needs"]
    memory = got["GPU memory toward out-of-memory (allocator growth, retries, fragmentation)"]
    assert memory["state"] == "on"  # torch is installed here
    comm = _states(comm_every=0)["inter-rank communication latency over 50 ms"]
    assert comm["state"] == OFF and "sl.probe_comm(every=100)" in comm["enable"]


def test_an_off_check_says_why_and_the_line_that_turns_it_on():
    got = _states(world_size=1, batch_every=0)
    assert got["MFU"]["state"] == OFF
    assert "flops_per_token" in got["MFU"]["enable"]
    assert got["duplicates and repeats"] == {
        "check": "duplicates and repeats",
        "state": OFF,
        "why": "batch_every is 0",
        "enable": "STEPLENS_BATCH_EVERY=1, or sl.log_batch(step, input_ids)",
    }
    assert got["stragglers (step time across ranks)"]["why"] == "one rank"
    assert got["loss spikes and divergence"]["state"] == ON_USE


def test_init_logs_one_line_and_sends_the_list_in_run_meta(memory_monitor, caplog):
    with caplog.at_level(logging.INFO, logger="steplens"):
        m, t = memory_monitor(rank=0, world_size=1)
        m.flush(5)
    lines = [r for r in caplog.records if r.getMessage().startswith("steplens checks:")]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING  # MFU is off here
    assert (
        "MFU (flops_per_token or peak_flops not given; turn on: sl.init(" in lines[0].getMessage()
    )
    (meta,) = t.records("run_meta")
    assert [c["check"] for c in meta.data["checks"]] == list(_states())


def test_the_profiler_trace_is_on_by_default_and_says_how_it_was_turned_off():
    name = "profiler trace of a slow rank (straggler, idle GPU)"
    assert _states(world_size=1)[name] == {"check": name, "state": "on"}  # torch installed
    off = _states(remedies=[])[name]
    assert off["state"] == OFF and off["why"] == "the profile remedy is off"
    assert off["enable"] == 'sl.init(..., remedies=["profile"])'
    assert _states(profile=False)[name]["enable"] == "STEPLENS_PROFILE=1"
