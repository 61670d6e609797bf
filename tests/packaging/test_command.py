"""The `steplens` dispatcher in process, over entry points made here: it runs what is
registered, lists steplens's own commands with their help or what to install, and names the
distribution of a known command whose part is missing."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from steplens.schema import command as dispatcher
from steplens.schema.command import GROUP, KNOWN

CALLS: list[tuple[list[str], str]] = []


def fake_main(argv: list[str], prog: str) -> int:
    CALLS.append((argv, prog))
    return 7


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``worker`` of steplens's commands, and a third party's ``extra``."""
    eps = [EntryPoint(name, f"{__name__}:fake_main", GROUP) for name in ("worker", "extra")]
    monkeypatch.setattr(dispatcher, "entry_points", lambda group: eps if group == GROUP else [])
    CALLS.clear()


def test_a_registered_command_runs_with_its_arguments(installed: None) -> None:
    assert dispatcher.main(["worker", "--app-id", "a"]) == 7
    assert dispatcher.main(["extra"]) == 7
    assert CALLS == [(["--app-id", "a"], "steplens worker"), ([], "steplens extra")]


def test_the_listing_describes_what_is_installed_and_names_what_is_not(
    installed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dispatcher.main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = lines[lines.index("commands:") + 1 : lines.index("commands:") + 2 + len(KNOWN)]
    assert commands[0] == "  stack    (pip install steplens-stack)"
    assert f"  worker   {KNOWN['worker'][1]}" in commands
    assert "  sink     (pip install steplens-sinks)" in commands
    assert commands[-1] == "  extra"  # a third party's, after steplens's own
    assert CALLS == []  # listing imports no command


def test_a_missing_part_names_its_distribution_and_an_unknown_command_is_refused(
    installed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dispatcher.main(["sink", "influx"]) == 3
    assert "this command comes with steplens-sinks; install it" in capsys.readouterr().err
    assert dispatcher.main(["nonesuch"]) == 2
    assert "unknown command 'nonesuch'" in capsys.readouterr().err
    assert dispatcher.main([]) == 2
    assert CALLS == []
