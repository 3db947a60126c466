"""The shape of gateway/ (issue 27): rooms by domain, no import circles, execution behind a port, no hub.

The import graph is built from every import statement wherever it stands (a function-local or TYPE_CHECKING
import is a dependency like any other), with the rules of the reviewers' tool (../shared/tools/imports.py): a
module is a file, a package its __init__, and `from pkg import name` depends on pkg.name when that is a module.
A room is a subpackage of gateway/ (gateway.jobs, gateway.decisions, ...); each top-level module is one of its own.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[1] / "gateway"
MAX_TOP_FILES = 12  # app factory, settings, errors, logging, metrics and the few others the whole app shares
MAX_CIRCLE = 3  # inside one room, and only if it cannot be helped
EDGES = ("gateway.api", "gateway.console", "gateway.cli", "gateway.app", "gateway.bootstrap", "gateway.demo")
# (room, rooms it must never import): the lower rooms know nothing of the higher ones.
FORBIDDEN = [
    ("gateway.store", ("gateway.identity", "gateway.decisions", "gateway.access", "gateway.execution",
                       "gateway.jobs", "gateway.native")),
    ("gateway.identity", ("gateway.decisions", "gateway.access", "gateway.execution", "gateway.jobs",
                          "gateway.native")),
    ("gateway.decisions", ("gateway.access", "gateway.jobs", "gateway.native")),
    ("gateway.access", ("gateway.jobs", "gateway.native")),
    ("gateway.execution", ("gateway.identity", "gateway.decisions", "gateway.access", "gateway.jobs",
                           "gateway.native")),
    ("gateway.jobs", ("gateway.native",)),  # whatever runs the jobs is reached through the execution port only
]


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        parts = list(path.relative_to(GATEWAY.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def resolve(mod: str) -> str | None:
        while mod and mod not in known:
            mod = mod.rpartition(".")[0]
        return mod or None

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {m for a in node.names if (m := resolve(a.name)) is not None}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                full = f"{mod}.{a.name}" if mod else a.name
                if (m := resolve(full) if full in known else resolve(mod)) is not None:
                    found.add(m)
    found.discard(name)
    return {m for m in found if not name.startswith(m + ".")}  # a package's own __init__ is no circle


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), largest first."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out, key=len, reverse=True)


def room(module: str) -> str:
    return ".".join(module.split(".")[:2])


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def test_few_files_at_the_top_of_gateway() -> None:
    top = sorted(p.name for p in GATEWAY.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_FILES, top


def test_no_module_circle_spans_rooms_and_none_inside_one_is_larger_than_three(graph: dict[str, set[str]]) -> None:
    for circle in circles(graph):
        assert len({room(m) for m in circle}) == 1, f"a circle across rooms: {circle}"
        assert len(circle) <= MAX_CIRCLE, f"a circle of {len(circle)} modules: {circle}"


def test_the_rooms_import_one_another_without_a_cycle(graph: dict[str, set[str]]) -> None:
    rooms: dict[str, set[str]] = {}
    for m, deps in graph.items():
        rooms.setdefault(room(m), set()).update(room(d) for d in deps if room(d) != room(m))
    assert circles(rooms) == []


@pytest.mark.parametrize(("lower", "higher"), FORBIDDEN, ids=[r.split(".")[1] for r, _ in FORBIDDEN])
def test_a_lower_room_never_imports_a_higher_one(graph: dict[str, set[str]], lower: str,
                                                   higher: tuple[str, ...]) -> None:
    reaching = sorted(f"{m} -> {d}" for m, deps in graph.items() if room(m) == lower for d in deps
                      if room(d) in higher)
    assert reaching == []


def test_no_service_reaches_for_the_whole_gateway(graph: dict[str, set[str]]) -> None:
    """No hub: only the edges and the composition root import the composed Gateway (gateway/context.py); every
    service names what it uses in a Protocol of its own room."""
    reaching = sorted(m for m, deps in graph.items() if "gateway.context" in deps and room(m) not in EDGES)
    assert reaching == []
