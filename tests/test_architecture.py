"""The package lines of docs/architecture.md, checked on every import the code makes.

Every ``import`` and ``from ... import`` of the project's own packages (at module
level or inside a function, TYPE_CHECKING blocks included) is read with ``ast``:
the core imports no component, a component imports the core and nothing else
(evaluation may use them all), and no two modules import each other, directly
or around a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = "rankscope"
COMPONENTS = ("collector", "simulator", "analyzer", "dashboards", "events", "actions")
EVALUATION = "evaluation"
PACKAGES = (CORE, *COMPONENTS, EVALUATION)
#: What each package may import of the project (besides itself).
ALLOWED = {CORE: set(), **{c: {CORE} for c in COMPONENTS}, EVALUATION: {CORE, *COMPONENTS}}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The project modules a file imports (``a.b`` for ``from a.b import c``, and ``a.b.c``
    too when ``c`` is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in PACKAGES}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        graph[name] = {m for m in _imports(path) if m in files and m != name}
    return graph


GRAPH = _graph()


def test_the_graph_sees_the_code():
    assert len(GRAPH) > 60
    assert "analyzer.job_analyzer" in GRAPH and "rankscope.store.base" in GRAPH["rankscope.store.influx"]


@pytest.mark.parametrize("package", PACKAGES)
def test_arrows_point_one_way(package):
    bad = sorted(f"{src} -> {dst}" for src, dsts in GRAPH.items() if src.split(".")[0] == package
                 for dst in dsts if dst.split(".")[0] not in {package, *ALLOWED[package]})
    assert not bad, f"{package} may import only {sorted(ALLOWED[package]) or 'itself'}: " + "; ".join(bad)


def test_no_circles():
    """Tarjan's strongly connected components: every one must be a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_core_finds_commands_without_importing_them():
    """Commands come through entry points declared in pyproject.toml, one per component."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    commands = data["project"]["entry-points"]["rankscope.commands"]
    owners = {target.split(".")[0] for target in commands.values()}
    assert {"simulator", "analyzer", "dashboards", "collector", "evaluation", "events", "actions"} <= owners
    for target in commands.values():
        module, _, func = target.partition(":")
        assert func == "register" and (ROOT / Path(*module.split("."))).with_suffix(".py").exists(), target


def test_the_analyzer_runs_the_actor_without_importing_it():
    """What runs after a cycle (the actor) comes through the core's entry-point group
    ``rankscope.after_cycle``: no file of the analyzer names the actions component."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    hooks = data["project"]["entry-points"]["rankscope.after_cycle"]
    assert hooks == {"actions": "actions.service_hook:after_cycle"}
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "analyzer").rglob("*.py")
             if any(m == "actions" or m.startswith("actions.") for m in _imports(p))]
    assert not named, f"the analyzer imports the actor: {named}"


#: Inside the analyzer, the data's flow (read -> detect -> score -> diagnosis -> write, with
#: service/ running the cycle): what each hop may import of the others (docs/architecture.md).
ANALYZER_ALLOWED = {
    "read": set(),
    "detect": {"config"},
    "score": {"config", "detect"},
    "diagnosis": {"config", "detect", "score"},
    "job_analyzer": {"config", "detect", "score", "diagnosis"},
    "write": {"read"},
    "config": {"config_schema"},
    "config_schema": set(),
    "service": {"config", "config_schema", "read", "detect", "score", "diagnosis", "job_analyzer",
                "write"},
    "__init__": set(),
}


def _hop(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_analyzer_hops_point_downstream():
    hops = {_hop(m) for m in GRAPH if m.startswith("analyzer.")}
    assert {"read", "detect", "score", "diagnosis", "write", "service"} <= hops
    assert hops <= set(ANALYZER_ALLOWED), f"a new hop needs its arrows: {hops - set(ANALYZER_ALLOWED)}"
    bad = sorted(f"{src} -> {dst}" for src, dsts in GRAPH.items() if src.startswith("analyzer.")
                 for dst in dsts if dst.startswith("analyzer.") and _hop(dst) != _hop(src)
                 and _hop(dst) not in ANALYZER_ALLOWED[_hop(src)])
    assert not bad, "the analyzer's hops import only upstream of the data: " + "; ".join(bad)
