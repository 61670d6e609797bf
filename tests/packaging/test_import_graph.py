"""The modules' import graph, read from the source (every import, those for type hints
included): no cycle across the five distributions, and the stream jobs' longest chain of
their own modules stays short (a record's way through them is readable)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("schema", "producer", "stream_jobs", "sinks", "stack")
STREAM_JOBS = "steplens.stream_jobs"
MAX_CHAIN = 8  # files


def modules() -> dict[str, Path]:
    out = {}
    for dist in DISTRIBUTIONS:
        base = ROOT / dist / "src"
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path], node: ast.AST) -> list[str]:
    """The known modules one import statement of module ``name`` loads: a submodule named
    by ``from package import submodule``, else the module it names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, node.module] if node.module else package)
    else:
        base = node.module or ""
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return subs + ([base] if len(subs) < len(node.names) and base in known else [])


@cache
def graph() -> dict[str, set[str]]:
    known = modules()
    out: dict[str, set[str]] = {}
    for name, path in known.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            deps.update(imported(name, path, known, node))
        out[name] = deps - {name}
    return out


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(g[v]):
            if state.get(w) == 1:
                return [*path[path.index(w) :], w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(g):
        if v not in state and (found := visit(v)):
            return found
    return None


def longest_chain(g: dict[str, set[str]], within: str) -> list[str]:
    @cache
    def chain(v: str) -> tuple[str, ...]:
        below = [chain(w) for w in g[v] if w.startswith(within)]
        return (v, *max(below, key=len, default=()))

    return list(max((chain(v) for v in g if v.startswith(within)), key=len))


def test_no_module_imports_itself_through_others() -> None:
    g = graph()
    assert len(g) > 200  # the tree was read
    assert cycle(g) is None, " -> ".join(cycle(g) or [])


def test_the_stream_jobs_longest_import_chain_is_short() -> None:
    chain = longest_chain(graph(), STREAM_JOBS)
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert longest_chain({"x.a": {"x.b"}, "x.b": {"y"}, "y": set()}, "x") == ["x.a", "x.b"]
