"""A run shorter than the hardware interval still reports its host once, at shutdown."""

from __future__ import annotations


def test_a_run_shorter_than_the_interval_sends_one_hw_record(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(hw_interval_s=3600.0)
    m.log_step(0, loss=1.0)
    m.shutdown()
    hw = tx.records("hw")
    assert len(hw) == 1, [r.data for r in hw]
    assert 0 < hw[0].data["mem_available_bytes"] <= hw[0].data["mem_total_bytes"]


def test_a_run_that_sampled_sends_no_extra_record_at_shutdown(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    from waiting import wait_until

    m, tx = memory_monitor(hw_interval_s=0.05)
    assert wait_until(lambda: len(tx.records("hw")) >= 2)
    m.shutdown()
    assert len(tx.records("hw")) == m._hw.sent
