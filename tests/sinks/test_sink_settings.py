"""`steplens sink`'s options come from the sinks' settings declarations."""

from __future__ import annotations

import pytest

from steplens.schema.settings import given, resolve
from steplens.sinks.cli import _parser
from steplens.sinks.settings import InfluxSettings, RollSettings, S3Settings, SinkSettings


def test_each_store_takes_its_own_options(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_S3_PREFIX", "from-env")
    monkeypatch.setenv("STEPLENS_INFLUX_MAX_NAMES_PER_RUN", "7")
    args = _parser("sink").parse_args(["s3", "--bucket", "b", "--max-age-s", "2", "--no-setup"])
    s3 = resolve(S3Settings, given(S3Settings, args))
    roll = resolve(RollSettings, given(RollSettings, args))
    sink = resolve(SinkSettings, given(SinkSettings, args))
    assert (s3.bucket, s3.prefix) == ("b", "from-env")
    assert (roll.max_age_s, roll.max_bytes) == (2.0, RollSettings.max_bytes)
    assert (sink.setup, sink.port("s3"), sink.batch_size) == (False, 9466, 5000)
    args = _parser("sink").parse_args(["influx", "--hot-retention-s", "60", "--metrics-port", "0"])
    influx = resolve(InfluxSettings, given(InfluxSettings, args))
    assert (influx.hot_retention_s, influx.max_names_per_run) == (60, 7)
    assert resolve(SinkSettings, given(SinkSettings, args)).port("influx") == 0


def test_an_option_of_the_other_store_or_a_token_flag_is_refused() -> None:
    for argv in (["influx", "--max-age-s", "2"], ["s3", "--hot-retention-s", "5"]):
        with pytest.raises(SystemExit):
            _parser("sink").parse_args(argv)
    with pytest.raises(SystemExit):
        _parser("sink").parse_args(["influx", "--token", "secret"])
