"""The stream jobs' modules import one another in one direction: no import cycle (imports for
type hints and imports inside functions count), and no chain of imports longer than
``MAX_CHAIN`` files, so a module's place in the layers stays easy to see."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import steplens.stream_jobs

PACKAGE = "steplens.stream_jobs"
ROOT = Path(steplens.stream_jobs.__file__).parent
MAX_CHAIN = 8


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((PACKAGE, *parts))] = path
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from a import b`` is ``a.b`` when that
    is a module, else ``a``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in mods:
                        deps.add(full)
                    elif base in mods:
                        deps.add(base)
        deps.discard(name)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules on it, or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state and (found := walk(d)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := walk(m)):
            return found
    return None


def _longest(graph: dict[str, set[str]]) -> list[str]:
    @functools.cache
    def chain(m: str) -> tuple[str, ...]:
        return (m, *max((chain(d) for d in graph[m]), key=len, default=()))

    return list(max((chain(m) for m in graph), key=len))


def test_no_module_imports_itself_through_others() -> None:
    assert _cycle(_graph()) is None


def test_the_longest_import_chain_is_short() -> None:
    graph = _graph()
    assert not _cycle(graph)
    chain = _longest(graph)
    assert len(chain) <= MAX_CHAIN, " -> ".join(m.removeprefix(PACKAGE + ".") for m in chain)


def test_the_checks_see_a_cycle_and_a_long_chain() -> None:
    """The checks themselves: a cycle is found, and a chain is measured in files."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _longest({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == ["a", "b", "c"]
    graph = _graph()  # read from the sources: the rules' stage imports the rules
    assert f"{PACKAGE}.engine.rules" in graph[f"{PACKAGE}.engine.batch_rules"]
