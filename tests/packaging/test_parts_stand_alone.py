"""Each deployable part stands alone: the `steplens` command comes with the wire contract
(steplens-schema), which every part depends on, and a part installed without the stack brings
its own subcommands (entry-point group
``steplens.commands``); a command of a part that is missing names the distribution to install.

The parts are built into wheels once (``make wheels``) and installed into fresh virtual
environments (no system site packages): the schema with its one dependency, the other parts
without theirs,
since what is checked is the packaging, the command table and the arguments parsing. That the
dependencies of each part resolve under the project's constraints is checked by pip's resolver
(``--dry-run``, reading the registry's metadata, installing nothing), which costs no
downloads of the dependencies themselves. The README's install line for the training
environment is run as written (offline: without the dependencies, which it states and the
wheels' metadata must match).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from steplens.schema import command as dispatcher
from steplens.schema.command import GROUP, KNOWN

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PARTS = {
    "schema": "steplens-schema",
    "producer": "steplens-producer",
    "stream_jobs": "steplens-stream-jobs",
    "sinks": "steplens-sinks",
    "stack": "steplens-stack",
}


def _clean_env() -> dict[str, str]:
    # without this environment's own path and venv, or pip sees the parts as installed here
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``make wheels`` with this environment (its setup taken as done) into a folder of its own."""
    out = tmp_path_factory.mktemp("dist")
    venv = Path(sys.prefix)
    made = subprocess.run(
        ["make", "-s", "-o", f"{venv}/.installed", "wheels", f"VENV={venv}", f"DIST={out}"],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    return {part: found[dist.replace("-", "_")] for part, dist in PARTS.items()}


def _venv(tmp: Path, wheels: dict[str, Path], *parts: str) -> Path:
    """A fresh environment with the schema (and msgspec) and these parts (without theirs)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    python = str(tmp / "bin" / "python")
    constraints = str(ROOT / "constraints.txt")
    _pip("--python", python, "install", "-q", "-c", constraints, str(wheels["schema"]))
    _pip("--python", python, "install", "-q", "--no-deps", *(str(wheels[p]) for p in parts))
    return tmp / "bin" / "steplens"


def _run(steplens: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}  # nothing of the development environment
    return subprocess.run(
        [str(steplens), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_stream_jobs_alone_gives_the_worker(tmp_path: Path, wheels: dict[str, Path]) -> None:
    steplens = _venv(tmp_path / "env", wheels, "stream_jobs")
    listing = _run(steplens, "--help").stdout
    assert "worker   run a Faust worker" in listing
    assert "sink     (pip install steplens-sinks)" in listing
    assert "stack    (pip install steplens-stack)" in listing
    done = _run(steplens, "worker", "--help")
    assert done.returncode == 0, done.stderr
    assert "--max-runs" in done.stdout
    for command, dist in (("sink", "steplens-sinks"), ("stack", "steplens-stack")):
        missing = _run(steplens, command, "up")
        assert missing.returncode == 3
        assert f"this command comes with {dist}; install it" in missing.stderr
    python = steplens.parent / "python"
    probe = subprocess.run(
        [str(python), "-c", "import steplens.stack"], capture_output=True, check=False
    )
    assert probe.returncode != 0  # the stack really is absent


def test_sinks_alone_give_the_sink_commands(tmp_path: Path, wheels: dict[str, Path]) -> None:
    steplens = _venv(tmp_path / "env", wheels, "sinks")
    listing = _run(steplens, "--help").stdout
    for name in ("sink", "query", "replay", "report", "mlflow"):
        assert f"\n  {name:<8} {KNOWN[name][1]}" in listing
    assert "worker   (pip install steplens-stream-jobs)" in listing
    done = _run(steplens, "mlflow", "--help")
    assert done.returncode == 0, done.stderr
    missing = _run(steplens, "worker")
    assert missing.returncode == 3 and "steplens-stream-jobs" in missing.stderr


def _readme_install() -> tuple[str, set[str]]:
    """The README's install line for the training environment, and what it says the producer
    depends on (the names in backquotes after "The producer depends on", to the semicolon)."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"`(pip install dist/[^`]+)`", text)
    assert found, "README.md: no `pip install dist/...` line"
    said = text.split("The producer depends on", 1)[1].split(";", 1)[0]
    return found.group(1), set(re.findall(r"`([^`]+)`", said))


def test_the_readme_install_line_works_as_written(tmp_path: Path, wheels: dict[str, Path]) -> None:
    """Run in a folder whose dist/ holds what ``make wheels`` built, into a fresh environment,
    offline and without dependencies: exactly the schema and the producer are installed, with
    the extras the line names, and the dependencies the wheels declare are those the README
    states."""
    line, said = _readme_install()
    (tmp_path / "dist").symlink_to(wheels["schema"].parent)
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    pip = f"{shlex.quote(sys.executable)} -m pip --disable-pip-version-check"
    pip += f" --python {env}/bin/python"
    command = line.replace("pip install", f"{pip} install --no-index --no-deps", 1)
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "does not provide the extra" not in done.stderr, done.stderr
    probe = (
        "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: "
        "[d.requires or [], d.metadata.get_all('Provides-Extra') or []] "
        "for d in m.distributions()}))"
    )
    installed = json.loads(
        subprocess.run(
            [str(env / "bin" / "python"), "-c", probe],
            env=_clean_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert set(installed) == {"steplens-schema", "steplens-producer"}
    base = {
        Requirement(r).name
        for requires, _ in installed.values()
        for r in requires
        if Requirement(r).marker is None
    }
    assert base == said, f"README.md says the producer depends on {said}; the wheels: {base}"
    extras = set(re.search(r"\[([a-z,]+)\]", line).group(1).split(","))  # type: ignore[union-attr]
    assert extras <= set(installed["steplens-producer"][1])


@pytest.mark.parametrize("part", ["stream_jobs", "sinks"])
def test_a_part_resolves_under_the_constraints(
    tmp_path: Path, wheels: dict[str, Path], part: str
) -> None:
    """What `pip install -c constraints.txt steplens-<part>` installs: the schema, neither the
    producer nor the stack, and only versions the constraints pin."""
    report = tmp_path / "report.json"
    _pip(
        "install",
        "-q",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        "-c",
        str(ROOT / "constraints.txt"),
        str(wheels["schema"]),
        str(wheels[part]),
    )
    installs = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert {PARTS[part], "steplens-schema"} <= set(installs)
    assert not {"steplens-stack", "steplens-producer"} & set(installs)
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pinned[name.strip().lower().replace("_", "-")] = version.strip()
    unpinned = sorted(n for n in installs if n not in pinned and not n.startswith("steplens-"))
    assert unpinned == [], "add these to constraints.txt"
    assert all(installs[n] == pinned[n] for n in installs if n in pinned)


def test_the_command_table_matches_what_the_parts_register() -> None:
    """Each part registers its own modules' commands; the dispatcher knows their names and
    distributions (for the listing and the missing-part message), and no module of a part."""
    registered = {}
    for part, dist in PARTS.items():
        meta = tomllib.loads((ROOT / part / "pyproject.toml").read_text())["project"]
        for name, target in meta.get("entry-points", {}).get(GROUP, {}).items():
            assert target.startswith(f"steplens.{part}.") and target.endswith(":main"), target
            registered[name] = dist
        if part == "schema":
            assert meta["scripts"] == {"steplens": "steplens.schema.command:main"}
        else:
            assert "scripts" not in meta  # one `steplens` script, the schema's
    assert registered == {name: dist for name, (dist, _) in KNOWN.items()}
    source = Path(dispatcher.__file__).read_text()
    assert not [p for p in PARTS if p != "schema" and f"steplens.{p}." in source]
